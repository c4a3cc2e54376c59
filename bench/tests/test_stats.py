"""The statistics on known data: quantiles, the bootstrap interval of the median against its exact
distribution, per-repeat ratios, the A/A comparison and the rotation of configurations."""

import itertools
import math
import statistics

import pytest

from bench import stats


def test_quantile_interpolates_between_order_statistics():
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert stats.quantile(values, 0.0) == 10.0 and stats.quantile(values, 1.0) == 50.0
    assert stats.quantile(values, 0.5) == 30.0
    assert stats.quantile(values, 0.1) == pytest.approx(14.0)  # position 0.4
    assert stats.quantile(values, 0.975) == pytest.approx(49.0)  # position 3.9
    assert stats.quantile([7.0], 0.3) == 7.0


def exact_bootstrap_median_distribution(values):
    """{median of a resample: probability}, enumerating every multiset of len(values) draws."""
    n = len(values)
    distribution = {}
    for counts in compositions(n, n):
        probability = math.factorial(n) / math.prod(math.factorial(c) for c in counts) / n**n
        sample = [v for v, c in zip(values, counts) for _ in range(c)]
        median = statistics.median(sample)
        distribution[median] = distribution.get(median, 0.0) + probability
    return distribution


def compositions(total, parts):
    """Every tuple of ``parts`` non-negative integers summing to ``total``."""
    for bars in itertools.combinations(range(total + parts - 1), parts - 1):
        edges = (-1,) + bars + (total + parts - 1,)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(parts))


def exact_quantile(distribution, fraction):
    """The smallest value whose cumulative probability reaches ``fraction``."""
    cumulative = 0.0
    for value in sorted(distribution):
        cumulative += distribution[value]
        if cumulative >= fraction - 1e-12:
            return value
    return max(distribution)


# Eight per-repeat ratios, all different, as a run of eight repeats gives.
RATIOS = [0.91, 0.95, 0.97, 0.98, 1.00, 1.01, 1.04, 1.10]


def cumulative(distribution, value):
    return sum(p for v, p in distribution.items() if v <= value)


def test_bootstrap_interval_matches_the_exact_distribution_of_the_resampled_median():
    exact = exact_bootstrap_median_distribution(RATIOS)
    assert sum(exact.values()) == pytest.approx(1.0)
    low_exact, high_exact = exact_quantile(exact, 0.025), exact_quantile(exact, 0.975)
    # The exact 2.5% and 97.5% points are clear of the neighbouring jumps of the distribution
    # (4000 resamples cannot move them), and a 90% interval would end elsewhere.
    below_low = max(v for v in exact if v < low_exact)
    below_high = max(v for v in exact if v < high_exact)
    assert cumulative(exact, below_low) < 0.02 and cumulative(exact, low_exact) > 0.03
    assert cumulative(exact, below_high) < 0.97 and cumulative(exact, high_exact) > 0.98
    assert exact_quantile(exact, 0.05) != low_exact and exact_quantile(exact, 0.95) != high_exact
    assert stats.bootstrap_median_interval(RATIOS) == (low_exact, high_exact) == (0.95, 1.04)


def test_bootstrap_of_two_values_gives_the_whole_range():
    # Resampled medians are 1, 1.5 or 2; P(median = 1) = P(at most 3 of 8 draws are 2) = 0.36.
    assert stats.bootstrap_median_interval([1, 1, 1, 1, 2, 2, 2, 2]) == (1, 2)


def test_bootstrap_ignores_one_outlier_in_eight():
    # The median moves only if 4 of 8 draws hit the outlier: probability 1.1% < 2.5%.
    # (An interval of the mean, or a 98% one, would reach up towards 100.)
    assert stats.bootstrap_median_interval([1.0] * 7 + [100.0]) == (1.0, 1.0)


def test_bootstrap_is_seeded_and_narrows_with_the_confidence():
    assert stats.bootstrap_median_interval(RATIOS) == stats.bootstrap_median_interval(RATIOS)
    wide = stats.bootstrap_median_interval(RATIOS, confidence=0.95)
    narrow = stats.bootstrap_median_interval(RATIOS, confidence=0.5)
    assert wide[0] < narrow[0] <= statistics.median(RATIOS) <= narrow[1] < wide[1]
    assert stats.bootstrap_median_interval([3.0] * 8) == (3.0, 3.0)
    with pytest.raises(ValueError):
        stats.bootstrap_median_interval([])


def test_ratios_pair_the_same_repeats():
    assert stats.ratios([2.0, 3.0], [1.0, 4.0]) == [2.0, 0.75]
    with pytest.raises(ValueError):
        stats.ratios([1.0], [1.0, 2.0])


def test_summarise_ratios_is_the_median_of_per_repeat_ratios():
    summary = stats.summarise_ratios("time_ratio", RATIOS)
    assert summary["time_ratio"] == pytest.approx((0.98 + 1.00) / 2)
    assert summary["time_ratio_min"] == 0.91 and summary["time_ratio_max"] == 1.10
    assert summary["time_ratio_ci95"] == list(stats.bootstrap_median_interval(RATIOS))


@pytest.mark.parametrize(
    "interval, verdict",
    [
        ([0.95, 0.985], "lower"),
        ([1.015, 1.03], "higher"),
        ([0.95, 0.99], "within A/A"),  # touches the A/A interval's lower end
        ([0.995, 1.005], "within A/A"),
        ([0.97, 1.03], "within A/A"),  # wider than A/A, around it
    ],
)
def test_a_difference_is_claimed_only_outside_the_aa_interval(interval, verdict):
    assert stats.compare_with_aa(interval, [0.99, 1.01]) == verdict


def test_no_aa_no_verdict():
    assert stats.compare_with_aa([0.5, 0.6], None) is None


def test_rotation_puts_every_configuration_in_every_position():
    configs = ["native", "native-aa", "expandable", "streampool"]
    orders = [stats.rotated(configs, r) for r in range(8)]
    assert orders[0] == configs
    assert orders[1] == ["native-aa", "expandable", "streampool", "native"]
    assert orders[4] == configs
    for position in range(len(configs)):
        assert sorted(order[position] for order in orders) == sorted(configs * 2)
    assert stats.rotated([], 3) == []

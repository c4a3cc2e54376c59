"""The statistics: paired ratios, the bootstrap interval's coverage on synthetic drift (true
ratio 1.00: 93-97% of 1,000 runs), its power against a real difference, and what a precision
needs."""

import math

import numpy
import pytest

from bench import plan, stats


def test_median_and_paired_ratios():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0 and stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert stats.paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [0.0])


def test_no_interval_below_the_method_pairs():
    assert stats.median_interval([1.0] * (stats.MIN_PAIRS - 1)) is None
    summary = stats.summarise([1.01, 0.99, 1.0])
    assert summary["ci95"] is None and summary["n"] == 3 and summary["ratio"] == 1.0
    assert stats.summarise([])["ratio"] is None


def test_the_interval_is_deterministic_and_contains_the_median():
    ratios = list(numpy.random.default_rng(3).lognormal(0.0, 0.05, size=25))
    low, high = stats.median_interval(ratios)
    assert (low, high) == stats.median_interval(ratios)
    assert low < stats.median(ratios) < high


def synthetic_blocks(rng, pairs, true_ratio, drift_sd, noise_sd, spikes):
    """Block times of a run in ABBA order: a slow random-walk drift on the log scale (the host
    drifts over seconds), per-block noise and occasional one-sided spikes; the config's blocks
    are ``true_ratio`` times the reference's."""
    blocks = 2 * pairs
    log_time = numpy.cumsum(rng.normal(0.0, drift_sd, blocks)) + rng.normal(0.0, noise_sd, blocks)
    if spikes:
        log_time += (rng.random(blocks) < 0.1) * rng.exponential(0.3, blocks)
    assert [first for _, _, first in plan.round_order([("n", "x")], 1)] == [False]
    first, second = log_time[0::2], log_time[1::2]
    ref_first_mask = numpy.arange(pairs) % 2 == 0  # round r: reference first when r is even
    ref = numpy.where(ref_first_mask, first, second)
    config = numpy.where(ref_first_mask, second, first) + math.log(true_ratio)
    return numpy.exp(config), numpy.exp(ref)


@pytest.mark.parametrize(
    "pairs, drift_sd, noise_sd, spikes",
    [(12, 0.02, 0.05, False), (30, 0.05, 0.03, True)],
)
def test_the_95_interval_covers_a_true_ratio_of_one_in_93_to_97_percent(
    pairs, drift_sd, noise_sd, spikes
):
    rng = numpy.random.default_rng(pairs)
    runs = 1000
    blocks = [synthetic_blocks(rng, pairs, 1.0, drift_sd, noise_sd, spikes) for _ in range(runs)]
    logs = numpy.log(numpy.array([config / ref for config, ref in blocks]))
    intervals = stats.log_intervals(logs, 1000, rng)  # the interval median_interval computes
    covered = numpy.mean((intervals[:, 0] <= 0.0) & (0.0 <= intervals[:, 1]))
    assert 0.93 <= covered <= 0.97


def test_pairing_cancels_drift_that_unpaired_samples_would_not():
    rng = numpy.random.default_rng(8)
    config, ref = synthetic_blocks(rng, 30, 1.0, 0.08, 0.01, False)
    paired = stats.summarise(list(config / ref))
    unpaired = stats.summarise(list(config / numpy.roll(ref, 7)))
    assert paired["log_sd"] < unpaired["log_sd"] / 3


def test_a_real_five_percent_difference_is_found_with_enough_pairs():
    rng = numpy.random.default_rng(11)
    config, ref = synthetic_blocks(rng, 40, 1.05, 0.02, 0.03, False)
    low, high = stats.median_interval(list(config / ref))
    assert 1.0 < low < 1.05 < high < 1.1


def test_pairs_needed_follows_the_median_standard_error():
    # sd 5.5% (the A/A on GPT-2 measured before) for +-3%: (1.96 * 1.2533 * 0.055 / 0.02956)^2
    assert stats.pairs_needed(0.055, 0.03) == math.ceil(
        (stats.Z_95 * math.sqrt(math.pi / 2) * 0.055 / math.log(1.03)) ** 2
    )
    assert stats.pairs_needed(0.055, 0.03) == 21
    assert stats.pairs_needed(0.001, 0.05) == stats.MIN_PAIRS
    with pytest.raises(ValueError):
        stats.pairs_needed(0.05, 0.0)


def test_pairs_needed_gives_about_the_half_width_asked():
    rng = numpy.random.default_rng(5)
    sd = 0.06
    n = stats.pairs_needed(sd, 0.03)
    widths = []
    for _ in range(200):
        ratios = list(numpy.exp(rng.normal(0.0, sd, n)))
        low, high = stats.median_interval(ratios, resamples=1000)
        widths.append((high - low) / 2)
    assert 0.024 < numpy.median(widths) < 0.036


def biased_processes(rng, processes, pairs, between_sd, within_sd):
    """Log ratios of an A/A (true ratio 1.00) from ``processes`` worker processes, each with a
    shift of its own for its whole life (sd ``between_sd``) and noise per pair."""
    shifts = rng.normal(0.0, between_sd, processes)
    return [list(shift + rng.normal(0.0, within_sd, pairs)) for shift in shifts]


def test_a_per_process_bias_widens_the_interval_instead_of_moving_it():
    # Three processes, 6% apart at most, 1% noise inside each: pooled as one process, the
    # 24 pairs look precise and exclude 1.00; by process they say the truth is not known better.
    rng = numpy.random.default_rng(4)
    groups = [list(shift + rng.normal(0.0, 0.01, 8)) for shift in (0.06, -0.01, -0.04)]
    ratios = [math.exp(v) for g in groups for v in g]
    labels = [k for k, g in enumerate(groups) for _ in g]
    summary = stats.summarise(ratios, labels)
    low, high = summary["ci95"]
    assert low < 0.96 and high > 1.06 and summary["processes"] == 3
    assert 0.04 < summary["between_sd"] < 0.07 and summary["within_sd"] < 0.015
    assert [round(r, 2) for r in summary["process_ratios"]] == [1.06, 0.99, 0.96]
    one = stats.summarise(ratios)  # the same pairs as one process
    assert one["processes"] == 1 and one["between_sd"] is None
    assert one["ci95"][1] - one["ci95"][0] < (high - low) / 3


def coverage(groups_of_runs, clustered=True):
    covered, widths = 0, []
    for seed, groups in enumerate(groups_of_runs):
        groups = groups if clustered else [[v for g in groups for v in g]]
        low, high = stats.hierarchical_interval(groups, resamples=1000, seed=seed)
        covered += low <= 1.0 <= high
        widths.append(high - low)
    return covered / len(groups_of_runs), float(numpy.median(widths))


def test_the_interval_covers_a_true_ratio_of_one_despite_process_biases():
    # 4 processes x 8 pairs, process sd 4%, pair sd 6%: by process 0.92-0.94 over 200 runs;
    # pooled as one process (the one-process bootstrap) 0.71-0.80.
    rng = numpy.random.default_rng(21)
    runs = [biased_processes(rng, 4, 8, 0.04, 0.06) for _ in range(200)]
    covered, _ = coverage(runs)
    assert 0.90 <= covered <= 0.99


def test_without_process_biases_the_interval_is_about_as_narrow_as_over_pairs():
    rng = numpy.random.default_rng(22)
    runs = [biased_processes(rng, 4, 8, 0.0, 0.06) for _ in range(200)]
    covered, width = coverage(runs)
    _, pooled_width = coverage(runs, clustered=False)
    assert 0.93 <= covered <= 0.995 and width < 1.25 * pooled_width


def test_one_process_is_the_bootstrap_over_pairs_and_labels_must_match():
    ratios = list(numpy.random.default_rng(3).lognormal(0.0, 0.05, size=25))
    assert stats.summarise(ratios, [7] * 25)["ci95"] == list(stats.median_interval(ratios))
    with pytest.raises(ValueError):
        stats.summarise(ratios, [0, 1])
    assert stats.t_975(2) == 4.303 and stats.t_975(25) == 2.086 and stats.t_975(99) == stats.Z_95

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

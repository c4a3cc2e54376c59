"""The calibration's plan: the A/A interval it predicts is the one stats.py gives, the pairs it
asks for reach the band, and from measured spreads it chooses more process sets when processes
differ, the cheapest settings when every band can be met, and says so when none fits the call
(made-up records in the calibration's raw format)."""

import math

import numpy
import pytest

from bench import calibrate, stats


def simulated_half_width(within_sd, between_sd, processes, pairs, runs=150, seed=3):
    rng = numpy.random.default_rng(seed)
    widths = []
    for run in range(runs):
        shifts = rng.normal(0, between_sd, processes)
        groups = [list(s + rng.normal(0, within_sd, pairs)) for s in shifts]
        low, high = stats.hierarchical_interval(groups, resamples=1000, seed=run)
        widths.append((high - low) / 2)
    return float(numpy.mean(widths))


@pytest.mark.parametrize("between_sd", [0.0, 0.02])
def test_the_predicted_interval_is_about_the_one_the_statistics_give(between_sd):
    predicted = calibrate.predicted_half_width(0.06, between_sd, 4, 8)
    assert simulated_half_width(0.06, between_sd, 4, 8) == pytest.approx(predicted, rel=0.3)


def test_the_pairs_asked_for_are_the_fewest_that_reach_the_band():
    pairs = calibrate.pairs_for(0.10, 0.005, 4, 0.03)
    assert calibrate.predicted_half_width(0.10, 0.005, 4, pairs) <= 0.03
    assert calibrate.predicted_half_width(0.10, 0.005, 4, pairs - 1) > 0.03
    assert calibrate.pairs_for(0.10, 0.03, 3, 0.03) is None  # processes alone differ more
    assert calibrate.pairs_for(0.001, 0.0, 3, 0.05) == calibrate.MIN_PAIRS_PER_SET


def raw_calibration(spreads, sets=4, pairs=20, seed=1):
    """Records of ``sets`` process sets: {workload: (within sd, between sd)} at two block
    lengths (a pair 0.5 s / 1.0 s, within sd 1.4x smaller at the longer), a memory pass 2 s, a
    start 10 s."""
    rng = numpy.random.default_rng(seed)
    records = []
    shifts = {w: rng.normal(0, between, sets) for w, (_, between) in spreads.items()}
    for index in range(sets):
        for workload, (within, _) in spreads.items():
            blocks = {}
            for block, scale, pair_s in (("0.2", 1.0, 0.5), ("0.4", 1 / math.sqrt(2), 1.0)):
                logs = shifts[workload][index] + rng.normal(0, within * scale, pairs)
                blocks[block] = {
                    "steps_per_block": 4, "wall_s": pairs * pair_s + 1.0, "warm_up_s": 1.0,
                    "pairs": [{"config_s": float(math.exp(v)), "ref_s": 1.0} for v in logs]}
            records.append({"workload": workload, "process_set": index, "off": [],
                            "prepare": {"native": {"wall_s": 2.0}, "native-aa": {"wall_s": 2.0}},
                            "failed": {}, "blocks": blocks})
    return {"workloads": list(spreads), "records": records,
            "sets": [{"off": [], "start_s": 10.0} for _ in range(sets)]}


def test_the_measured_spreads_are_read_back_by_process_set():
    measured = calibrate.analyse(raw_calibration({"gpt2": (0.05, 0.0)}, sets=6, pairs=40))
    gpt2 = measured["workloads"]["gpt2"]
    assert gpt2["blocks"]["0.2"]["within_sd"] == pytest.approx(0.05, rel=0.2)
    assert gpt2["blocks"]["0.2"]["pair_s"] == pytest.approx(0.5)
    assert gpt2["blocks"]["0.2"]["warm_up_s"] == pytest.approx(0.5)  # a worker's: two warm up
    assert gpt2["prepare_s"] == 2.0 and measured["start_s"] == 10.0
    assert gpt2["between_sd"] < 0.01
    wide = calibrate.analyse(raw_calibration({"gpt2": (0.01, 0.05)}, sets=6, pairs=40))
    assert wide["workloads"]["gpt2"]["between_sd"] == pytest.approx(0.05, rel=0.5)


def test_quiet_processes_get_the_cheapest_settings_that_meet_the_bands():
    chosen = calibrate.choose(raw_calibration({"gpt2": (0.04, 0.0), "churn": (0.10, 0.0)}),
                              "models", 6, 450.0)
    assert chosen["meets_bands"] is True and chosen["estimated_s"] <= 450.0
    for workload, entry in chosen["workloads"].items():
        assert entry["predicted_half_width"] <= entry["band"], workload
        assert entry["processes"] == calibrate.MIN_PROCESSES  # each set costs a start
    # what was measured at both block lengths goes into the file with the choice
    assert set(chosen["workloads"]["gpt2"]["measured"]["pair_s"]) == {"0.2", "0.4"}


def test_processes_that_differ_get_more_process_sets():
    spreads = {"gpt2": (0.03, 0.015)}
    chosen = calibrate.choose(raw_calibration(spreads, sets=8, pairs=30, seed=5), "models", 6,
                              900.0)
    entry = chosen["workloads"]["gpt2"]
    assert chosen["meets_bands"] is True and entry["processes"] > calibrate.MIN_PROCESSES
    assert entry["predicted_half_width"] <= 0.03


def test_a_call_too_short_for_the_bands_gets_the_closest_plan_that_fits_and_says_so():
    chosen = calibrate.choose(raw_calibration({"gpt2": (0.20, 0.0)}), "models", 6, 120.0)
    assert chosen["meets_bands"] is False and chosen["scale"] > 1
    assert chosen["estimated_s"] <= 120.0
    assert chosen["workloads"]["gpt2"]["predicted_half_width"] > 0.03

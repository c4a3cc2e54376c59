"""From children's records to latest.json: per-repeat ratios on both clocks, intervals, memory,
the A/A comparison, failures, and the fields issue 15 promises."""

import json
import statistics

import pytest

from bench import report, stats
from bench.tests import fakes
from bench.tests.fakes import child, record


def test_time_ratios_are_per_repeat_then_median_with_interval():
    runs = fakes.eight_repeats()
    cell = report.aggregate_cell(runs, "streampool", "gpt2")
    per_repeat = [0.95 + 0.01 * (r % 4) for r in range(8)]  # native drifts 40..47: no effect
    assert cell["time_ratio"] == pytest.approx(statistics.median(per_repeat))
    assert cell["time_ratio_ci95"] == pytest.approx(
        list(stats.bootstrap_median_interval(per_repeat))
    )
    assert (cell["time_ratio_min"], cell["time_ratio_max"]) == pytest.approx((0.95, 0.98))
    assert cell["repeats_measured"] == 8


def test_gpu_time_has_its_own_ratio():
    cell = report.aggregate_cell(fakes.eight_repeats(), "streampool", "gpt2")
    assert cell["gpu_time_ratio"] == 1.0 and cell["gpu_time_ratio_ci95"] == [1.0, 1.0]
    assert cell["gpu_time_per_unit_s"] == pytest.approx(3.0)  # 30 s over 10 units
    assert cell["host_time_per_unit_s"] == pytest.approx(
        statistics.median([(40.0 + r) * (0.95 + 0.01 * (r % 4)) / 10 for r in range(8)])
    )
    assert cell["unit"] == "step"


def test_memory_ratio_uses_natives_live_peak_of_the_same_repeat():
    runs = fakes.eight_repeats()
    runs[3]["native"]["workloads"]["gpt2"]["peak_live_bytes"] = 2000  # one repeat's native differs
    cell = report.aggregate_cell(runs, "streampool", "gpt2")
    per_repeat = [(1100 + r) / (2000 if r == 3 else 1000) for r in range(8)]
    assert cell["peak_memory_ratio"] == pytest.approx(statistics.median(per_repeat))
    assert cell["peak_memory_ratio_min"] == pytest.approx(0.5515)
    assert cell["peak_memory_ratio_max"] == pytest.approx(1.107)
    assert cell["peak_live_bytes"] == 1000 and cell["peak_memory_lower_bound"] is False
    aa = report.aggregate_cell(runs, "native-aa", "gpt2")  # native's own live bytes, not its own
    assert aa["peak_memory_ratio"] == pytest.approx(1.25)


def test_no_memory_ratio_for_the_empty_loops():
    cell = report.aggregate_cell(fakes.eight_repeats(), "streampool", "empty_1KiB")
    assert cell["peak_memory_ratio"] is None and "peak_memory_lower_bound" not in cell
    assert cell["time_ratio"] == pytest.approx(0.9)


def test_memory_held_before_the_workload_makes_the_ratio_a_lower_bound():
    runs = [
        {
            "native": child({"gpt2": record(1.0, 1.0, 1200, 1000, held_bytes=30)}),
            "rmm-pool": child({"gpt2": record(1.0, 1.0, 10, held_bytes=40_000)}),
        }
    ]
    cell = report.aggregate_cell(runs, "rmm-pool", "gpt2")
    assert cell["peak_memory_ratio"] == pytest.approx(0.01) and cell["peak_memory_lower_bound"]
    just_under = [
        {
            "native": child({"gpt2": record(1.0, 1.0, 1200, 1000, held_bytes=0)}),
            "x": child({"gpt2": record(1.0, 1.0, 1000, held_bytes=50)}),
        }
    ]
    assert report.aggregate_cell(just_under, "x", "gpt2")["peak_memory_lower_bound"] is False


def test_failed_repeats_are_left_out_and_named():
    runs = fakes.eight_repeats()
    runs[1]["native"]["workloads"]["gpt2"] = {"error": "OutOfMemoryError"}
    runs[2]["streampool"]["workloads"]["gpt2"] = {"error": "RuntimeError: x"}
    cell = report.aggregate_cell(runs, "streampool", "gpt2")
    assert cell["repeats_measured"] == 6
    assert cell["repeat_errors"] == [
        "native failed in the same repeat: OutOfMemoryError",
        "RuntimeError: x",
    ]
    for run in runs:
        run["streampool"]["workloads"]["empty_1KiB"] = {"error": "RuntimeError: y"}
    assert report.aggregate_cell(runs, "streampool", "empty_1KiB") == {"error": "RuntimeError: y"}


def test_a_workload_a_configuration_does_not_run_has_no_cell():
    runs = fakes.eight_repeats()
    for run in runs:
        run["streampool-nocache"] = child({"churn": record(1.0)})
    assert report.aggregate_cell(runs, "streampool-nocache", "gpt2") is None
    table = report.aggregate(runs, fakes.CONFIGS + ["streampool-nocache"], ["gpt2"])
    assert "streampool-nocache" not in table["gpt2"]


def test_differences_are_claimed_against_the_aa_interval():
    table = report.aggregate(fakes.eight_repeats(), fakes.CONFIGS, ["gpt2", "empty_1KiB"])
    aa = table["gpt2"]["native-aa"]
    assert aa["time_ratio_ci95"][0] < 1.0 < aa["time_ratio_ci95"][1]
    assert table["gpt2"]["streampool"]["time_vs_aa"] == "lower"  # 0.95-0.98 below 0.99-1.01
    assert table["gpt2"]["streampool"]["gpu_time_vs_aa"] == "within A/A"
    assert table["gpt2"]["expandable"]["time_vs_aa"] == "within A/A"  # 0.99: inside A/A's
    assert table["empty_1KiB"]["expandable"]["time_vs_aa"] == "higher"  # 1.05
    assert "time_vs_aa" not in table["gpt2"]["native"] and "time_vs_aa" not in aa
    without_aa = report.aggregate(fakes.eight_repeats(), ["native", "streampool"], ["gpt2"])
    assert "time_vs_aa" not in without_aa["gpt2"]["streampool"]


def test_no_difference_is_claimed_from_fewer_than_three_repeats():
    for repeats in (1, 2):
        table = report.aggregate(fakes.eight_repeats()[:repeats], fakes.CONFIGS, ["empty_1KiB"])
        assert table["empty_1KiB"]["expandable"]["time_vs_aa"] == "too few repeats", repeats
    table = report.aggregate(fakes.eight_repeats()[:3], fakes.CONFIGS, ["empty_1KiB"])
    assert table["empty_1KiB"]["expandable"]["time_vs_aa"] != "too few repeats"


def test_the_report_has_the_fields_issue_15_promises():
    document = fakes.build()
    assert document["repeats"] == 8 and document["repeats_requested"] == 8
    assert document["aa_config"] == "native-aa" and "native-aa" in document["configs"]
    assert document["device"] == "NVIDIA H100 80GB HBM3" and document["streampool"] == "0.1.0"
    assert document["driver"] == "580.65.06" and document["command"].startswith("python3 -m bench")
    for workload in ("gpt2", "empty_1KiB"):
        for config in fakes.CONFIGS:
            cell = document["workloads"][workload][config]
            for key in (
                "time_ratio",
                "time_ratio_ci95",
                "gpu_time_ratio",
                "gpu_time_ratio_ci95",
                "peak_memory_ratio",
                "host_time_per_unit_s",
                "repeats_measured",
            ):
                assert key in cell, (workload, config, key)
            assert len(cell["time_ratio_ci95"]) == 2 and len(cell["gpu_time_ratio_ci95"]) == 2
    assert document["workloads"]["gpt2"]["native"]["time_ratio_ci95"] == [1.0, 1.0]
    assert len(document["raw"]) == 8 and document["config_orders"][0] == fakes.CONFIGS
    assert document["child_wall_s"]["native"] == 9.0
    assert {row["config"] for row in document["targets"]} == {"streampool"}
    json.dumps(document, allow_nan=False)


def test_run_facts_come_from_the_children():
    runs = [
        {
            "native": child({}, info={"device": "GPU Y", "torch": "t", "cuda": "c"}),
            "streampool": child({}, status="setup_error"),
        }
    ]
    facts = report.run_facts(runs)
    assert facts["device"] == "GPU Y" and facts["streampool"].startswith("unknown")

"""The report: pooling calls, memory against the same call's native, failures kept, targets by
the interval's upper end, the co-tenant, and the Markdown headline rendered from it."""

import copy
import re

import pytest

from bench import details, markdown, report, targets
from bench.tests import fakes

MEMORY = {"native": 18.0, "native-aa": 18.0, "expandable": 10.7, "torch-async": 11.1,
          "streampool": 10.5, "streampool-pool": 11.0, "streampool-vmm": 10.8}
RATIOS = {"native-aa": 1.0, "expandable": 0.99, "torch-async": 1.07, "streampool": 1.0,
          "streampool-pool": 1.02, "streampool-vmm": 1.06}


def models_call():
    gpt2 = fakes.workload("gpt2", {**RATIOS, "streampool-threshold-1GiB": 1.01,
                                   "streampool-vmm-threshold-1GiB": 1.04,
                                   "streampool-pool-threshold-1GiB": 1.09},
                          {**MEMORY, "streampool-threshold-1GiB": 10.0,
                           "streampool-vmm-threshold-1GiB": 10.1,
                           "streampool-pool-threshold-1GiB": 10.2})
    bert = fakes.workload(
        "bert", {k: v for k, v in RATIOS.items() if k != "streampool-vmm"}, MEMORY,
        failed={"streampool-vmm": "Traceback ...\nRuntimeError: CUDA error: out of memory"},
    )
    cotenant = [fakes.trial("native", 12.9),
                fakes.trial("native+empty_cache", 1.2, empty_cache=True),
                fakes.trial("expandable", 12.3), fakes.trial("torch-async", 12.8),
                fakes.trial("streampool", 0.4), fakes.trial("streampool-threshold-1GiB", 0.3),
                fakes.trial("streampool-pool", 0.6),
                fakes.trial("streampool-vmm", 0.2, error="exited with status 1:\nboom")]
    return fakes.call([gpt2, bert], cotenant=cotenant)


@pytest.fixture(scope="module")
def built():
    return report.build([models_call()])


def test_time_cells_are_paired_ratios_with_an_interval_and_n(built):
    gpt2 = built["workloads"]["gpt2"]
    time = gpt2["torch-async"]["time"]
    assert time["n"] == 20 and time["ref"] == "native"
    assert time["ci95"][0] < 1.07 < time["ci95"][1] < 1.08
    assert "time" not in gpt2["native"] and gpt2["native"]["per_unit_s"] > 0
    assert gpt2["streampool-threshold-1GiB"]["time"]["ref"] == "streampool"
    assert built["price"]["ratio"] == pytest.approx(1.01, abs=0.01)
    assert gpt2["streampool-vmm-threshold-1GiB"]["time"]["ref"] == "streampool-vmm"
    assert built["price_vmm"]["ratio"] == pytest.approx(1.04, abs=0.01)
    assert gpt2["streampool-pool-threshold-1GiB"]["time"]["ref"] == "streampool-pool"
    assert built["price_pool"]["ratio"] == pytest.approx(1.09, abs=0.01)
    notes = " ".join(markdown.headline_notes(built))
    assert "Its price, GPT-2" in notes and "Its price on vmm, GPT-2" in notes
    assert "Its price on pool, GPT-2 training time with the threshold ÷ without (paired): 1.09" \
        in notes
    assert built["aa"]["gpt2"]["ratio"] == pytest.approx(1.0, abs=0.01)
    assert "‡" not in notes


def test_a_price_whose_reference_idled_past_the_idle_release_is_marked(built):
    # The 2026-12-01 run's price on vmm: its reference, carried into a second stage, idled
    # 3.4-5.5 s while the threshold warmed up, gave its memory back and mapped it again.
    idled = copy.deepcopy(built)
    idled["workloads"]["gpt2"]["streampool"]["gap_over_idle_release"] = True
    notes = " ".join(markdown.headline_notes(idled))
    price = r"GPT-2 training time with the threshold ÷ without \(paired\): [0-9.]+ \([0-9.–]+\)"
    assert re.search(f"Its price, {price}‡\\.", notes)
    assert re.search(f"Its price on pool, {price}\\.", notes)  # its reference did not idle
    assert "‡ a worker idled longer than the idle-release delay" in notes


def test_memory_is_peak_device_over_native_peak_live_of_the_same_call(built):
    memory = built["workloads"]["gpt2"]["expandable"]["memory"]
    assert memory["ratio"] == pytest.approx(1.07) and memory["low"] == memory["high"]
    assert memory["sources"] == ["mem_get_info"]


def test_a_failure_is_a_cell_with_its_error(built):
    cell = built["workloads"]["bert"]["streampool-vmm"]
    assert cell["failed"] and cell["errors"][0].endswith("CUDA error: out of memory")
    assert "memory" not in cell and "time" not in cell


def test_calls_pool_their_pairs_and_keep_each_calls_memory():
    first = fakes.call([fakes.workload("gpt2", {"streampool": 1.0},
                                       {"native": 18, "streampool": 10}, n=6, seed=1)])
    second = fakes.call([fakes.workload("gpt2", {"streampool": 1.0},
                                        {"native": 18, "streampool": 11}, n=6, seed=2)])
    one = report.build([first])["workloads"]["gpt2"]["streampool"]
    assert one["time"]["n"] == 6 and one["time"]["ci95"] is None  # too few pairs: no interval
    both = report.build([first, second])["workloads"]["gpt2"]["streampool"]
    assert both["time"]["n"] == 12 and both["time"]["ci95"] is not None
    assert both["memory"]["low"] == pytest.approx(1.0)
    assert both["memory"]["high"] == pytest.approx(1.1)


def test_a_configuration_failing_in_one_call_keeps_the_others_pairs_and_the_error():
    good = fakes.workload("gpt2", {"streampool": 1.0}, {"native": 18, "streampool": 10}, n=12)
    bad = fakes.workload("gpt2", {}, {"native": 18}, failed={"streampool": "it broke"})
    cell = report.build([fakes.call([good]), fakes.call([bad])])["workloads"]["gpt2"]["streampool"]
    assert cell["time"]["n"] == 12 and cell["errors"] == ["it broke"] and not cell.get("failed")


def rows(built, metric, workload, config):
    return [r for r in built["targets"]
            if (r["metric"], r["workload"], r["config"]) == (metric, workload, config)]


def test_targets_are_judged_by_the_upper_end(built):
    (met,) = rows(built, "time", "gpt2", "streampool")
    assert met["status"] == "met" and met["interval"][1] <= 1.03
    (slow,) = rows(built, "time", "gpt2", "streampool-vmm")  # median 1.06
    assert slow["status"] == "not met"
    (failed,) = rows(built, "time", "bert", "streampool-vmm")
    assert failed["status"] == "failed" and "out of memory" in failed["error"]
    (memory,) = rows(built, "memory", "gpt2", "streampool-pool")  # 11.0/10 vs expandable 1.07
    assert memory["status"] == "not met" and memory["compared_with"] == pytest.approx(1.07)
    assert rows(built, "memory", "gpt2", "streampool")[0]["status"] == "met"
    (aa,) = rows(built, "aa", "gpt2", "native-aa")
    assert aa["status"] == "met"
    (cotenant,) = rows(built, "cotenant", "idle 3 s", "streampool")
    assert cotenant["status"] == "met" and cotenant["value"] == pytest.approx(0.4)
    assert rows(built, "price", "gpt2", "streampool-threshold-1GiB")[0]["status"] == "met"
    assert rows(built, "time", "resnet50", "streampool")[0]["status"] == "not measured"


def test_the_rule_is_the_upper_end_not_the_median():
    target = {"metric": "time", "at_most": 1.03}
    assert targets.verdict((0.90, 1.031), target) == "not met"  # median far below: not enough
    assert targets.verdict((1.00, 1.03), target) == "met"
    band = {"metric": "aa", "at_least": 0.97, "at_most": 1.03}
    assert targets.verdict((0.96, 1.01), band) == "not met"
    assert targets.verdict((0.5, 0.9), {"below_config": "native"}, 0.95) == "met"
    assert targets.verdict((0.5, 0.95), {"below_config": "native"}, 0.95) == "not met"


def test_every_target_in_the_file_can_be_judged(tmp_path):
    document = targets.load()
    assert all(t["metric"] in targets.METRICS for t in document["targets"])
    bad = tmp_path / "targets.json"
    bad.write_text('{"judged_configs": [], "targets": [{"metric": "time", "workloads": ["x"]}]}')
    with pytest.raises(ValueError, match="lacks a bound"):
        targets.load(bad)


def test_cotenant_cells(built):
    cells = built["cotenant"]
    assert cells["streampool"]["probes"][1]["held_gib_median"] == pytest.approx(0.4)
    assert cells["native+empty_cache"]["empty_cache_called"]
    assert "boom" in cells["streampool-vmm"]["error"]


def test_the_headline_shows_every_configuration_wins_losses_and_failures(built):
    text = "\n".join(markdown.headline(built))
    assert "NVIDIA H100 80GB HBM3, driver 580.65.06, torch 2.11.0+cu130" in text
    assert "`python3 -m bench --group models`" in text
    header = next(line for line in text.splitlines() if line.startswith("| workload"))
    assert header == ("| workload | A/A | native | expandable | torch-async | streampool | "
                      "streampool-pool | streampool-vmm |")
    gpt2 = next(line for line in text.splitlines() if line.startswith("| `gpt2`"))
    assert "(20 pairs)" in gpt2 and "1.80 · 1 |" in gpt2
    assert "✗" in gpt2 and "✓" in gpt2  # losses beside wins
    bert = next(line for line in text.splitlines() if line.startswith("| `bert`"))
    assert bert.rstrip(" |").endswith("**failed**")
    cotenant = next(line for line in text.splitlines() if line.startswith("| co-tenant"))
    assert "12.90 GiB" in cotenant and "0.40 GiB ✓" in cotenant and "**failed**" in cotenant
    assert cotenant.split(" | ")[-2:] == ["0.60 GiB", "**failed** |"]  # streampool-pool, -vmm
    assert "out of memory" in text and "boom" in text  # failures named on the screen
    assert "threshold ÷ without (paired): 1.02 (1.01–1.02)" in text


def test_the_full_report_renders_and_lists_failures_with_their_last_lines(built):
    text = details.render(built)
    assert text.startswith("# streampool benchmarks\n\n## Headline")
    assert "Traceback ...\n  RuntimeError: CUDA error: out of memory" in text
    assert "Not measured in these runs:" in text and "| time | `gpt2` | `streampool` |" in text


def test_clocks_throttling_and_nvml_memory_while_timed_are_reported():
    gpt2 = fakes.workload("gpt2", {"streampool": 1.0}, {"native": 18, "streampool": 10}, n=12)
    for index, pair in enumerate(gpt2["pairs"]):
        throttled = index == 3
        pair["gpu"] = [{"sm_mhz": 1980 - 10 * index, "power_w": 400.0 + index,
                        "throttled": throttled}, None]
        pair["throttled"] = throttled
    gpt2["process_peak_bytes"] = {"streampool": 13 * fakes.GIB}
    gpt2["baseline_process_bytes"] = {"streampool": fakes.GIB // 2}
    call = fakes.call([gpt2])
    built = report.build([call], merge_command="python3 -m bench merge a b --out-dir c")
    cell = built["workloads"]["gpt2"]["streampool"]
    assert cell["throttled_pairs"] == 1
    assert cell["process_bytes_during_timing"] == 13 * fakes.GIB - fakes.GIB // 2
    assert built["facts"]["gpu"] == [{"pairs": 12, "throttled_pairs": 1,
                                      "sm_mhz": [1870, 1980], "power_w_max": 411.0}]
    text = details.render(built)
    assert "SM clock 1870–1980 MHz, power up to 411.0 W, 1 of 12 pairs throttled" in text
    assert "12800 MiB while timed (NVML)" in text
    assert "† some pairs ran while the GPU reported" in text
    assert "- merged: `python3 -m bench merge a b --out-dir c`" in text


def test_each_record_is_a_process_and_the_aa_shows_the_spread_between_processes():
    # Three process sets of one run, native-aa 8% slow in the second: pooled as one process
    # the A/A would exclude 1.00; by process its interval is wide and the spread is shown.
    records = [fakes.workload("gpt2", {"native-aa": ratio}, {"native": 18, "native-aa": 18},
                              n=8, seed=seed)
               for seed, ratio in enumerate((1.0, 1.08, 0.99))]
    built = report.build([fakes.call(records)])
    aa = built["aa"]["gpt2"]
    assert aa["processes"] == 3 and aa["n"] == 24
    assert aa["ci95"][0] < 1.0 and aa["ci95"][1] > 1.08
    assert 0.03 < aa["between_sd"] < 0.06
    assert [round(r, 2) for r in aa["process_ratios"]] == [1.0, 1.08, 0.99]
    text = details.render(built)
    assert "| `gpt2` | 1.0" in text.split("## A/A and the spread between processes")[1]
    assert "n=24 in 3 processes" in text

"""The A/A diagnosis (noise.py) on made-up pairs whose between-process difference comes from one
known quantity; its place in report.md; ``python3 -m bench noise`` on a stand-in run and on
committed results recorded before the per-block fields existed."""

import gzip
import json
import math
from pathlib import Path

import numpy

from bench import cli, details, noise, report
from bench.tests import fakes
from bench.tests.test_cli import run_standin

ROOT = Path(__file__).resolve().parents[2]


def aa_pairs(shift, n, rng, source="gpu", without_fields=False):
    """A/A pairs of one process set whose native-aa is ``shift`` slower. ``source`` "gpu": its
    GPU time carries the shift and its thread's CPU time follows the wall time (a spinning
    synchronisation); "host": the GPU time never moves, and the shift is time the launching
    thread spent off the CPU. The SM clock never moves."""
    out = []
    for r in range(n):
        noise_ = float(rng.normal(0, 0.01))
        ref_s = 0.2
        config_s = ref_s * (1 + shift) * math.exp(noise_)
        pair = {"config": "native-aa", "ref": "native", "ref_first": r % 2 == 0,
                "config_s": config_s, "ref_s": ref_s, "units": 4}
        if not without_fields:
            on_cpu = float(rng.uniform(.9, 1))
            gpu = 0.15 * (1 + shift) * math.exp(noise_) if source == "gpu" else 0.15
            cpu = config_s * on_cpu if source == "gpu" else ref_s * on_cpu
            pair["config_block"] = {"gpu_s": gpu, "cpu_s": cpu, "cpu": 3, "nvcsw": 5,
                                    "nivcsw": int(rng.integers(0, 3)), "sm_mhz": 1980}
            pair["ref_block"] = {"gpu_s": 0.15, "cpu_s": ref_s * float(rng.uniform(.9, 1)),
                                 "cpu": 0, "nvcsw": 5, "nivcsw": int(rng.integers(0, 3)),
                                 "sm_mhz": 1980}
        out.append(pair)
    return out


def calls(shifts=(0.10, -0.05, 0.0, 0.04), n=8, **kw):
    rng = numpy.random.default_rng(3)
    records = []
    sets = []
    for index, shift in enumerate(shifts):
        record = fakes.workload("gpt2", {}, {"native": 12, "native-aa": 12})
        record["pairs"] = aa_pairs(shift, n, rng, **kw)
        record["process_set"] = index
        records.append(record)
        sets.append({"index": index, "cpus": {"native": f"{3 * index}-{3 * index + 2}",
                                              "native-aa": f"{3 * index + 3}-{3 * index + 5}"}})
    call = fakes.call(records)
    call["process_sets"] = sets
    return [call]


def test_the_quantity_that_carries_the_between_process_difference_is_named():
    (diagnosis,) = noise.diagnose_calls(calls()).values()
    assert [row["set"] for row in diagnosis["sets"]] == ["1", "2", "3", "4"]
    first = diagnosis["sets"][0]
    assert math.exp(first["aa"]) == math.exp(first["effects"]["gpu_s"]) != 1
    assert first["cpus"] == {"native": "0-2", "native-aa": "3-5"}
    assert first["ended_on"] == {"native": [0], "native-aa": [3]}
    assert diagnosis["correlations"]["gpu_s"]["sets"] > 0.99
    assert diagnosis["correlations"]["gpu_s"]["pairs"] > 0.99
    assert diagnosis["correlations"]["sm_mhz"] == {"sets": None, "pairs": None}  # never moved
    assert diagnosis["closest"]["sets"]["quantity"] == "gpu_s"
    assert diagnosis["closest"]["pairs"]["quantity"] == "gpu_s"
    assert diagnosis["pairs"] == 32 and diagnosis["pairs_without_fields"] == 0


def test_a_difference_made_off_the_cpu_is_put_there_not_on_the_gpu():
    (diagnosis,) = noise.diagnose_calls(calls(source="host")).values()
    assert diagnosis["correlations"]["gpu_s"] == {"sets": None, "pairs": None}  # never varied
    assert diagnosis["closest"]["sets"]["quantity"] == "off_cpu"
    assert diagnosis["correlations"]["off_cpu"]["sets"] > 0.95


def test_results_from_before_the_fields_give_no_diagnosis_and_are_counted():
    assert noise.diagnose_calls(calls(without_fields=True)) == {}
    old = calls()
    old[0]["workloads"][0]["pairs"] += aa_pairs(0.2, 3, numpy.random.default_rng(1),
                                                without_fields=True)
    (diagnosis,) = noise.diagnose_calls(old).values()
    assert diagnosis["pairs_without_fields"] == 3 and diagnosis["pairs"] == 32


def test_correlation_needs_three_points_that_vary():
    assert noise.correlation([1, 2], [1, 2]) is None
    assert noise.correlation([1, 1, 1], [1, 2, 3]) is None
    assert noise.correlation([1, 2, None, 3], [2, 4, 5, 6]) == 1.0
    assert noise.correlation([1, 2, 3], [3, 2, 1]) == -1.0


def test_report_md_has_the_section_only_where_the_blocks_recorded_the_fields():
    built = report.build(calls())
    text = details.render(built)
    assert "## Where the A/A difference comes from" in text
    assert "| `gpt2` | 1 (8 pairs) | 1.098 | 1.098 | 1.105 | -0.4 pt |" in text
    assert "0-2 (ended on 0) | 3-5 (ended on 3) |" in text
    assert "- `gpt2`: closest to the A/A across 4 process sets: GPU time (events) (r = +1.00)" \
        in text
    old = report.build(calls(without_fields=True))
    assert old["aa_noise"] == {} and "Where the A/A" not in details.render(old)


def test_the_noise_command_reads_a_run_and_says_when_results_predate_the_fields(tmp_path,
                                                                                capsys):
    assert run_standin(tmp_path, workloads="churn", pairs="4", processes="2") == 0
    capsys.readouterr()
    assert cli.main(["noise", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"## {tmp_path / 'results.json'}" in out
    assert "| `churn` | 1 (4 pairs) |" in out and "| `churn` | 2 (4 pairs) |" in out
    assert cli.main(["noise", str(ROOT / "bench" / "results" / "2026-11-26")]) == 0
    assert "No A/A pair here carries the per-block records" in capsys.readouterr().out
    # A run's results.json named as committed (compressed beside it), and where both are there,
    # the file as written.
    raw = tmp_path / "results.json"
    (tmp_path / "results.json.gz").write_bytes(gzip.compress(raw.read_bytes()))
    raw.rename(tmp_path / "moved.json")
    assert cli.main(["noise", str(raw)]) == 0
    assert f"## {tmp_path / 'results.json.gz'}" in capsys.readouterr().out
    (tmp_path / "moved.json").rename(raw)
    assert cli.main(["noise", str(raw), str(tmp_path)]) == 0
    assert capsys.readouterr().out.count(f"## {raw}\n") == 2
    calibration = {"groups": {"alloc": {"sets": [{"index": 0}], "records": [
        {"workload": "churn", "process_set": 0,
         "blocks": {"0.1": {"pairs": calls()[0]["workloads"][0]["pairs"]}}}]}}}
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "calibration.json").write_text(json.dumps(calibration))
    assert cli.main(["noise", str(tmp_path / "cal")]) == 0
    assert "(calibration, group alloc)" in capsys.readouterr().out

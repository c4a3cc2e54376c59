"""The sleep-and-wake benchmark's report (bench/sleep.py) from fabricated child records: given
back, GB/s against the link, the verdicts, the table and the summary lines; the parent's handling
of a child that fails, runs out of time or leaves no record; and real children on this machine
(no torch here), whose failure is recorded with its stage."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import sleep

GIB = 2**30
MIB = 2**20


def reading(process, device, reserved=None):
    return {"process_bytes": process, "device_used_bytes": device,
            "device_total_bytes": 140 * GIB, "reserved_bytes": reserved}


LINK = {"d2h_gbps": 50.0, "h2d_gbps": 55.0, "bytes": GIB}
LIVE = 6 * 10**9  # the payload: 6 GB, so that 1 s is 6 GB/s


def sleeper_record(config="streampool-vmm", **changes):
    record = {
        "config": config, "ok": True, "stage": "done", "error": None,
        "facts": {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0",
                  "model": "GPT-2 124M (GPT2LMHeadModel, eager attention)"},
        # The device figure is the process's plus 512 MiB of another process. The workload loads
        # 512 MiB of kernels and handles outside the allocator, which holds 20 GiB; 100 MiB of
        # it stays on the device during the sleep.
        "context": reading(512 * MIB, 1024 * MIB),
        "before": reading(21504 * MIB, 22016 * MIB, reserved=20 * GIB),
        "asleep": reading(1124 * MIB, 1636 * MIB),
        "woken": reading(21504 * MIB, 22016 * MIB),
        "link": dict(LINK),
        "live_bytes": LIVE,
        "buffer_bytes": 4 * GIB,
        "sleep_s": 0.125,  # 48 GB/s: 96% of 50
        "wake_s": 0.15,  # 40 GB/s: 72.7% of 55
        "bitwise_equal": True, "mismatches": [], "restore_equal": True, "addresses_kept": True,
        "reference_repeatable": True, "step_equal": True,
        "sleep_returned": 20 * GIB,
        "second_cycle": {"sleep_s": 0.1, "wake_s": 0.12, "sleep_returned": 19 * GIB,
                         "before": reading(21504 * MIB, 22016 * MIB, reserved=20 * GIB),
                         "asleep": reading(1024 * MIB, 1536 * MIB)},
    }
    record.update(changes)
    return record


def native_record():
    return {"config": "native", "ok": True, "stage": "done", "error": None,
            "facts": {"device": "NVIDIA H200"},
            "context": reading(GIB // 2, GIB), "before": reading(GIB // 2 + 25 * GIB, 26 * GIB),
            "link": dict(LINK), "live_bytes": LIVE, "buffer_bytes": 4 * GIB}


def test_given_back_is_what_left_over_what_the_workload_added():
    assert sleep.given_back_pct(21, 1.2, 1) == pytest.approx(99.0)
    assert sleep.given_back_pct(21, 1, 1) == 100.0
    assert sleep.given_back_pct(21, 21, 1) == 0.0
    assert sleep.given_back_pct(None, 1, 1) is None
    assert sleep.given_back_pct(1, 1, 1) is None  # nothing beyond the context: no figure


def test_allocator_given_back_is_the_drop_over_what_the_allocator_held():
    assert sleep.allocator_given_back_pct(21, 1.2, 20) == pytest.approx(99.0)
    assert sleep.allocator_given_back_pct(21, 1, 20) == 100.0
    assert sleep.allocator_given_back_pct(21, 21, 20) == 0.0
    assert sleep.allocator_given_back_pct(None, 1, 20) is None
    assert sleep.allocator_given_back_pct(21, 1, 0) is None  # the allocator held nothing
    assert sleep.allocator_given_back_pct(21, 1, None) is None


def test_memory_source_is_nvml_only_when_every_reading_has_the_process():
    record = sleeper_record()
    assert sleep.memory_source(record) == "nvml-process"
    record["asleep"]["process_bytes"] = None
    assert sleep.memory_source(record) == "device-used"
    assert sleep.memory_source({}) == "device-used"


def test_row_of_a_sleeper():
    row = sleep.row(sleeper_record())
    assert row["memory_source"] == "nvml-process"
    # Of what the allocator held (the target's figure), not of what the process added beyond
    # its context: the kernels the workload loaded are no allocator's to give back.
    assert row["given_back_pct"] == pytest.approx(100 * 20380 / 20480)
    assert row["beyond_context_given_back_pct"] == pytest.approx(100 * 20380 / 20992)
    assert row["outside_allocator_before_bytes"] == 1024 * MIB
    # What each sleep itself said it gave back (the idle release is off in the child).
    assert (row["sleep_returned_bytes"], row["second_sleep_returned_bytes"]) == (20 * GIB, 19 * GIB)
    assert row["sleep_gbps"] == pytest.approx(48.0)
    assert row["sleep_link_pct"] == pytest.approx(96.0)
    assert row["wake_gbps"] == pytest.approx(40.0)
    assert row["wake_link_pct"] == pytest.approx(100 * 40 / 55)
    assert row["targets"] == {"given_back": "met", "sleep_link": "met", "wake_link": "not met"}
    assert row["second_given_back_pct"] == pytest.approx(100.0)
    assert row["second_sleep_link_pct"] == pytest.approx(100 * 60 / 50)  # 6 GB in 0.1 s
    assert row["second_wake_link_pct"] == pytest.approx(100 * 50 / 55)  # 6 GB in 0.12 s
    assert row["bitwise_equal"] and row["step_equal"]


def test_row_falls_back_to_the_device_figures_for_every_reading():
    record = sleeper_record()
    record["context"]["process_bytes"] = None
    row = sleep.row(record)
    assert row["memory_source"] == "device-used"
    assert row["context_bytes"] == GIB and row["held_before_bytes"] == 22016 * MIB
    assert row["given_back_pct"] == pytest.approx(100 * 20380 / 20480)


def test_row_of_native_has_the_footprint_only():
    row = sleep.row(native_record())
    assert row["held_before_bytes"] == GIB // 2 + 25 * GIB
    assert "given_back_pct" not in row and "sleep_s" not in row


def test_row_of_a_child_that_stopped_part_way():
    record = {"config": "tms", "ok": False, "stage": "build", "error": "at stage build: boom",
              "context": reading(None, GIB), "link": dict(LINK)}
    row = sleep.row(record)
    assert row["given_back_pct"] is None and row["sleep_gbps"] is None
    assert row["targets"] == {"given_back": None, "sleep_link": None, "wake_link": None}
    assert not row["ok"] and row["stage"] == "build"


def test_exit_status_needs_every_child_to_have_run():
    assert sleep.exit_status({"a": {"ok": True}, "b": {"ok": True}}) == 0
    assert sleep.exit_status({"a": {"ok": True}, "b": {"ok": False}}) == 1
    assert sleep.exit_status({}) == 1


def fabricated_report():
    records = {
        "native": native_record(),
        "streampool-vmm": sleeper_record(),
        "streampool-vmm-reserved": sleeper_record(
            "streampool-vmm-reserved", sleep_s=0.15, reserve_s=0.4, reserved_bytes=6 * GIB),
        "tms": sleeper_record(
            "tms", asleep=reading(1536 * MIB, 2048 * MIB), sleep_s=0.5, wake_s=0.4,
            bitwise_equal=False, mismatches=["param:transformer.wte.weight"],
            reference_repeatable=False, step_equal=False),
        "tms-torch": {"config": "tms-torch", "ok": False, "stage": "allocator",
                      "error": "exit status 1\nat stage allocator: Traceback (most recent call "
                               "last):\n  File \"x.py\", line 1\nImportError: no tms"},
    }
    meta = {"command": "python3 -m bench.sleep --out-dir x", "date": "2026-12-01 10:00 UTC",
            "facts": sleep._facts(records)}
    return sleep.build_report(records, meta)


def table_rows(markdown, header_start):
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_markdown_tables_have_every_configuration_and_even_columns():
    text = sleep.render_markdown(fabricated_report())
    for header in ("| configuration | context GiB", "| configuration | memory source"):
        rows = table_rows(text, header)
        widths = {row.count("|") for row in rows}
        assert len(widths) == 1, rows
    main = table_rows(text, "| configuration | context GiB")
    assert len(main) == 2 + 5
    native, streampool, reserved, tms, failed = main[2:]
    assert reserved.startswith("| `streampool-vmm-reserved` |") and "| 0.150 |" in reserved
    assert "no sleep" in native and "25.50" in native
    assert "99.51% ✓" in streampool and "48.0 (96%) ✓" in streampool
    assert "40.0 (73%) ✗" in streampool and "| yes | yes |" in streampool
    assert "97.50% ✗" in tms and "| no | n/a (not repeatable) |" in tms
    assert "**failed** (allocator)" in failed
    assert "param:transformer.wte.weight" in text
    assert "ImportError: no tms" in text
    second = table_rows(text, "| configuration | memory source")[3]
    assert second == ("| `streampool-vmm` | nvml-process | 20.00 | 1.00 | 97.08% | 50.0 / 55.0 "
                      "| 0.100 / 0.120 | 100.00% | yes | yes | yes |")
    assert "NVIDIA H200" in text and "`python3 -m bench.sleep --out-dir x`" in text
    assert "97.7%" in text and "4.00 GiB inference buffer" in text


def test_summary_has_one_line_per_configuration():
    lines = sleep.summary_lines(fabricated_report())
    assert [line.split(":")[0] for line in lines] == [
        "native", "streampool-vmm", "streampool-vmm-reserved", "tms", "tms-torch"]
    assert lines[0] == "native: held 25.50 GiB (context 0.50 GiB), no sleep"
    assert lines[1] == (
        "streampool-vmm: held 21.00 -> 1.10 GiB, given back 99.51% of the allocator's 20.00 GiB "
        "(outside it 1.00 GiB), sleep 0.125 s, wake 0.150 s, "
        "48.0 / 40.0 GB/s (96% / 73% of link); second cycle sleep 0.100 s, wake 0.120 s "
        "(120% / 91% of link); bitwise equal yes, step equal yes")
    assert "sleep 0.150 s" in lines[2]
    assert "its buffer (6.00 GiB) reserved ahead in 0.400 s; second cycle" in lines[2]
    assert "bitwise equal no, step equal n/a (not repeatable)" in lines[3]
    assert "reserved ahead" not in lines[3]
    assert lines[4] == "tms-torch: FAILED at allocator: ImportError: no tms"


def test_report_is_strict_json_even_with_a_nan():
    report = fabricated_report()
    report["records"]["native"]["training_losses"] = [float("nan"), 1.5]
    text = json.dumps(sleep.finite(report), allow_nan=False)
    assert json.loads(text)["records"]["native"]["training_losses"] == [None, 1.5]
    assert [(f["config"], f["stage"]) for f in report["failed"]] == [("tms-torch", "allocator")]
    assert report["failed"][0]["error"].endswith("ImportError: no tms")
    assert report["exit_status"] == 1


def test_child_environment(tmp_path):
    environ = {"PYTHONPATH": "python:.tms", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
               "LD_PRELOAD": "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so:/y/other.so",
               "BENCH_SLEEP_PRELOADED": "1", "HOME": "/home/u"}
    env = sleep.child_environment(environ, tmp_path)
    assert env["PYTHONPATH"].split(":") == [str(sleep.ROOT), str(tmp_path / "python"),
                                            str(tmp_path / ".tms")]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "BENCH_SLEEP_PRELOADED" not in env
    assert env["LD_PRELOAD"] == "/y/other.so" and env["HOME"] == "/home/u"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "LD_PRELOAD" not in sleep.child_environment({"LD_PRELOAD": "/a/torch_memory_saver.so"},
                                                       tmp_path)


class Runner:
    """Stands in for subprocess.run: writes the record a child would (or not)."""

    def __init__(self, record=None, returncode=0, raises=None, output="some output\n"):
        self.record, self.returncode, self.raises, self.output = record, returncode, raises, output
        self.argv = None

    def __call__(self, argv, **kwargs):
        self.argv = argv
        if self.raises:
            raise self.raises
        if self.record is not None:
            Path(argv[argv.index("--out") + 1]).write_text(json.dumps(self.record))
        return subprocess.CompletedProcess(argv, self.returncode, self.output, "")


def test_run_child_reads_the_record_and_keeps_the_log(tmp_path):
    runner = Runner(sleeper_record())
    record = sleep.run_child("streampool-vmm", tmp_path, {}, 10, runner=runner)
    assert record["ok"] and record["returncode"] == 0 and record["wall_s"] >= 0
    assert runner.argv[1:5] == ["-m", "bench.sleep", "--child", "streampool-vmm"]
    assert (tmp_path / "child-streampool-vmm.log").read_text() == "some output\n"


def test_run_child_without_a_record_says_why(tmp_path):
    record = sleep.run_child("tms", tmp_path, {}, 10,
                             runner=Runner(None, returncode=-11, output="a\nSegmentation fault\n"))
    assert not record["ok"] and record["stage"] == "start"
    assert record["error"].startswith("exit status -11\nno record from the child")


def test_run_child_that_times_out_keeps_what_it_measured(tmp_path):
    partial = sleeper_record(ok=False, stage="wake")
    (tmp_path / "child-tms.json").write_text(json.dumps(partial))  # written by the child

    def runner(argv, **kwargs):
        Path(argv[argv.index("--out") + 1]).write_text(json.dumps(partial))
        raise subprocess.TimeoutExpired(argv, 10, output=b"late\n")

    record = sleep.run_child("tms", tmp_path, {}, 10, runner=runner)
    assert not record["ok"] and record["error"].startswith("timed out after 10 s")
    assert record["stage"] == "wake" and sleep.row(record)["given_back_pct"] is not None


def test_run_child_whose_record_says_ok_but_whose_status_does_not(tmp_path):
    record = sleep.run_child("native", tmp_path, {}, 10,
                             runner=Runner(native_record(), returncode=1))
    assert not record["ok"] and record["error"].startswith("exit status 1")


def test_parent_writes_the_files_and_prints_the_summary_last(tmp_path, monkeypatch, capsys):
    fabricated = fabricated_report()["records"]
    monkeypatch.setattr(sleep, "run_child",
                        lambda config, out_dir, env, timeout_s: dict(fabricated[config],
                                                                     wall_s=1.0))
    options = sleep.parse_args(["--out-dir", str(tmp_path / "out")])
    assert sleep.run_parent(options, ["--out-dir", "out"]) == 1
    written = json.loads((tmp_path / "out" / "sleep.json").read_text())
    assert [r["config"] for r in written["rows"]] == list(sleep.CONFIGS)
    assert written["meta"]["command"] == "python3 -m bench.sleep --out-dir out"
    assert written["meta"]["facts"]["device"] == "NVIDIA H200"
    assert (tmp_path / "out" / "sleep.md").read_text().startswith("# Sleep and wake")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "FAILED tms-torch at stage allocator: ImportError: no tms (sleep.md; log: ")
    assert out[-5:] == sleep.summary_lines(fabricated_report())


def test_options():
    assert sleep.parse_args([]).configs == list(sleep.CONFIGS)
    assert sleep.parse_args(["--configs", "tms,native"]).configs == ["native", "tms"]
    with pytest.raises(SystemExit):
        sleep.parse_args(["--configs", "rmm"])
    with pytest.raises(SystemExit):
        sleep.parse_args(["--timeout-s", "0"])


def test_importing_the_module_needs_no_torch():
    code = "import sys, bench.sleep; sys.exit(1 if 'torch' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=sleep.ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="children read /proc")
@pytest.mark.parametrize("config, stage", [("native", "allocator"), ("tms", "preload")])
def test_a_real_child_without_torch_records_its_stage(tmp_path, config, stage):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: a child would start measuring")
    environment = sleep.child_environment(dict(os.environ), Path.cwd())
    record = sleep.run_child(config, tmp_path, environment, 60)
    assert not record["ok"] and record["stage"] == stage
    assert "No module named" in record["error"] and record["returncode"] == 1
    assert record["facts"]["python"] == sys.version.split()[0]

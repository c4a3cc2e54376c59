"""CPU tests of the benchmark's parent side (streampool.bench): options, child plumbing,
aggregation and reports, with made-up numbers and fake child processes. No torch, no GPU."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from streampool import bench

ALL_WORKLOADS = list(bench.WORKLOADS)


def record(time_us, device_bytes=1000, live_bytes=None, held_bytes=0):
    """A child's record for one workload; live_bytes only in native's."""
    result = {
        "median_time_us": time_us,
        "peak_device_bytes": device_bytes,
        "held_at_start_bytes": held_bytes,
        "timed_steps": 5,
    }
    if live_bytes is not None:
        result["peak_live_bytes"] = live_bytes
    return result


def child(records, status="ok", info=None):
    return {"status": status, "info": info or {}, "workloads": records}


def failed_child(workloads, error, status="failed"):
    return child({w: {"error": error} for w in workloads}, status=status)


def options_for(argv):
    return bench.parse_args(argv)


# --- options ---------------------------------------------------------------------------------


def test_defaults_run_everything_three_times():
    options = options_for([])
    assert options.configs == list(bench.CONFIGS)
    assert options.workloads == ALL_WORKLOADS
    assert options.repeats == 3
    assert options.timeout_s == bench.CHILD_TIMEOUT_FULL_S
    assert options.out_dir == Path("bench/results")
    assert options.markdown is None and options.child is None and not options.quick


def test_quick_reduces_repeats_and_timeout_unless_given():
    assert options_for(["--quick"]).repeats == bench.REPEATS_QUICK
    assert options_for(["--quick"]).timeout_s == bench.CHILD_TIMEOUT_QUICK_S
    assert options_for(["--quick", "--repeats", "5", "--timeout", "12"]).repeats == 5
    assert options_for(["--quick", "--timeout", "12"]).timeout_s == 12


def test_quick_steps_are_fewer_and_models_keep_15_plus_30():
    for workload in bench.WORKLOADS:
        full, quick = bench.STEPS[workload]
        assert quick.warmup + quick.timed < full.warmup + full.timed
    assert bench.STEPS["gpt2"][1] == (15, 30) and bench.STEPS["resnet50"][1] == (15, 30)


def test_names_are_put_in_canonical_order_and_native_is_always_run():
    options = options_for(
        ["--configs", "streampool,torch-async", "--workloads", "gpt2, empty_1KiB"]
    )
    assert options.configs == ["native", "torch-async", "streampool"]
    assert options.workloads == ["empty_1KiB", "gpt2"]


def test_a_variant_runs_streampool_with_its_settings(monkeypatch):
    options = options_for(
        ["--configs", "streampool", "--variant", "small:STREAMPOOL_SMALL_POOL_MAX=1MiB"]
    )
    assert options.configs == ["native", "streampool", "streampool:small"]
    seen = {}

    def fake_run_process(command, env, timeout_s, label):
        seen.update(command=command, env=env)
        return bench.ChildOutcome("", "", None)

    monkeypatch.setattr(bench, "run_process", fake_run_process)
    bench.run_child("streampool:small", options, "label")
    assert seen["command"][seen["command"].index("--child") + 1] == "streampool"
    assert seen["env"]["STREAMPOOL_SMALL_POOL_MAX"] == "1MiB"


@pytest.mark.parametrize(
    "argv",
    [["--variant", "small"], ["--variant", "x:PATH=/"], ["--variant", ":STREAMPOOL_X=1"],
     ["--configs", "jemalloc"], ["--workloads", "bert"], ["--configs", ","], ["--repeats", "0"]],
)
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        options_for(argv)
    assert "error" in capsys.readouterr().err


def test_command_line_shows_streampool_variables_and_quoted_arguments():
    text = bench.command_line(
        ["--quick", "--markdown", "my file.md"],
        {"STREAMPOOL_RELEASE_THRESHOLD": "8GiB", "STREAMPOOL_LIBRARY": "/x/lib.so", "HOME": "/r"},
    )
    assert text == (
        "STREAMPOOL_RELEASE_THRESHOLD=8GiB python3 -m streampool bench "
        "--quick --markdown 'my file.md'"
    )


# --- child plumbing --------------------------------------------------------------------------


def test_child_environment_sets_only_its_own_allocator_settings():
    environ = {
        "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
        "PYTORCH_ALLOC_CONF": "x",
        "PYTHONPATH": "/elsewhere",
        "KEEP": "1",
    }
    native = bench.child_environment("native", environ)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in native and "PYTORCH_ALLOC_CONF" not in native
    assert native["KEEP"] == "1"
    package_parent = str(Path(bench.__file__).resolve().parent.parent)
    assert native["PYTHONPATH"].split(":") == [package_parent, "/elsewhere"]
    assert (
        bench.child_environment("torch-async", environ)["PYTORCH_CUDA_ALLOC_CONF"]
        == "backend:cudaMallocAsync"
    )
    assert (
        bench.child_environment("expandable", {})["PYTORCH_CUDA_ALLOC_CONF"]
        == "expandable_segments:True"
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in bench.child_environment("streampool", environ)


def test_child_command_runs_this_module():
    command = bench.child_command("streampool", ["empty_1KiB", "gpt2"], quick=True)
    assert command[1:] == [
        "-m",
        "streampool.bench",
        "--child",
        "streampool",
        "--workloads",
        "empty_1KiB,gpt2",
        "--quick",
    ]
    child_options = bench.parse_args(command[3:])
    assert child_options.child == "streampool" and child_options.workloads == ["empty_1KiB", "gpt2"]


def marker(kind, **fields):
    return bench.RESULT_MARKER + json.dumps({"kind": kind, **fields})


def test_child_output_is_read_from_marker_lines_only():
    stdout = "\n".join(
        [
            "some library chatter",
            marker("info", info={"device": "GPU X"}),
            marker("workload", workload="empty_1KiB", record=record(2.0)),
            marker("workload", workload="gpt2", record={"error": "OutOfMemoryError: boom"}),
        ]
    )
    result = bench.parse_child_output(bench.ChildOutcome(stdout, "", None), ["empty_1KiB", "gpt2"])
    assert result == {
        "status": "ok",
        "info": {"device": "GPU X"},
        "workloads": {"empty_1KiB": record(2.0), "gpt2": {"error": "OutOfMemoryError: boom"}},
    }


def test_skipped_and_setup_errors_mark_every_workload():
    skipped = bench.parse_child_output(
        bench.ChildOutcome(marker("skipped", reason="rmm is not importable (nope)"), "", None),
        ["churn", "gpt2"],
    )
    assert skipped["status"] == "skipped"
    assert skipped["workloads"]["gpt2"] == {"error": "skipped: rmm is not importable (nope)"}
    broken = bench.parse_child_output(
        bench.ChildOutcome(marker("setup_error", reason="RuntimeError: bad"), "", None), ["churn"]
    )
    assert broken["status"] == "setup_error" and broken["workloads"]["churn"] == {
        "error": "RuntimeError: bad"
    }


def test_a_crashed_child_keeps_finished_workloads_and_blames_the_rest():
    stdout = marker("workload", workload="churn", record=record(5.0))
    outcome = bench.ChildOutcome(
        stdout, "Traceback ...\nSegmentation fault\n", "child exited with status -11"
    )
    result = bench.parse_child_output(outcome, ["churn", "gpt2"])
    assert (
        result["status"] == "failed" and result["process_failure"] == "child exited with status -11"
    )
    assert result["workloads"]["churn"] == record(5.0)
    assert result["workloads"]["gpt2"]["error"].startswith(
        "child exited with status -11: Traceback"
    )
    assert "Segmentation fault" in result["workloads"]["gpt2"]["error"]


def write_script(tmp_path, body):
    path = tmp_path / "fake_child.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_run_process_captures_stdout_and_echoes_stderr(tmp_path, capsys):
    command = write_script(
        tmp_path,
        """
        import sys
        print("out line")
        print("progress line", file=sys.stderr)
    """,
    )
    outcome = bench.run_process(command, {}, 30, "label")
    assert outcome == bench.ChildOutcome("out line\n", "progress line\n", None)
    assert "label| progress line" in capsys.readouterr().err


def test_run_process_reports_exit_status_and_timeout(tmp_path):
    failing = write_script(tmp_path, "import sys; print('why', file=sys.stderr); sys.exit(3)")
    assert bench.run_process(failing, {}, 30, "x").failure == "child exited with status 3"
    sleeping = write_script(tmp_path, "import time; time.sleep(60)")
    assert bench.run_process(sleeping, {}, 0.5, "x").failure == "child timed out after 0.5 s"


def test_run_all_interleaves_configurations_and_does_not_restart_skipped_ones():
    options = options_for(
        ["--configs", "streampool,rmm-pool", "--workloads", "churn", "--repeats", "3"]
    )
    calls = []

    def runner(config, _options, _label):
        calls.append(config)
        if config == "rmm-pool":
            return failed_child(["churn"], "skipped: rmm is not importable", status="skipped")
        return child({"churn": record(1.0, live_bytes=10)})

    runs = bench.run_all(options, runner)
    assert calls == [
        "native",
        "streampool",
        "rmm-pool",
        "native",
        "streampool",
        "native",
        "streampool",
    ]
    assert len(runs) == 3 and all(run["rmm-pool"]["status"] == "skipped" for run in runs)


# --- aggregation -----------------------------------------------------------------------------


def two_repeats():
    """native vs streampool on empty_1KiB and gpt2, two repeats with known ratios."""
    return [
        {
            "native": child(
                {"empty_1KiB": record(2.0, 0, 0), "gpt2": record(40_000.0, 1240, 1000)}
            ),
            "streampool": child({"empty_1KiB": record(1.8, 0), "gpt2": record(38_000.0, 1020)}),
        },
        {
            "native": child(
                {"empty_1KiB": record(2.2, 0, 0), "gpt2": record(50_000.0, 1250, 1000)}
            ),
            "streampool": child({"empty_1KiB": record(2.2, 0), "gpt2": record(49_000.0, 1040)}),
        },
    ]


def test_time_ratios_are_per_repeat_then_median_with_spread():
    cell = bench.aggregate_cell(two_repeats(), "streampool", "gpt2")
    assert cell["time_ratio_min"] == pytest.approx(0.95)
    assert cell["time_ratio_max"] == pytest.approx(0.98)
    assert cell["time_ratio"] == pytest.approx((0.95 + 0.98) / 2)
    assert cell["median_time_us"] == pytest.approx(43_500.0)
    assert cell["repeats_measured"] == 2
    native = bench.aggregate_cell(two_repeats(), "native", "gpt2")
    assert native["time_ratio"] == native["time_ratio_min"] == native["time_ratio_max"] == 1.0


def test_memory_ratio_uses_natives_live_peak_of_the_same_repeat():
    cell = bench.aggregate_cell(two_repeats(), "streampool", "gpt2")
    assert cell["peak_memory_ratio"] == pytest.approx(1.03)
    assert (cell["peak_memory_ratio_min"], cell["peak_memory_ratio_max"]) == pytest.approx(
        (1.02, 1.04)
    )
    assert cell["peak_device_bytes"] == 1030 and cell["peak_live_bytes"] == 1000
    assert cell["peak_memory_lower_bound"] is False
    assert bench.aggregate_cell(two_repeats(), "native", "gpt2")[
        "peak_memory_ratio"
    ] == pytest.approx(1.245)


def test_no_memory_ratio_for_the_empty_loops():
    cell = bench.aggregate_cell(two_repeats(), "streampool", "empty_1KiB")
    assert cell["peak_memory_ratio"] is None and "peak_memory_lower_bound" not in cell
    assert cell["time_ratio"] == pytest.approx((0.9 + 1.0) / 2)


def test_memory_held_before_the_workload_makes_the_ratio_a_lower_bound():
    runs = [
        {
            "native": child({"gpt2": record(1.0, 1200, 1000, held_bytes=30)}),
            "rmm-pool": child({"gpt2": record(1.0, 10, held_bytes=40_000)}),
        }
    ]
    cell = bench.aggregate_cell(runs, "rmm-pool", "gpt2")
    assert (
        cell["peak_memory_ratio"] == pytest.approx(0.01) and cell["peak_memory_lower_bound"] is True
    )
    assert cell["held_at_start_bytes"] == 40_000


def test_failures_are_errors_or_repeat_errors():
    runs = two_repeats()
    runs[1]["native"]["workloads"]["gpt2"] = {"error": "OutOfMemoryError"}
    partial = bench.aggregate_cell(runs, "streampool", "gpt2")
    assert partial["repeats_measured"] == 1 and partial["time_ratio"] == pytest.approx(0.95)
    assert partial["repeat_errors"] == ["native failed in the same repeat: OutOfMemoryError"]
    for run in runs:
        run["streampool"]["workloads"]["empty_1KiB"] = {"error": "RuntimeError: x"}
    assert bench.aggregate_cell(runs, "streampool", "empty_1KiB") == {"error": "RuntimeError: x"}


def fake_report(streampool_gpt2_time=0.95, streampool_gpt2_memory=1020):
    """A report over native, expandable, streampool, rmm-pool (skipped) with known numbers."""
    runs = []
    for repeat in range(2):
        native = {
            w: record(10.0 + repeat, 1000, 800 if bench.has_memory_ratio(w) else 0)
            for w in ALL_WORKLOADS
        }
        native["gpt2"] = record(100.0, 1240, 1000)
        expandable = {w: record(10.5 + repeat, 900) for w in ALL_WORKLOADS}
        expandable["gpt2"] = record(98.0, 1090)
        mine = {w: record(9.0 + repeat, 820) for w in ALL_WORKLOADS}
        mine["gpt2"] = record(100.0 * streampool_gpt2_time, streampool_gpt2_memory)
        mine["resnet50"] = record(10.5 + repeat, 800)
        info = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0"}
        runs.append(
            {
                "native": child(native, info=info),
                "expandable": child(expandable, info=info),
                "streampool": child(mine, info={**info, "streampool_version": "0.1.0"}),
                "rmm-pool": failed_child(
                    ALL_WORKLOADS, "skipped: rmm is not importable (x)", status="skipped"
                ),
            }
        )
    options = options_for(["--configs", "native,expandable,streampool,rmm-pool", "--quick"])
    return bench.build_report(
        runs, options, "python3 -m streampool bench --quick", "2026-11-22 10:00 UTC", "580.65.06"
    )


def test_report_has_the_promised_shape():
    report = fake_report()
    assert report["device"] == "NVIDIA H100 80GB HBM3" and report["torch"] == "2.11.0+cu130"
    assert report["streampool"] == "0.1.0" and report["driver"] == "580.65.06"
    assert report["repeats"] == 2 and report["command"] == "python3 -m streampool bench --quick"
    for workload in ("gpt2", "resnet50", "empty_1KiB", "empty_1MiB", "empty_64MiB"):
        for config in ("native", "streampool"):
            cell = report["workloads"][workload][config]
            for key in (
                "time_ratio",
                "time_ratio_min",
                "time_ratio_max",
                "median_time_us",
                "peak_memory_ratio",
                "peak_device_bytes",
                "peak_live_bytes",
            ):
                assert key in cell
    assert report["workloads"]["gpt2"]["rmm-pool"] == {
        "error": "skipped: rmm is not importable (x)"
    }
    assert len(report["raw"]) == 2
    json.dumps(report, allow_nan=False)


# --- reports ---------------------------------------------------------------------------------


def test_targets_are_judged_from_the_measured_numbers():
    rows = {
        (w, m): (measured, status) for w, m, _, measured, status in bench.target_rows(fake_report())
    }
    assert rows[("gpt2", "time_ratio")] == ("0.950×", "met")
    assert rows[("resnet50", "time_ratio")][1] == "not met"  # 10.5/10 and 11.5/11
    assert rows[("empty_1KiB", "time_ratio")][1] == "met"
    assert rows[("gpt2", "peak_memory_ratio")] == ("1.020×", "met")
    assert rows[("resnet50", "peak_memory_ratio")][1] == "met"  # 800 / 800
    slow = {(w, m): status for w, m, _, _, status in bench.target_rows(fake_report(1.01, 1100))}
    assert (
        slow[("gpt2", "time_ratio")] == "not met"
        and slow[("gpt2", "peak_memory_ratio")] == "not met"
    )


def test_a_lower_bound_memory_ratio_is_never_the_best_other():
    report = fake_report()
    cells = report["workloads"]["gpt2"]
    cells["expandable"] = {**cells["expandable"], "peak_memory_ratio": 1.07}
    cells["rmm-pool"] = {"peak_memory_ratio": 0.01, "peak_memory_lower_bound": True}
    assert bench._best_other(report, "gpt2", "peak_memory_ratio").startswith("expandable 1.070")


def test_targets_of_a_failed_streampool_are_not_measured():
    report = fake_report()
    report["workloads"]["gpt2"]["streampool"] = {"error": "boom"}
    rows = {(w, m): status for w, m, _, _, status in bench.target_rows(report)}
    assert rows[("gpt2", "time_ratio")] == "not measured"


def test_markdown_report(tmp_path):
    text = bench.markdown(fake_report())
    assert "NVIDIA H100 80GB HBM3, driver 580.65.06" in text
    assert "torch 2.11.0+cu130 (CUDA 13.0), streampool 0.1.0" in text
    assert "`python3 -m streampool bench --quick`" in text
    assert "| workload | native | expandable | streampool | rmm-pool |" in text
    assert "| `gpt2` | 1.00× | 0.98× | 0.95× | skipped |" in text
    assert "| `resnet50` | 1.00× | 1.05× (1.05–1.05) | 1.05× (1.05–1.05) | skipped |" in text
    assert "| `empty_1KiB` | 10.50 µs/pair |" in text and "| `gpt2` | 0.10 ms/step |" in text
    memory_section = text.split("## Peak device memory")[1].split("## Targets")[0]
    assert "empty_1KiB" not in memory_section
    assert "| `gpt2` | 1.24× | 1.09× | 1.02× | skipped |" in memory_section
    assert "| `gpt2` | time_ratio | ≤ 0.99× | 0.950× | expandable 0.980× | met |" in text
    assert (
        "- `rmm-pool` (" + ", ".join(ALL_WORKLOADS) + "): skipped: rmm is not importable (x)"
        in text
    )


def test_lower_bound_is_marked_and_not_judged():
    report = fake_report()
    report["workloads"]["gpt2"]["streampool"]["peak_memory_lower_bound"] = True
    assert "≥1.02×" in bench.markdown(report) and "≥1.020×" in bench.markdown(report)
    rows = {(w, m): status for w, m, _, _, status in bench.target_rows(report)}
    assert rows[("gpt2", "peak_memory_ratio")].startswith("not judged")


def test_summary_lines_one_per_workload():
    lines = bench.summary_lines(fake_report())
    assert len(lines) == 1 + len(ALL_WORKLOADS)
    gpt2 = next(line for line in lines if line.startswith("gpt2 "))
    assert gpt2.split() == [
        "gpt2",
        "native",
        "1.00",
        "[1.24]",
        "expandable",
        "0.98",
        "[1.09]",
        "streampool",
        "0.95",
        "[1.02]",
        "rmm-pool",
        "skipped",
    ]
    empty = next(line for line in lines if line.startswith("empty_1KiB"))
    assert "[" not in empty


def test_write_outputs(tmp_path):
    pytest.importorskip("matplotlib")
    report = fake_report()
    markdown_path = tmp_path / "BENCHMARKS.md"
    markdown_path.write_text("old content")
    bench.write_outputs(report, tmp_path / "results", markdown_path)
    assert json.loads((tmp_path / "results" / "latest.json").read_text()) == report
    assert (tmp_path / "results" / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert markdown_path.read_text() == bench.markdown(report)


def test_varying_schedule_meets_every_value_first_and_changes_every_step():
    schedule = bench.varying_schedule((1, 2, 3), 20, seed=5)
    assert schedule == bench.varying_schedule((1, 2, 3), 20, seed=5)
    assert len(schedule) == 20 and sorted(schedule[:3]) == [1, 2, 3]
    assert all(a != b for a, b in zip(schedule, schedule[1:]))
    assert bench.varying_schedule((1, 2, 3), 2, seed=5) == schedule[:2]


def test_warm_up_meets_every_shape_of_the_varying_workloads():
    shapes = {
        "gpt2": bench.GPT2_SEQ_LENGTHS,
        "resnet50": bench.RESNET_BATCHES,
        "multistream": bench.MULTISTREAM_SIDES,
    }
    for workload, values in shapes.items():
        assert all(counts.warmup >= len(values) for counts in bench.STEPS[workload])
    assert (min(bench.GPT2_SEQ_LENGTHS), max(bench.GPT2_SEQ_LENGTHS)) == (128, 1024)
    assert (min(bench.RESNET_BATCHES), max(bench.RESNET_BATCHES)) == (32, 128)


def test_a_plot_that_fails_loses_nothing_else(tmp_path, monkeypatch, capsys):
    def broken_plot(report, path):
        raise ValueError("old matplotlib")

    monkeypatch.setattr(bench, "write_plot", broken_plot)
    bench.write_outputs(fake_report(), tmp_path, tmp_path / "B.md")
    assert (tmp_path / "latest.json").exists() and (tmp_path / "B.md").exists()
    assert "no plot: ValueError: old matplotlib" in capsys.readouterr().err


def test_log_uniform_sizes_are_seeded_and_in_range():
    sizes = bench.log_uniform_sizes_bytes(5000, 512, 64 * 2**20, seed=7)
    assert sizes == bench.log_uniform_sizes_bytes(5000, 512, 64 * 2**20, seed=7)
    assert min(sizes) >= 512 and max(sizes) <= 64 * 2**20
    assert sum(s < 2**14 for s in sizes) > 1000 and sum(s > 2**21 for s in sizes) > 1000


# --- the whole parent, with fake children ------------------------------------------------------

FAKE_CHILD = """
import json, sys
config = sys.argv[sys.argv.index("--child") + 1]
workloads = sys.argv[sys.argv.index("--workloads") + 1].split(",")
emit = lambda kind, **f: print({marker!r} + json.dumps(dict(kind=kind, **f)), flush=True)
if config == "rmm-async":
    emit("skipped", reason="rmm is not importable (fake)")
    sys.exit(0)
emit("info", info=dict(device="Fake GPU", torch="0.0", cuda="0.0", streampool_version="9.9"))
speed = dict(native=1.0, streampool=0.9)[config]
for workload in workloads:
    print(workload + ": running", file=sys.stderr, flush=True)
    record = dict(median_time_us=100 * speed, peak_device_bytes=int(2000 * speed),
                  held_at_start_bytes=0)
    if config == "native":
        record["peak_live_bytes"] = 1600
    emit("workload", workload=workload, record=record)
"""


def test_main_end_to_end_with_fake_children(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD.format(marker=bench.RESULT_MARKER))
    monkeypatch.setattr(
        bench,
        "child_command",
        lambda config, workloads, quick: [
            sys.executable,
            str(script),
            "--child",
            config,
            "--workloads",
            ",".join(workloads),
        ],
    )
    monkeypatch.setattr(bench, "write_plot", lambda report, path: path.write_bytes(b"png"))
    argv = [
        "--configs",
        "streampool,rmm-async",
        "--workloads",
        "empty_1KiB,gpt2",
        "--repeats",
        "2",
        "--out-dir",
        str(tmp_path / "out"),
        "--markdown",
        str(tmp_path / "B.md"),
    ]
    assert bench.main(argv) == 0
    report = json.loads((tmp_path / "out" / "latest.json").read_text())
    assert (
        report["device"] == "Fake GPU" and report["streampool"] == "9.9" and report["repeats"] == 2
    )
    assert report["workloads"]["gpt2"]["streampool"]["time_ratio"] == pytest.approx(0.9)
    assert report["workloads"]["gpt2"]["streampool"]["peak_memory_ratio"] == pytest.approx(
        1800 / 1600
    )
    assert (
        report["workloads"]["gpt2"]["rmm-async"]["error"] == "skipped: rmm is not importable (fake)"
    )
    assert report["command"].endswith("python3 -m streampool bench " + " ".join(argv))
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-2:]
    assert last[0].split() == [
        "empty_1KiB",
        "native",
        "1.00",
        "streampool",
        "0.90",
        "rmm-async",
        "skipped",
    ]
    assert last[1].split() == [
        "gpt2",
        "native",
        "1.00",
        "[1.25]",
        "streampool",
        "0.90",
        "[1.12]",
        "rmm-async",
        "skipped",
    ]
    assert "[1/2] streampool: running empty_1KiB, gpt2" in err and "gpt2: running" in err
    assert err.count("rmm-async: skipped") == 1  # not started again in repeat 2
    assert "## Targets" in (tmp_path / "B.md").read_text()

"""What the benchmark writes: options, the markdown report, the summary, the PNG, and the whole
parent end to end with fake child processes (rotation, A/A, latest.json after every repeat,
re-rendering from JSON). Everything is written under the test's tmp_path."""

import importlib.util
import json
import sys

import pytest

from bench import child, cli, cotenant, markdown, plot
from bench.tests import fakes

COTENANT_CELLS = {
    "native": {
        "cotenant_fit_fraction": 0.6,
        "cotenant_fit_fraction_min": 0.59,
        "cotenant_fit_fraction_max": 0.61,
        "fit_bytes": 48 * 2**30,
        "device_total_bytes": 80 * 2**30,
        "empty_cache_called": False,
        "repeats_measured": 2,
    },
    "native+empty_cache": {
        "cotenant_fit_fraction": 0.97,
        "cotenant_fit_fraction_min": 0.97,
        "cotenant_fit_fraction_max": 0.97,
        "fit_bytes": 77 * 2**30,
        "device_total_bytes": 80 * 2**30,
        "empty_cache_called": True,
        "repeats_measured": 2,
    },
    "streampool-threshold-1GiB": {"error": "child exited with status 1: boom"},
}


def full_report():
    return fakes.build(cotenant={"cells": COTENANT_CELLS, "rounds": []})


# --- options ---------------------------------------------------------------------------------


def test_defaults_are_the_full_run():
    options = cli.parse_args(["--out-dir", "/tmp/x"])
    assert options.repeats == 8 and options.time_budget_s == cli.TIME_BUDGET_FULL_S
    assert options.configs[:2] == ["native", "native-aa"] and "streampool-vmm" in options.configs
    assert options.workloads[-1] == "cotenant" and options.cotenant_repeats == 1
    quick = cli.parse_args(["--out-dir", "/tmp/x", "--quick"])
    assert quick.repeats == 3 and quick.time_budget_s == cli.TIME_BUDGET_QUICK_S
    assert cli.parse_args(["--out-dir", "x", "--quick", "--repeats", "9"]).repeats == 9


def test_native_always_runs_and_variants_come_last():
    options = cli.parse_args(
        [
            "--out-dir",
            "x",
            "--configs",
            "streampool,expandable",
            "--variant",
            "small:STREAMPOOL_SMALL_POOL_MAX=1MiB",
        ]
    )
    assert options.configs == ["native", "expandable", "streampool", "streampool:small"]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--out-dir", "x", "--configs", "jemalloc"],
        ["--out-dir", "x", "--workloads", "bert,nope"],
        ["--out-dir", "x", "--repeats", "0"],
        ["--out-dir", "x", "--variant", "a:STREAMPOOL_X=1", "--variant", "a:STREAMPOOL_Y=1"],
    ],
)
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_command_line_shows_streampool_variables_and_quoted_arguments():
    text = cli.command_line(
        ["--quick", "--out-dir", "my dir"],
        {"STREAMPOOL_RELEASE_THRESHOLD": "8GiB", "STREAMPOOL_LIBRARY": "/x/lib.so", "HOME": "/r"},
    )
    assert text == "STREAMPOOL_RELEASE_THRESHOLD=8GiB python3 -m bench --quick --out-dir 'my dir'"


# --- markdown and summary ----------------------------------------------------------------------


def test_markdown_has_intervals_the_aa_row_and_claims_only_beyond_it():
    text = markdown.markdown(full_report())
    assert "NVIDIA H100 80GB HBM3, driver 580.65.06" in text
    assert "- command: `python3 -m bench --out-dir /tmp/x`" in text
    assert "| workload | native | native-aa | expandable | streampool |" in text
    host = text.split("## Time ×native, host clock")[1].split("## Time ×native, GPU clock")[0]
    assert (
        "| `gpt2` | 1 (reference) | 1.000× (0.990–1.010) | 0.990× (0.990–0.990) | **0.965× (0.950–0.980)** |"
        in host
    )
    gpu = text.split("## Time ×native, GPU clock")[1].split("## A/A control")[0]
    assert (
        "| `gpt2` | 1 (reference) | 1.000× (1.000–1.000) | 1.000× (1.000–1.000) | 1.000× (1.000–1.000) |"
        in gpu
    )
    aa = text.split("## A/A control")[1].split("##")[0]
    assert "| `gpt2` | 1.000× (0.990–1.010) | 1.000× (1.000–1.000) |" in aa
    memory = text.split("## Peak device memory")[1].split("## Co-tenant")[0]
    assert (
        "empty_1KiB" not in memory
        and "| `gpt2` | 1.24× | 1.25× | 1.07× | 1.10× (1.10–1.11) |" in memory
    )


def test_markdown_time_per_unit_uses_each_workloads_unit():
    document = full_report()
    document["workloads"]["gpt2"]["native"]["host_time_per_unit_s"] = 0.04512
    document["workloads"]["empty_1KiB"]["native"]["host_time_per_unit_s"] = 2.2e-6
    text = markdown.markdown(document)
    assert "| `gpt2` | 45.120 ms/step |" in text and "| `empty_1KiB` | 2.200 µs/pair |" in text


def test_markdown_cotenant_targets_and_failures():
    text = markdown.markdown(full_report())
    assert "| `native` | no | 48.0 GiB | 0.600 (0.590–0.610) |" in text
    assert "| `native+empty_cache` | yes | 77.0 GiB | 0.970 |" in text
    assert "| `streampool-threshold-1GiB` | | failed | |" in text
    targets = text.split("## Targets")[1]
    assert (
        "| `gpt2` | time_ratio | `streampool` | median ≤ 1.00×, upper end ≤ 1.02 | "
        "0.965× (0.950–0.980) | met |"
    ) in targets
    assert (
        "| `gpt2` | peak_memory_ratio | `streampool` | upper end ≤ 1.03 | 1.103× (1.101–1.106) | not met |"
        in targets
    )
    assert "- `streampool-threshold-1GiB` (cotenant): child exited with status 1: boom" in text


def test_markdown_says_when_the_run_stopped_early():
    document = fakes.build(runs=fakes.eight_repeats()[:5], stop_reason="time budget: 5 of 8 ran")
    assert "5 repeat(s) of 8 asked (time budget: 5 of 8 ran)" in markdown.markdown(document)


def test_summary_lines():
    lines = markdown.summary_lines(full_report())
    gpt2 = next(line for line in lines if line.startswith("gpt2 "))
    assert (
        "streampool 0.965(0.950-0.980) [1.10]" in gpt2
        and "native-aa 1.000(0.990-1.010) [1.25]" in gpt2
    )
    assert ["cotenant", "native", "0.600"] in [line.split() for line in lines]
    assert "target gpt2 time_ratio streampool: met" in lines


def test_plot_is_a_png_with_error_bars(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "latest.png"
    plot.write_plot(full_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_error_bars_are_the_interval_for_time_and_the_spread_for_memory():
    cell = {
        "time_ratio": 0.97,
        "time_ratio_ci95": [0.95, 1.00],
        "time_ratio_min": 0.90,
        "time_ratio_max": 1.1,
    }
    assert plot._whiskers(cell, "time_ratio", "ci95") == pytest.approx((0.02, 0.03))
    assert plot._whiskers(cell, "time_ratio", "spread") == pytest.approx((0.07, 0.13))


# --- the whole parent with fake children -------------------------------------------------------

FAKE_CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
from bench import protocol
base = sys.argv[sys.argv.index("--base") + 1]
workloads = sys.argv[sys.argv.index("--workloads") + 1].split(",")
config = base + ("-vmm" if os.environ.get("STREAMPOOL_BACKEND") else "")
with open({log!r}, "a") as log:
    log.write(config + "\\n")
starts = sum(1 for _ in open({log!r}))
if config == "streampool-vmm":
    protocol.emit("setup_error", reason="StreampoolError: STREAMPOOL_BACKEND=vmm: unknown backend")
    sys.exit(0)
protocol.emit("info", info=dict(device="Fake GPU", torch="0.0", cuda="0.0", streampool_version="9.9"))
speed = dict(native=1.0, streampool=0.9)[base] * (1 + 0.001 * (starts % 5))
for workload in workloads:
    print(workload + ": running", file=sys.stderr, flush=True)
    record = dict(host_time_s=speed, gpu_time_s=0.5, peak_device_bytes=int(2000 * speed),
                  held_at_start_bytes=0, units=4, unit="step", timed_steps=4)
    if base == "native":
        record["peak_live_bytes"] = 1600
    protocol.emit("workload", workload=workload, record=record)
"""


def fake_children(tmp_path, monkeypatch):
    from bench.configs import REPO_ROOT

    script, log = tmp_path / "fake_child.py", tmp_path / "starts.log"
    script.write_text(FAKE_CHILD.format(root=str(REPO_ROOT), log=str(log)))
    monkeypatch.setattr(
        child,
        "command",
        lambda base, backend, names: [
            sys.executable,
            str(script),
            "--base",
            base,
            "--workloads",
            ",".join(names),
        ],
    )
    monkeypatch.setattr(cli, "driver_version", lambda: "fake driver")
    return log


def test_main_end_to_end_with_fake_children(tmp_path, monkeypatch, capsys):
    log = fake_children(tmp_path, monkeypatch)
    written = []
    real_write_json = cli.write_json
    monkeypatch.setattr(
        cli,
        "write_json",
        lambda doc, out: (written.append(doc["repeats"]), real_write_json(doc, out)),
    )
    out = tmp_path / "out"
    argv = [
        "--configs",
        "native-aa,streampool,streampool-vmm",
        "--workloads",
        "empty_1KiB,gpt2",
        "--repeats",
        "3",
        "--out-dir",
        str(out),
    ]
    assert cli.main(argv) == 0
    document = json.loads((out / "latest.json").read_text())
    assert document["repeats"] == 3 and document["device"] == "Fake GPU"
    assert document["configs"] == ["native", "native-aa", "streampool", "streampool-vmm"]
    assert document["config_orders"][1] == ["native-aa", "streampool", "streampool-vmm", "native"]
    # one process per configuration per repeat, in the rotated order; the rejected one once
    # (native-aa is native in its own process: the fake child cannot tell them apart)
    starts = log.read_text().split()
    assert starts == [
        "native",
        "native",
        "streampool",
        "streampool-vmm",
        "native",
        "streampool",
        "native",
        "streampool",
        "native",
        "native",
    ]
    cell = document["workloads"]["gpt2"]["streampool"]
    assert cell["time_ratio"] == pytest.approx(0.9, abs=0.005) and cell["gpu_time_ratio"] == 1.0
    assert cell["peak_memory_ratio"] == pytest.approx(1800 / 1600, abs=0.01)
    assert document["workloads"]["gpt2"]["streampool-vmm"]["error"].startswith("StreampoolError")
    assert document["workloads"]["gpt2"]["native-aa"]["time_ratio_ci95"][0] < 1.0
    assert written == [1, 2, 3, 3]  # after every repeat, then the final report
    assert "workloads" in document and "partial" not in document
    assert (out / "latest.md").read_text() == markdown.markdown(document)
    out_text, err = capsys.readouterr()
    assert "target gpt2 time_ratio streampool" in out_text
    assert "[1/3] streampool: running empty_1KiB, gpt2" in err and "gpt2: running" in err
    png = ["latest.png"] if importlib.util.find_spec("matplotlib") else []
    assert sorted(p.name for p in out.iterdir()) == ["latest.json", "latest.md"] + png


def test_a_run_writes_nothing_outside_its_out_dir(tmp_path, monkeypatch):
    fake_children(tmp_path, monkeypatch)
    working = tmp_path / "cwd"
    working.mkdir()
    monkeypatch.chdir(working)
    cli.main(
        [
            "--configs",
            "streampool",
            "--workloads",
            "churn",
            "--repeats",
            "1",
            "--out-dir",
            str(tmp_path / "o"),
        ]
    )
    assert list(working.iterdir()) == []


def test_cotenant_runs_first_and_reaches_the_report(tmp_path, monkeypatch):
    fake_children(tmp_path, monkeypatch)
    order = []

    def trial(name, environ, timeout_s, label):
        order.append(name)
        return {
            "fit_bytes": 60 if "threshold" in name else 40,
            "device_total_bytes": 100,
            "empty_cache_called": name == "native+empty_cache",
            "wall_s": 0.1,
        }

    monkeypatch.setattr(cotenant, "run_trial", trial)
    options = cli.parse_args(
        [
            "--configs",
            "streampool",
            "--workloads",
            "churn,cotenant",
            "--repeats",
            "1",
            "--out-dir",
            str(tmp_path / "o"),
        ]
    )
    document = cli.run(options, [], {}, cotenant_trial=trial)
    assert order == ["native", "native+empty_cache", "streampool", "streampool-threshold-1GiB"]
    assert document["cotenant"]["streampool-threshold-1GiB"]["cotenant_fit_fraction"] == 0.6
    row = next(r for r in document["targets"] if r["metric"] == "cotenant_fit_fraction")
    assert row["status"] == "met" and row["compared_with"] == ["native"]


def test_from_json_renders_without_running(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run", lambda *a, **k: pytest.fail("ran the benchmark"))
    source = tmp_path / "old.json"
    source.write_text(json.dumps(full_report()))
    assert cli.main(["--out-dir", str(tmp_path / "o"), "--from-json", str(source)]) == 0
    assert (tmp_path / "o" / "latest.md").read_text() == markdown.markdown(full_report())
    assert not (tmp_path / "o" / "latest.json").exists()


def test_a_plot_that_fails_loses_nothing_else(tmp_path, monkeypatch, capsys):
    def broken_plot(report, path):
        raise ValueError("old matplotlib")

    monkeypatch.setattr(plot, "write_plot", broken_plot)
    cli.write_renderings(full_report(), tmp_path)
    assert (tmp_path / "latest.md").exists()
    assert "no plot: ValueError: old matplotlib" in capsys.readouterr().err


def test_ratio_cells_print_the_interval_not_the_spread():
    cell = {
        "time_ratio": 0.97,
        "time_ratio_ci95": [0.96, 0.99],
        "time_ratio_min": 0.90,
        "time_ratio_max": 1.20,
    }
    assert markdown.ratio_text(cell, "time_ratio") == "0.970× (0.960–0.990)"
    assert markdown.spread_text(cell, "time_ratio") == "0.97× (0.90–1.20)"


def test_each_configuration_gets_only_its_workloads(tmp_path):
    calls = {}

    def make_runner(variants, environ, timeout_s):
        def run(config, names, label):
            calls[config] = names
            return fakes.child({w: fakes.record(1.0, live_bytes=10) for w in names})

        return run

    options = cli.parse_args(
        [
            "--configs",
            "streampool,streampool-nocache",
            "--repeats",
            "1",
            "--workloads",
            "empty_1KiB,churn,gpt2",
            "--out-dir",
            str(tmp_path),
        ]
    )
    document = cli.run(options, [], {}, make_runner=make_runner)
    assert calls == {
        "native": ["empty_1KiB", "churn", "gpt2"],
        "streampool": ["empty_1KiB", "churn", "gpt2"],
        "streampool-nocache": ["churn"],
    }
    assert "streampool-nocache" in document["workloads"]["churn"]
    assert "streampool-nocache" not in document["workloads"]["gpt2"]
    alone = cli.parse_args(
        [
            "--configs",
            "streampool-nocache",
            "--repeats",
            "1",
            "--workloads",
            "gpt2",
            "--out-dir",
            str(tmp_path),
        ]
    )
    calls.clear()
    assert cli.run(alone, [], {}, make_runner=make_runner)["configs"] == ["native"]
    assert list(calls) == ["native"]  # no process started for a configuration with nothing to run


def test_a_run_cut_short_leaves_a_json_that_renders(tmp_path, monkeypatch):
    fake_children(tmp_path, monkeypatch)
    partials = []
    real_write_json = cli.write_json

    def keep(document, out_dir):
        partials.append(json.loads(json.dumps(document)))
        real_write_json(document, out_dir)

    monkeypatch.setattr(cli, "write_json", keep)
    cli.main(
        [
            "--configs",
            "native-aa,streampool",
            "--workloads",
            "churn",
            "--repeats",
            "2",
            "--out-dir",
            str(tmp_path / "full"),
        ]
    )
    first = partials[0]
    assert first["partial"] and first["repeats"] == 1 and "workloads" not in first
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(first))  # as if the machine had been taken away after repeat 1
    cli.main(["--out-dir", str(tmp_path / "re"), "--from-json", str(cut)])
    rebuilt = json.loads((tmp_path / "re" / "latest.json").read_text())
    assert rebuilt["repeats"] == 1 and rebuilt["stop_reason"].startswith("incomplete")
    assert rebuilt["workloads"]["churn"]["streampool"]["time_ratio"] == pytest.approx(0.9, abs=0.01)
    assert "1 repeat(s) of 2 asked (incomplete" in (tmp_path / "re" / "latest.md").read_text()


def test_markdown_warns_below_the_methods_repeats():
    assert "fewer than the method's 8" not in markdown.markdown(full_report())
    three = fakes.build(runs=fakes.eight_repeats()[:3])
    assert "3 repeat(s) — fewer than the method's 8" in markdown.markdown(three)

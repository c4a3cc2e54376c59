"""The command: options, what is missing in one line, a run, a calibration and a merge end to end
over stand-in workers, everything written under the test's tmp_path."""

import gzip
import json
import os
from pathlib import Path

import pytest

from bench import affinity, arguments, cli, cotenant, isolation, plan, portable
from bench.configs import COTENANT_NAMES, PRICE_CONFIGS

STANDIN = ["--engine", "bench.tests.standin:StandinEngine"]


def test_defaults_are_every_group_every_configuration():
    options = cli.parse_args([])
    assert options.groups == list(plan.GROUP_NAMES)
    assert options.pairs is options.block_s is options.processes is None  # the calibration's
    assert options.configs[:2] == ["native", "native-aa"] and "streampool-pool" in options.configs
    assert options.without == [] and options.calibration == str(plan.CALIBRATION_PATH)
    picked = cli.parse_args(["--group", "vision,alloc", "--configs", "streampool",
                             "--without", "threads,pin"])
    assert picked.groups == ["alloc", "vision"] and picked.configs == ["native", "streampool"]
    assert picked.without == ["pin", "threads"]
    calibration = cli.parse_args(["calibrate", "--ablate", "threads,pin"])
    assert calibration.ablate == ["pin", "threads"] and "cotenant" not in calibration.groups


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pairs", "0"], "--pairs '0': expected a positive number"),
        (["--group", "gpu"], "unknown group gpu"),
        (["--configs", "streampool-threshold-1GiB"], "paired with streampool: select it too"),
        (["--variant", "x:PATH=/"], "expected LABEL:STREAMPOOL_VAR=VALUE"),
        (["calibrate", "--blocks-s", "0.1,-1"], "--blocks-s '-1'"),
        (["--without", "pin,luck"], "unknown setting luck; choose from pin, rotate, launch, autograd, threads"),
        (["calibrate", "--ablate", "luck"], "unknown setting luck"),
        (["merge"], "the following arguments are required: dirs"),
        (["--group", "alloc", "--cotenant-without-price"], "only with the cotenant group"),
        (["--workloads", "gpt2", "--cotenant-without-price"], "only with the cotenant group"),
    ],
)
def test_bad_options_name_the_option_and_what_is_accepted(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert message in capsys.readouterr().err


def test_without_torch_one_line_says_so_and_nothing_runs(monkeypatch, capsys, tmp_path):
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else real(name))
    assert cli.main(["--out-dir", str(tmp_path)], {}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PyTorch is not installed" in err
    assert not list(tmp_path.iterdir())


def test_without_a_gpu_one_line_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    message = cli.missing_requirement(str(fake))
    assert "no CUDA GPU is visible to torch" in message and "\n" not in message


def test_a_bad_idle_release_setting_is_refused(capsys, tmp_path):
    environ = {"STREAMPOOL_IDLE_RELEASE": "2"}  # the library wants a unit too
    assert cli.main(["--out-dir", str(tmp_path), *STANDIN], environ) == 2
    assert "STREAMPOOL_IDLE_RELEASE='2'" in capsys.readouterr().err


def test_a_run_longer_than_the_budget_is_refused_before_it_starts(capsys, tmp_path):
    argv = ["--group", "models", "--budget-s", "60", "--out-dir", str(tmp_path), *STANDIN]
    assert cli.main(argv, {}) == 2
    assert "more than --budget-s 60" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def run_standin(out_dir, workloads="gpt2,churn", pairs="10", behaviour="", processes="1",
                extra=()):
    argv = ["--workloads", workloads, "--configs", "native-aa,streampool", "--pairs", pairs,
            "--block-s", "0.003", "--processes", processes, "--calibration", "none",
            "--out-dir", str(out_dir), *STANDIN, *extra]
    return cli.main(argv, {"BENCH_STANDIN": behaviour, "STREAMPOOL_IDLE_RELEASE": "off"})


def test_a_run_writes_its_results_and_report_and_prints_the_headline(tmp_path, capsys):
    assert run_standin(tmp_path, behaviour="streampool:fail=churn") == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (call,) = results["runs"]
    assert [w["workload"] for w in call["workloads"]] == ["churn", "gpt2"]
    assert "STREAMPOOL_IDLE_RELEASE=off python3 -m bench --workloads" in call["facts"]["command"]
    assert call["facts"]["idle_release_s"] is None
    built = json.loads((tmp_path / "report.json").read_text())
    assert built["workloads"]["gpt2"]["streampool"]["time"]["n"] == 10
    assert built["workloads"]["churn"]["streampool"]["failed"]
    out = capsys.readouterr().out
    assert out.startswith("## Headline") and "| `churn` (10 pairs) |" in out
    assert "**failed**" in out and "CUDA out of memory (stand-in)" in out
    assert (tmp_path / "report.md").read_text().startswith("# streampool benchmarks")


def test_merge_pools_the_calls_into_one_report(tmp_path, capsys):
    assert run_standin(tmp_path / "a", workloads="gpt2", pairs="6") == 0
    assert run_standin(tmp_path / "b", workloads="gpt2,churn", pairs="6") == 0
    merged = tmp_path / "merged"
    assert cli.main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out-dir",
                     str(merged)]) == 0
    built = json.loads((merged / "report.json").read_text())
    assert built["workloads"]["gpt2"]["streampool"]["time"]["n"] == 12
    assert built["workloads"]["churn"]["streampool"]["time"]["n"] == 6
    assert len(built["facts"]["commands"]) == 2
    again = tmp_path / "again"  # a merged directory merges again
    assert cli.main(["merge", str(merged), "--out-dir", str(again)]) == 0
    assert json.loads((again / "report.json").read_text())["workloads"] == built["workloads"]
    with pytest.raises(SystemExit, match="nowhere/results.json not found"):
        cli.main(["merge", str(tmp_path / "nowhere"), "--out-dir", str(again)])
    # as committed: the raw results compressed, merged the same (as a folder or as a file)
    raw = tmp_path / "a" / "results.json"
    packed = raw.with_name("results.json.gz")
    packed.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    for given in (tmp_path / "a", packed):
        out = tmp_path / "packed"
        assert cli.main(["merge", str(given), str(tmp_path / "b"), "--out-dir", str(out)]) == 0
        assert json.loads((out / "report.json").read_text())["workloads"] == built["workloads"]


def test_calibration_measures_the_aa_by_set_and_block_and_writes_the_runs_settings(
        tmp_path, capsys):
    written = tmp_path / "calibration-file.json"
    argv = ["calibrate", "--workloads", "gpt2,churn", "--blocks-s", "0.002,0.006", "--pairs",
            "4", "--processes", "3", "--out-dir", str(tmp_path), "--write", str(written),
            *STANDIN]
    assert cli.main(argv, {"BENCH_STANDIN": "native-aa:process_slow=1.3/1.0/0.8"}) == 0
    document = json.loads((tmp_path / "calibration.json").read_text())
    raw = document["groups"]["workloads"]
    assert [r["process_set"] for r in raw["records"]] == [0, 0, 1, 1, 2, 2]
    assert {b for r in raw["records"] for b in r["blocks"]} == {"0.002", "0.006"}
    assert len(raw["sets"]) == 3 and all(s["on"] == list(isolation.FEATURES) for s in raw["sets"])
    chosen = json.loads(written.read_text())
    assert set(chosen["workloads"]) == {"gpt2", "churn"}
    gpt2 = chosen["workloads"]["gpt2"]
    # native-aa is 30% slower in one set and 20% faster in another: the spread between
    # processes is what the plan has to beat, with the most process sets it may use
    assert gpt2["measured"]["between_sd"] > 0.15 and gpt2["processes"] >= 3
    assert chosen["groups"]["workloads"]["meets_bands"] is False
    text = (tmp_path / "calibration.md").read_text()
    assert text.count("| `gpt2` | all settings (3) |") == 2 and "pairs × sets" in text
    # the run takes the file's settings as its defaults
    run_argv = ["--workloads", "gpt2", "--configs", "native-aa", "--calibration", str(written),
                "--out-dir", str(tmp_path / "run"), "--budget-s", "0.001", *STANDIN]
    assert cli.main(run_argv, {}) == 2
    err = capsys.readouterr().err
    assert f"gpt2: {gpt2['processes']} process sets × {gpt2['pairs']} pairs of " \
        f"{gpt2['block_s']:g} s blocks (calibration " in err


def test_an_ablation_alternates_a_setting_and_writes_no_settings(tmp_path):
    written = tmp_path / "calibration-file.json"
    argv = ["calibrate", "--workloads", "churn", "--blocks-s", "0.003", "--pairs", "3",
            "--processes", "4", "--ablate", "pin", "--out-dir", str(tmp_path), "--write",
            str(written), *STANDIN]
    assert cli.main(argv, {}) == 0
    raw = json.loads((tmp_path / "calibration.json").read_text())["groups"]["workloads"]
    assert [s["off"] for s in raw["sets"]] == [["pin"], [], ["pin"], []]
    assert not written.exists()
    text = (tmp_path / "calibration.md").read_text()
    assert "| `churn` | all settings (2) |" in text and "| `churn` | without pin (2) |" in text


def test_process_sets_make_a_per_process_bias_widen_the_interval(tmp_path):
    # native-aa is 50% slower in the first set and 33% faster in the third: over one set (as
    # before) its A/A interval would exclude 1; over three it spans the sets, median near 1.
    # Steps and blocks 5 times the stand-in's, so that a busy machine's late wake-ups stay
    # small beside the biases (at 3 ms blocks and 20% biases they once hid them).
    assert run_standin(tmp_path, workloads="gpt2", pairs="8", processes="3",
                       behaviour="*:slow=5;native-aa:process_slow=1.5/1.0/0.67",
                       extra=("--block-s", "0.015")) == 0
    (call,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["process_set"] for r in call["workloads"]] == [0, 1, 2]
    assert [s["index"] for s in call["process_sets"]] == [0, 1, 2]
    aa = json.loads((tmp_path / "report.json").read_text())["aa"]["gpt2"]
    assert aa["processes"] == 3 and aa["n"] == 24
    assert aa["ci95"][0] < 0.85 and aa["ci95"][1] > 1.2 and 0.9 < aa["ratio"] < 1.1
    assert aa["between_sd"] > 0.15


def test_each_worker_runs_on_the_cpus_it_was_given_and_all_are_set_up_alike(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    names = ["native", "native-aa", "streampool"]
    assert run_standin(tmp_path, workloads="churn", pairs="2", processes="2") == 0
    (call,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    for index, process_set in enumerate(call["process_sets"]):
        assert process_set["on"] == list(isolation.FEATURES) and "placement" in process_set
        # set k hands the first CPU set to the k-th worker (rotate): no NVML here, all CPUs
        order = names[index:] + names[:index]
        given = affinity.gpu_placement(order, None, allowed).workers
        workers = process_set["workers"]
        assert {n: w["setup"]["cpus"] for n, w in workers.items()} == {
            n: affinity.format_cpulist(c) for n, c in given.items()} == process_set["cpus"]
        assert len({w["setup"]["fingerprint"] for w in workers.values()}) == 1
        assert {w["setup"]["hash_seed"] for w in workers.values()} == {"0"}
        no_aslr = bool(isolation.no_aslr_launcher())  # where this kernel lets setarch -R run
        assert {w["setup"]["aslr_off"] for w in workers.values()} == {no_aslr}
        assert process_set["setup_differs"] == []
        # every block of every pair ran on the set's one launch CPU, whichever worker ran it;
        # none where no core is spare for the parent (a 2-core machine)
        launch = process_set["launch_cpu"]
        if launch is None:
            assert "no launch CPU (none is spare)" in process_set["placement"]
            assert affinity.gpu_placement(order, None, allowed).parent == []
            continue
        assert all(launch not in affinity.parse_cpulist(w["setup"]["cpus"])
                   for w in workers.values())
        (record,) = [r for r in call["workloads"] if r["process_set"] == index]
        assert record["pairs"] and {p[side]["cpu"] for p in record["pairs"]
                                    for side in ("config_block", "ref_block")} == {launch}
    assert run_standin(tmp_path / "off", workloads="churn", pairs="2", processes="1",
                       extra=["--without", "pin,setup"]) == 0
    (call,) = json.loads((tmp_path / "off" / "results.json").read_text())["runs"]
    (process_set,) = call["process_sets"]
    assert process_set["off"] == ["pin", "setup"] and process_set.get("launch_cpu") is None
    assert {w["setup"]["cpus"] for w in process_set["workers"].values()} == {
        affinity.format_cpulist(allowed)}
    assert {w["setup"]["aslr_off"] for w in process_set["workers"].values()} == {False}


def test_reports_name_paths_relative_never_the_layout_of_the_machine_that_ran(tmp_path,
                                                                              monkeypatch):
    # Committed reports said `--out-dir /root/out/bench-alloc`: a folder of the machine that ran it.
    monkeypatch.chdir(tmp_path)
    assert portable.relative_paths(
        "STREAMPOOL_X=1 python3 -m bench --out-dir /root/out/a --calibration=/etc/c.json",
        Path("/root")) == "STREAMPOOL_X=1 python3 -m bench --out-dir out/a --calibration=../etc/c.json"
    assert run_standin(tmp_path / "runs" / "a", workloads="churn", pairs="2") == 0
    (call,) = json.loads((tmp_path / "runs" / "a" / "results.json").read_text())["runs"]
    assert "--out-dir runs/a " in call["facts"]["command"] and str(tmp_path) not in \
        call["facts"]["command"]
    # a run whose results.json names a folder of another machine: merge names where it read it
    moved = tmp_path / "bench" / "results" / "DATE" / "alloc"
    moved.mkdir(parents=True)
    raw = json.loads((tmp_path / "runs" / "a" / "results.json").read_text())
    raw["runs"][0]["facts"]["command"] = "python3 -m bench --group alloc --out-dir /root/out/x"
    (moved / "results.json").write_text(json.dumps(raw))
    assert cli.main(["merge", str(moved), str(tmp_path / "runs" / "a"), "--out-dir",
                     str(tmp_path / "bench" / "results" / "DATE")]) == 0
    built = json.loads((tmp_path / "bench" / "results" / "DATE" / "report.json").read_text())
    assert built["facts"]["commands"][0] == \
        "python3 -m bench --group alloc --out-dir bench/results/DATE/alloc"
    assert "--out-dir runs/a " in built["facts"]["commands"][1]  # typed relative, and there
    assert built["facts"]["merge_command"] == ("python3 -m bench merge bench/results/DATE/alloc "
                                               "runs/a --out-dir bench/results/DATE")
    text = (tmp_path / "bench" / "results" / "DATE" / "report.md").read_text()
    assert "/root/" not in text and str(tmp_path) not in text


def test_help_lists_every_command():
    text = arguments.commands_text()
    for command in ("python3 -m bench [--group G]", "python3 -m bench calibrate",
                    "python3 -m bench merge DIR... --out-dir OUT", "python3 -m bench noise DIR...",
                    "python3 -m bench headline [--check]"):
        assert command in text


def test_help_of_the_module_names_headline(capsys):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "bench", "--help"], capture_output=True,
                          text=True, cwd=Path(cli.__file__).resolve().parents[1])
    assert done.returncode == 0 and "python3 -m bench headline" in done.stdout, done.stderr


def fabricated_trials(monkeypatch):
    """The co-tenant's trials stood in for: one measured trial per configuration of A."""
    probe = {"idle_s": 3.0, "held_beyond_live_bytes": 2**29, "free_bytes": 2**36,
             "confirmed": True}

    def trials(names, environ, repeats=1):
        return [{"config": n, "round": 0, "probes": [probe], "live_bytes": 2**30,
                 "empty_cache_called": False} for n in names]

    monkeypatch.setattr(cotenant, "run_cotenant", trials)


@pytest.mark.parametrize("without_price", [False, True])
def test_the_cotenant_group_runs_its_trials_and_the_price_unless_told_not_to(
        tmp_path, monkeypatch, without_price):
    fabricated_trials(monkeypatch)
    argv = ["--group", "cotenant", "--pairs", "4", "--block-s", "0.003", "--processes", "1",
            "--calibration", "none", "--out-dir", str(tmp_path / "run"), *STANDIN]
    argv += ["--cotenant-without-price"] if without_price else []
    assert cli.main(argv, {"STREAMPOOL_IDLE_RELEASE": "off"}) == 0
    (call,) = json.loads((tmp_path / "run" / "results.json").read_text())["runs"]
    assert [t["config"] for t in call["cotenant"]] == list(COTENANT_NAMES)
    assert [w["workload"] for w in call["workloads"]] == ([] if without_price else ["gpt2"])
    if not without_price:
        return
    # The price run apart, as the option's help gives it, then merged: the report of the whole
    # group (its trials and its price on both backends).
    price = ["--workloads", "gpt2", "--configs", ",".join(PRICE_CONFIGS), "--pairs", "4",
             "--block-s", "0.003", "--processes", "1", "--calibration", "none",
             "--out-dir", str(tmp_path / "price"), *STANDIN]
    assert cli.main(price, {"STREAMPOOL_IDLE_RELEASE": "off"}) == 0
    assert cli.main(["merge", str(tmp_path / "run"), str(tmp_path / "price"), "--out-dir",
                     str(tmp_path / "merged")]) == 0
    built = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert set(built["cotenant"]) == set(COTENANT_NAMES)
    assert built["price"]["n"] == built["price_pool"]["n"] == 4

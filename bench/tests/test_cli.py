"""The command: options, what is missing in one line, a run, a calibration and a merge end to end
over stand-in workers, everything written under the test's tmp_path."""

import json

import pytest

from bench import cli, plan

STANDIN = ["--engine", "bench.tests.standin:StandinEngine"]


def test_defaults_are_every_group_every_configuration():
    options = cli.parse_args([])
    assert options.groups == list(plan.GROUP_NAMES) and options.pairs == plan.DEFAULT_PAIRS
    assert options.configs[:2] == ["native", "native-aa"] and "streampool-vmm" in options.configs
    assert options.block_s == plan.DEFAULT_BLOCK_S
    picked = cli.parse_args(["--group", "vision,alloc", "--configs", "streampool"])
    assert picked.groups == ["alloc", "vision"] and picked.configs == ["native", "streampool"]
    assert cli.parse_args(["calibrate"]).pairs == 20


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pairs", "0"], "--pairs '0': expected a positive number"),
        (["--group", "gpu"], "unknown group gpu"),
        (["--configs", "streampool-threshold-1GiB"], "paired with streampool: select it too"),
        (["--variant", "x:PATH=/"], "expected LABEL:STREAMPOOL_VAR=VALUE"),
        (["calibrate", "--blocks-s", "0.1,-1"], "--blocks-s '-1'"),
        (["merge"], "the following arguments are required: dirs"),
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


def run_standin(out_dir, workloads="gpt2,churn", pairs="10", behaviour=""):
    argv = ["--workloads", workloads, "--configs", "native-aa,streampool", "--pairs", pairs,
            "--block-s", "0.003", "--out-dir", str(out_dir), *STANDIN]
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


def test_calibration_reports_the_aa_spread_per_block_length(tmp_path, capsys):
    argv = ["calibrate", "--workloads", "gpt2", "--blocks-s", "0.002,0.006", "--pairs", "10",
            "--out-dir", str(tmp_path), *STANDIN]
    assert cli.main(argv, {}) == 0
    document = json.loads((tmp_path / "calibration.json").read_text())
    (record,) = document["records"]
    assert set(record["blocks"]) == {"0.002", "0.006"}
    summary = record["blocks"]["0.006"]["summary"]
    assert summary["n"] == 10 and summary["pairs_for_3pct"] >= 10 and summary["pair_s"] > 0
    text = (tmp_path / "calibration.md").read_text()
    assert text.count("| `gpt2` |") == 2 and "★" in text

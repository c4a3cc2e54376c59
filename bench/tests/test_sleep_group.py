"""The ``sleep`` group of ``python3 -m bench``: it runs bench/sleep.py's configurations (children
stood in for by fabricated records), and its figures reach results.json, the report, and the
README's first screen and BENCHMARKS.md through the headline."""

import json

from bench import cli, headline, plan, sleep, sleep_report
from bench.tests.test_cli import STANDIN
from bench.tests.test_headline import copy_of_the_repository
from bench.tests.test_sleep_report import fabricated_report


def fabricated_children(monkeypatch):
    records = fabricated_report()["records"]
    ran = []

    def child(config, out_dir, env, timeout_s):
        ran.append(config)
        return dict(records[config], wall_s=1.0)

    monkeypatch.setattr(sleep, "run_child", child)
    return ran


def test_the_group_runs_its_configurations_and_its_figures_reach_the_report(
        tmp_path, monkeypatch):
    ran = fabricated_children(monkeypatch)
    argv = ["--group", "sleep", "--calibration", "none", "--out-dir", str(tmp_path), *STANDIN]
    assert cli.main(argv, {"STREAMPOOL_IDLE_RELEASE": "off"}) == 0
    assert ran == list(plan.SLEEP_CONFIGS)
    (call,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["config"] for r in call["sleep"]["rows"]] == list(plan.SLEEP_CONFIGS)
    assert "records" not in call["sleep"], "the raw records stay in sleep/sleep.json"
    assert "python3 -m bench --group sleep" in call["sleep"]["meta"]["command"]
    assert (tmp_path / "sleep" / "sleep.md").read_text().startswith("# Sleep and wake")
    built = json.loads((tmp_path / "report.json").read_text())
    assert built["sleep"]["rows"] == call["sleep"]["rows"]
    written = (tmp_path / "report.md").read_text()
    line = sleep_report.summary_lines(call["sleep"])[1]
    assert line.startswith("streampool-vmm: held") and f"- {line}" in written


def test_the_calibration_leaves_the_group_out():
    assert "sleep" in cli.parse_args([]).groups
    assert "sleep" not in cli.parse_args(["calibrate"]).groups


def test_the_first_screen_sentence_names_streampool_s_figures_and_torch_memory_saver_s():
    report = fabricated_report()
    text = sleep_report.headline_text(report)
    assert text == (
        "`streampool.sleep()` on `vmm`, with GPT-2's training state (5.59 GiB of tensors), gave "
        "back 99.5% of the allocator's memory, slept in 0.15 s (its host buffer pinned ahead by "
        "`streampool.reserve_sleep_buffer()`; 0.12 s without) and woke in 0.15 s, every tensor "
        "bit for bit the same after; torch_memory_saver gave back 97.5% of the allocator's "
        "memory, slept in 0.50 s and woke in 0.40 s.")
    plain = [r for r in report["rows"] if r["config"] == sleep_report.STREAMPOOL]
    plain[0]["ok"] = False
    assert "; 0.12 s without)" not in sleep_report.headline_text(report), "a failed plain row"
    others = [r for r in report["rows"] if r["config"] not in sleep_report.STREAMPOOLS]
    reserved = dict(plain[0], config=sleep_report.STREAMPOOL_RESERVED, ok=True)
    report["rows"] = others + [reserved]
    text = sleep_report.headline_text(report)
    assert "pinned ahead by `streampool.reserve_sleep_buffer()`)" in text, "no plain row: no time"
    report["rows"] = others + [dict(reserved, config=sleep_report.STREAMPOOL)]
    assert "slept in 0.12 s and woke" in sleep_report.headline_text(report), "plain: no note"
    for row in report["rows"]:
        if row["config"] in sleep_report.STREAMPOOLS:
            row["ok"] = False
    assert sleep_report.headline_text(report) is None, "no figure from a run that failed"
    assert sleep_report.headline_text({}) is None


def test_a_run_with_the_group_puts_the_sentence_on_the_first_screen(tmp_path):
    run = copy_of_the_repository(tmp_path)
    report_path = tmp_path / run.folder / headline.REPORT_FILE
    report = json.loads(report_path.read_text())
    slept = {k: v for k, v in fabricated_report().items() if k != "records"}
    report["sleep"] = slept
    report_path.write_text(json.dumps(report))
    assert headline.main([], root=tmp_path) == 0
    readme = (tmp_path / "README.md").read_text()
    assert f"- {sleep_report.headline_text(slept)}" in readme
    benchmarks = (tmp_path / "BENCHMARKS.md").read_text()
    assert f"- {sleep_report.summary_lines(slept)[1]}" in benchmarks


def test_a_configuration_that_failed_is_listed_with_the_run_s_failures(tmp_path, monkeypatch):
    records = fabricated_report()["records"]
    failed = dict(records["tms-torch"], config="tms")  # as a child without the package ends

    def child(config, out_dir, env, timeout_s):
        return dict(failed if config == "tms" else records[config], wall_s=1.0)

    monkeypatch.setattr(sleep, "run_child", child)
    argv = ["--group", "sleep", "--calibration", "none", "--out-dir", str(tmp_path), *STANDIN]
    assert cli.main(argv, {"STREAMPOOL_IDLE_RELEASE": "off"}) == 0
    written = (tmp_path / "report.md").read_text()
    assert "- sleep (stage allocator) × `tms`:" in written and "ImportError: no tms" in written
    built = json.loads((tmp_path / "report.json").read_text())
    text = sleep_report.headline_text(built["sleep"])
    assert text and "torch_memory_saver" not in text, "no figure of a row that failed"


def test_a_run_of_the_group_alone_prints_its_lines_not_an_empty_headline(
        tmp_path, monkeypatch, capsys):
    fabricated_children(monkeypatch)
    argv = ["--group", "sleep", "--calibration", "none", "--out-dir", str(tmp_path), *STANDIN]
    assert cli.main(argv, {"STREAMPOOL_IDLE_RELEASE": "off"}) == 0
    out = capsys.readouterr().out
    assert "## Headline" not in out and "no worker started CUDA" not in out
    report = json.loads((tmp_path / "report.json").read_text())["sleep"]
    assert out.rstrip().endswith(f"- {sleep_report.summary_lines(report)[-1]}")

"""The parent's process plumbing with fake children: running a process, reading its messages,
and the repeats (rotation, one process per configuration per repeat, settled configurations,
the time budget)."""

import json
import sys
import textwrap

from bench import protocol, runner


def marker(kind, **fields):
    return protocol.RESULT_MARKER + json.dumps({"kind": kind, **fields})


def outcome(stdout="", stderr="", failure=None):
    return runner.ChildOutcome(stdout, stderr, failure, 1.5)


def test_child_output_is_read_from_marker_lines_only():
    stdout = "\n".join(
        [
            "some library chatter",
            marker("info", info={"device": "GPU X"}),
            marker("workload", workload="empty_1KiB", record={"host_time_s": 2.0}),
            marker("workload", workload="gpt2", record={"error": "OutOfMemoryError: boom"}),
        ]
    )
    result = runner.parse_child_output(outcome(stdout), ["empty_1KiB", "gpt2", "bert"])
    assert result == {
        "status": "ok",
        "info": {"device": "GPU X"},
        "workloads": {
            "empty_1KiB": {"host_time_s": 2.0},
            "gpt2": {"error": "OutOfMemoryError: boom"},
            "bert": {"error": "the child printed no result for it"},
        },
        "wall_s": 1.5,
    }


def test_skipped_and_setup_errors_mark_every_workload():
    skipped = runner.parse_child_output(
        outcome(marker("skipped", reason="rmm is not importable (nope)")), ["churn", "gpt2"]
    )
    assert skipped["status"] == "skipped"
    assert skipped["workloads"]["gpt2"] == {"error": "skipped: rmm is not importable (nope)"}
    rejected = runner.parse_child_output(
        outcome(marker("setup_error", reason="StreampoolError: STREAMPOOL_BACKEND=vmm: unknown")),
        ["churn"],
    )
    assert rejected["status"] == "setup_error"
    assert rejected["workloads"]["churn"] == {
        "error": "StreampoolError: STREAMPOOL_BACKEND=vmm: unknown"
    }


def test_a_crashed_child_keeps_finished_workloads_and_blames_the_rest():
    crashed = outcome(
        marker("workload", workload="churn", record={"host_time_s": 5.0}),
        "Traceback ...\nSegmentation fault\n",
        "child exited with status -11",
    )
    result = runner.parse_child_output(crashed, ["churn", "gpt2"])
    assert result["status"] == "failed"
    assert result["process_failure"] == "child exited with status -11"
    assert result["workloads"]["churn"] == {"host_time_s": 5.0}
    error = result["workloads"]["gpt2"]["error"]
    assert (
        error.startswith("child exited with status -11: Traceback")
        and "Segmentation fault" in error
    )


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
    result = runner.run_process(command, {}, 30, "label")
    assert (result.stdout, result.stderr_tail, result.failure) == (
        "out line\n",
        "progress line\n",
        None,
    )
    assert 0 < result.wall_s < 30
    assert "label| progress line" in capsys.readouterr().err


def test_run_process_reports_exit_status_and_timeout(tmp_path):
    failing = write_script(tmp_path, "import sys; print('why', file=sys.stderr); sys.exit(3)")
    assert runner.run_process(failing, {}, 30, "x").failure == "child exited with status 3"
    sleeping = write_script(tmp_path, "import time; time.sleep(60)")
    assert runner.run_process(sleeping, {}, 0.5, "x").failure == "child timed out after 0.5 s"


def ok_child(workloads):
    return {
        "status": "ok",
        "info": {},
        "workloads": {w: {"host_time_s": 1.0} for w in workloads},
        "wall_s": 1.0,
    }


def test_each_repeat_starts_every_configuration_once_in_rotated_order():
    configs = ["native", "native-aa", "streampool", "streampool-nocache"]
    workloads = {c: ["churn", "gpt2"] for c in configs}
    workloads["streampool-nocache"] = ["churn"]
    calls = []

    def fake(config, names, label):
        calls.append((config, tuple(names)))
        return ok_child(names)

    repeats = runner.run_repeats(configs, workloads, 8, fake)
    assert len(repeats.runs) == 8 and repeats.stop_reason is None
    assert repeats.orders[0] == configs
    assert repeats.orders[1] == ["native-aa", "streampool", "streampool-nocache", "native"]
    assert [c for c, _ in calls] == [c for order in repeats.orders for c in order]
    assert ("streampool-nocache", ("churn",)) in calls
    first_positions = {order[0] for order in repeats.orders}
    assert first_positions == set(configs)  # no configuration is always first (or always last)
    assert all(set(run) == set(configs) for run in repeats.runs)


def test_skipped_or_rejected_configurations_are_not_started_again():
    calls = []

    def fake(config, names, label):
        calls.append(config)
        if config == "rmm-pool":
            return {
                "status": "skipped",
                "info": {},
                "workloads": {w: {"error": "skipped: no"} for w in names},
            }
        if config == "streampool-vmm":
            return {
                "status": "setup_error",
                "info": {},
                "workloads": {w: {"error": "rejected"} for w in names},
            }
        if config == "streampool":
            return {
                "status": "failed",
                "info": {},
                "workloads": {w: {"error": "crash"} for w in names},
            }
        return ok_child(names)

    configs = ["native", "streampool", "streampool-vmm", "rmm-pool"]
    repeats = runner.run_repeats(configs, {c: ["churn"] for c in configs}, 3, fake)
    assert calls.count("rmm-pool") == 1 and calls.count("streampool-vmm") == 1
    assert calls.count("streampool") == 3  # a crash may be chance: tried again next repeat
    assert all(run["rmm-pool"]["status"] == "skipped" for run in repeats.runs)
    assert all(run["streampool-vmm"]["status"] == "setup_error" for run in repeats.runs)


class FakeClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self):
        return self.now_s


def test_no_repeat_starts_that_would_end_past_the_time_budget():
    clock = FakeClock()
    seen = []
    child_s = iter([50.0, 50.0] + [30.0] * 20)  # the first repeat's children start cold

    def fake(config, names, label):
        clock.now_s += next(child_s)
        return ok_child(names)

    repeats = runner.run_repeats(
        ["native", "streampool"],
        {"native": ["churn"], "streampool": ["churn"]},
        8,
        fake,
        time_budget_s=250.0,
        started_s=-20.0,
        clock=clock,
        on_repeat=lambda partial: seen.append(len(partial.runs)),
    )
    # 20 s spent before; repeat 1 ends at 120 s (cold), 2 at 180 s, 3 at 240 s; a fourth would
    # end at 300 s. (Judged by the longest repeat, 100 s, the third would not have started.)
    assert len(repeats.runs) == 3 and seen == [1, 2, 3]
    assert repeats.stop_reason.startswith("time budget: 3 of 8 repeats ran in 240 s")
    unlimited = runner.run_repeats(["native"], {"native": ["churn"]}, 8, fake, clock=clock)
    assert len(unlimited.runs) == 8 and unlimited.stop_reason is None

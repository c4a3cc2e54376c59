"""The profile diagnostic's reading of a trace, and the diagnostics' configurations: a GPU gap is
split by the time each host call covers of it, and a variant is streampool's variables with a
backend, under a name of its own."""

import json
import sys

import pytest

from bench.tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import diag_configs  # noqa: E402
import diag_profile  # noqa: E402


def x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_a_gap_is_split_by_the_time_each_call_covers(tmp_path):
    trace = tmp_path / "t.json"
    events = [
        x("kernel", "a", 0, 10), x("kernel", "b", 30, 10), x("kernel", "a", 35, 10),
        x("cuda_runtime", "cudaLaunchKernel", 9, 2), x("cuda_driver", "cuMemSetAccess", 12, 16),
        x("kernel", "c", 100, 2), x("cpu_op", "aten::empty_strided", 50, 4),
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 500},
    ]
    trace.write_text(json.dumps({"traceEvents": events}))
    found = diag_profile.read_trace(str(trace), steps=2)
    # busy: [0,10] + [30,45] + [100,102] = 27 us; two gaps, 20 and 55 us; per step, in ms
    assert found["gpu_busy_ms"] == pytest.approx(27 / 2e3)
    assert found["kernel_sum_ms"] == pytest.approx(32 / 2e3)
    assert found["gap_ms"] == pytest.approx(75 / 2e3)
    # gap [10, 30]: the launch covers 1 us of it, the set-access 16, nothing the other 3; gap
    # [45, 100]: nothing
    assert found["gaps_by_call_ms"] == pytest.approx(
        {"(host code)": 58 / 2e3, "cuMemSetAccess": 16 / 2e3, "cudaLaunchKernel": 1 / 2e3}
    )
    assert found["kernels"]["a"] == pytest.approx([1.0, 20 / 2e3])
    assert found["ops"]["aten::empty_strided"] == pytest.approx([0.5, 4 / 2e3])
    assert list(found["calls"]) == ["cuMemSetAccess", "cudaLaunchKernel"]


def test_gaps_under_the_floor_are_not_idle_time(tmp_path):
    trace = tmp_path / "t.json"
    events = [x("kernel", "a", 0, 10), x("kernel", "a", 10 + diag_profile.GAP_FLOOR_US, 1)]
    trace.write_text(json.dumps({"traceEvents": events}))
    assert diag_profile.read_trace(str(trace), steps=1)["gap_ms"] == 0


def test_variants_name_streampool_variables_only(monkeypatch):
    variant = "still:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER=off"
    monkeypatch.setenv("DIAG_VARIANTS", variant)
    monkeypatch.setenv("DIAG_CONFIGS", "native,still,expandable")
    configs = diag_configs.chosen()
    assert list(configs) == ["native", "still", "expandable"]
    assert configs["still"] == {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_VMM_COLD_AFTER": "off"}
    assert not diag_configs.uses_streampool("expandable") and diag_configs.uses_streampool("still")
    for bad in (
        "still:PYTORCH_CUDA_ALLOC_CONF=x",
        ":STREAMPOOL_BACKEND=vmm",
        "still:",
        "still:STREAMPOOL_VMM_COLD_AFTER=off",  # no backend: the default would run
        "still:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER",  # no value
        "vmm:STREAMPOOL_BACKEND=pool",  # a base configuration's name
    ):
        with pytest.raises(SystemExit):
            diag_configs.variants(bad)


def test_a_timed_round_gives_milliseconds_a_step_and_runs_every_step():
    import diag_steps

    ran = []

    class TimingEvent:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            pass

        def elapsed_time(self, other):
            return 30.0  # milliseconds between the round's two events

    class Cuda:
        Event = TimingEvent

        @staticmethod
        def synchronize():
            ran.append("sync")

    class Torch:
        cuda = Cuda

    wall, cpu, gpu = diag_steps.timed_round(Torch, ran.append, [1, 2, 3])
    assert ran == [1, 2, 3, "sync"]
    assert gpu == 10.0 and wall >= 0 and cpu >= 0


def test_a_child_runs_pinned_with_its_configuration_and_the_root_on_the_path(monkeypatch):
    variant = "still:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER=off"
    monkeypatch.setenv("DIAG_VARIANTS", variant)
    runs = []

    def run(argv, env, check):
        runs.append((argv, env))

    monkeypatch.setattr(diag_configs.subprocess, "run", run)
    diag_configs.run_child("x.py", "still", ["vision_sizes"])
    (argv, env), = runs
    assert argv[0] == "taskset" and argv[4:] == ["x.py", "--child", "still", "vision_sizes"]
    assert env["STREAMPOOL_VMM_COLD_AFTER"] == "off" and env["STREAMPOOL_BACKEND"] == "vmm"
    assert str(ROOT) in env["PYTHONPATH"].split(":")

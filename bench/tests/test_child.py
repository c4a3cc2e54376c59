"""The child's measurement loop with a fake torch: only timed steps are summed, on both clocks,
and memory is the peak of (free at start - free after each step), warm-up included."""

from types import SimpleNamespace

import pytest

from bench import child
from bench import schedules as s


class FakeClock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self):
        return self.now_s


class FakeEvent:
    """Records the fake clock; elapsed_time is in milliseconds, as CUDA's, plus a fixed GPU lag."""

    def __init__(self, clock, gpu_extra_ms):
        self.clock, self.gpu_extra_ms, self.at_s = clock, gpu_extra_ms, None

    def record(self):
        self.at_s = self.clock()

    def elapsed_time(self, end):
        return (end.at_s - self.at_s) * 1e3 + self.gpu_extra_ms


def fake_torch(clock, free_bytes_after_steps, gpu_extra_ms=0.5):
    free = iter(free_bytes_after_steps)
    cuda = SimpleNamespace(
        synchronize=lambda: None,
        Event=lambda enable_timing: FakeEvent(clock, gpu_extra_ms),
        mem_get_info=lambda: (next(free), 80_000),
    )
    return SimpleNamespace(cuda=cuda)


def test_only_timed_steps_are_summed_on_both_clocks(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(child.time, "perf_counter", clock)

    def step(seconds):
        clock.now_s += seconds

    schedule = s.Schedule(
        steps=(5.0, 7.0, 0.25, 0.5, 1.0), warmup=2, units=(1, 1, 2, 4, 8), unit="token"
    )
    torch = fake_torch(clock, [900, 400, 700, 800, 600])
    measured = child.time_schedule(torch, step, schedule, "cuda", start_free_bytes=1000)
    assert measured["host_time_s"] == pytest.approx(1.75)  # not the 12 s of warm-up
    assert measured["gpu_time_s"] == pytest.approx(1.75 + 3 * 0.0005)
    assert measured["peak_device_bytes"] == 600  # after the second (warm-up) step
    assert (measured["timed_steps"], measured["units"], measured["unit"]) == (3, 14, "token")


def test_on_the_cpu_gpu_time_is_host_time_and_memory_is_not_read(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(child.time, "perf_counter", clock)

    def step(seconds):
        clock.now_s += seconds

    schedule = s.Schedule(steps=(1.0, 2.0), warmup=1, units=(1, 1), unit="step")
    measured = child.time_schedule(None, step, schedule, "cpu", start_free_bytes=0)
    assert measured["host_time_s"] == measured["gpu_time_s"] == pytest.approx(2.0)
    assert measured["peak_device_bytes"] == 0


def test_record_text_reads_per_unit():
    record = {
        "host_time_s": 0.5,
        "gpu_time_s": 0.25,
        "units": 100,
        "unit": "sample",
        "peak_device_bytes": 3 * 2**20,
    }
    assert child.record_text(record) == "5.000 ms/sample (GPU 2.500), peak device used 3.0 MiB"
    assert child.record_text({"error": "boom"}) == "failed: boom"


def test_only_pytorchs_caching_allocator_reports_live_bytes():
    calls = []
    cuda = SimpleNamespace(
        reset_peak_memory_stats=lambda: calls.append("reset"),
        memory_allocated=lambda: 100,
        max_memory_allocated=lambda: 1100,
    )
    torch = SimpleNamespace(cuda=cuda)
    assert child.start_live_tracking(torch, "native", "native")() == {"peak_live_bytes": 1000}
    assert calls == ["reset"]
    assert child.start_live_tracking(torch, "native", "cudaMallocAsync")() == {}  # torch-async
    assert child.start_live_tracking(torch, "rmm-pool", "pluggable")() == {}
    assert calls == ["reset"]


def messages_of(capsys):
    from bench import protocol

    return list(protocol.messages(capsys.readouterr().out))


def test_a_failing_workload_loses_no_other(monkeypatch, capsys):
    fake = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None))
    monkeypatch.setattr(child, "set_up", lambda base, backend: (fake, 0, {"device": "Fake"}))

    def run_workload(torch, base, backend, workload, baseline_free_bytes):
        if workload == "bert":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return {
            "host_time_s": 1.0,
            "gpu_time_s": 1.0,
            "units": 2,
            "unit": "step",
            "peak_device_bytes": 0,
        }

    monkeypatch.setattr(child, "run_workload", run_workload)
    assert child.child_main("native", "native", ["churn", "bert", "gpt2"]) == 0
    kinds = [(m["kind"], m.get("workload")) for m in messages_of(capsys)]
    assert kinds == [
        ("info", None),
        ("workload", "churn"),
        ("workload", "bert"),
        ("workload", "gpt2"),
    ]


def test_set_up_failures_are_reported_not_raised(monkeypatch, capsys):
    def skipped(base, backend):
        raise child.Skipped("rmm is not importable (no)")

    monkeypatch.setattr(child, "set_up", skipped)
    assert child.child_main("rmm-pool", "pluggable", ["churn"]) == 0
    assert messages_of(capsys) == [{"kind": "skipped", "reason": "rmm is not importable (no)"}]

    def rejected(base, backend):
        raise RuntimeError("this streampool does not read STREAMPOOL_BACKEND")

    monkeypatch.setattr(child, "set_up", rejected)
    assert child.child_main("streampool", "pluggable", ["churn"]) == 0
    assert messages_of(capsys) == [
        {
            "kind": "setup_error",
            "reason": "RuntimeError: this streampool does not read STREAMPOOL_BACKEND",
        }
    ]

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

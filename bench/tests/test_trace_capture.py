"""The trace converter and generator on the CPU (no torch): a made-up snapshot in the shape of
``torch.cuda.memory._snapshot()`` (PyTorch 2.11: ``device_traces[device]`` is a list of
``{"action", "addr", "size", "stream", ...}``), the sentinel markers, churn's generated trace
against the committed one, and the wrappers over a fake torch."""

import gzip
import sys
import types
from pathlib import Path

import pytest

from bench import schedules as s
from bench import trace_capture as tc

SIDE = 0x7F00AB  # a side stream's raw cudaStream_t
TRACES = Path(__file__).resolve().parents[1] / "traces"


def alloc(addr, size, stream=0, time_us=None):
    entry = {"action": "alloc", "addr": addr, "size": size, "stream": stream, "frames": []}
    if time_us is not None:
        entry["time_us"] = time_us
    return entry


def free(addr, size=0, stream=0):
    return [
        {"action": "free_requested", "addr": addr, "size": size, "stream": stream},
        {"action": "free_completed", "addr": addr, "size": size, "stream": stream},
    ]


def sentinel(addr):
    return [alloc(addr, tc.SENTINEL_BYTES)] + free(addr, tc.SENTINEL_BYTES)


def snapshot(entries, device=0):
    traces = [[] for _ in range(device + 1)]
    traces[device] = entries
    return {"segments": [], "device_traces": traces}


def test_converter_turns_history_and_sentinels_into_events():
    markers = [
        ("begin", 0x100, None, None),
        ("w", 0x100, SIDE, 0),
        ("r", 0x100, 0x1000, SIDE),
        ("s", 0x300, None, None),
        ("x", 0x100, None, None),
    ]
    entries = (
        sentinel(0x100)
        + free(0x999)[:1]  # allocated before recording started
        + [{"action": "segment_alloc", "addr": 0x5000000, "size": 2 << 20, "stream": 0}]
        + [alloc(0x1000, 4096), alloc(0x2000, 8192, SIDE)]
        + sentinel(0x100)  # wait_stream(side, default)
        + sentinel(0x100)  # record_stream(0x1000's tensor, side)
        + [alloc(0x100, tc.SENTINEL_BYTES)]  # a real block of the sentinel's size, not next
        + free(0x1000)
        + sentinel(0x300)
        + free(0x100)[:1]
        + sentinel(0x100)
        + free(0x2000, stream=SIDE)
    )
    conv = tc.convert(snapshot(entries, device=1), markers, device=1)
    assert conv.events == [
        ("a", 1, 4096, 0),
        ("a", 2, 8192, 1),
        ("w", 1, 0),
        ("r", 1, 1),
        ("a", 3, tc.SENTINEL_BYTES, 0),
        ("f", 1),
        ("s",),
        ("f", 3),
        ("x",),
        ("f", 2),
    ]
    assert conv.skipped == {"frees of allocations made before recording": 1}
    assert tc.summarize(conv.events) == {
        "events": 10,
        "allocations": 3,
        "steps": 1,
        "peak_live_bytes": 4096 + 8192 + tc.SENTINEL_BYTES,
    }


def test_converter_keeps_the_history_times_relative_to_the_first_event():
    markers = [("s", 0x300, None, None)]
    entries = [
        alloc(0x1000, 64, time_us=1_000_000),
        {"action": "free_requested", "addr": 0x1000, "size": 64, "stream": 0, "time_us": 1_000_040},
        alloc(0x300, tc.SENTINEL_BYTES, time_us=1_000_900),  # the sync returned at +900
        alloc(0x2000, 64, time_us=1_000_899),  # an approximate clock may step back a little
    ]
    conv = tc.convert(snapshot(entries), markers, device=0)
    assert conv.events == [("a", 1, 64, 0), ("f", 1), ("s",), ("a", 2, 64, 0)]
    assert conv.relative_times_us() == [0, 40, 900, 900]
    untimed = tc.convert(snapshot([alloc(0x1000, 64), alloc(0x2000, 64, time_us=5)]), [], 0)
    assert untimed.relative_times_us() is None, "one entry without a time: no times at all"


def test_timed_trace_is_format_2_with_a_time_on_every_event(tmp_path):
    path = tmp_path / "t.trace.gz"
    tc.write_trace(path, ["workload t"], [("a", 1, 64, 0), ("f", 1), ("s",)], [0, 7, 30])
    text = gzip.decompress(path.read_bytes()).decode()
    assert text.splitlines()[0] == f"# {tc.FORMAT_TIMED}"
    assert text.endswith("a 1 64 0 @0\nf 1 @7\ns @30\n")
    with pytest.raises(ValueError, match="2 times for 3 events"):
        tc.write_trace(path, [], [("a", 1, 64, 0), ("f", 1), ("s",)], [0, 7])


def test_a_lost_marker_is_an_error_not_a_shorter_trace():
    markers = [("begin", 0x100, None, None), ("x", 0x200, None, None)]
    with pytest.raises(ValueError, match="holds 1 of the 2 markers.*max_entries"):
        tc.convert(snapshot(sentinel(0x100) + [alloc(0x1000, 64)]), markers, device=0)


def test_record_stream_of_memory_from_before_recording_is_counted_and_left_out():
    markers = [("r", 0x100, 0xDEAD, SIDE)]
    conv = tc.convert(snapshot([alloc(0x1000, 64)] + sentinel(0x100)), markers, device=0)
    assert conv.events == [("a", 1, 64, 0)]
    assert conv.skipped == {"record_stream of memory not allocated while recording": 1}


def test_churn_events_follow_the_schedule_and_the_window():
    events = tc.churn_events()
    schedule = s.build_schedule("churn")
    sizes = [size for step in schedule.steps for size in step]
    assert [e[2] for e in events if e[0] == "a"] == sizes
    live, most = set(), 0
    for e in events:
        if e[0] == "a":
            live.add(e[1])
        elif e[0] == "f":
            live.remove(e[1])
        most = max(most, len(live))
    assert most == s.CHURN_WINDOW + 1  # the newest is allocated before the oldest goes
    assert len(live) == s.CHURN_WINDOW
    assert tc.summarize(events)["steps"] == len(schedule.steps)
    assert events[0] == ("s",) and events[-2:] == [("s",), ("x",)]


def test_committed_churn_trace_is_the_schedules():
    lines = gzip.decompress((TRACES / "churn.trace.gz").read_bytes()).decode().splitlines()
    events = [line for line in lines if not line.startswith("#")]
    assert events == [tc.format_event(e) for e in tc.churn_events()], (
        "bench/traces/churn.trace.gz is stale: regenerate it with "
        "python3 -m bench.trace_capture --generate"
    )
    assert "# workload churn" in lines


def test_checkerboard_events_leave_holes_the_large_tensor_fits_none_of():
    free, total = 100 * tc.CHECKER_BYTES, 120 * tc.CHECKER_BYTES
    count, big = tc.checkerboard_sizes(free, total)
    assert count == int(100 * tc.CHECKER_FILL) and big > tc.CHECKER_BYTES
    events = tc.checkerboard_events(free, total)
    live, holes = set(), 0
    for e in events:
        if e[0] == "a" and e[2] == big:
            holes = sum(1 for i in range(1, count + 1) if i not in live)
            assert holes == (count + 1) // 2, "every other tensor freed before the large one"
        if e[0] == "a":
            live.add(e[1])
        elif e[0] == "f":
            live.remove(e[1])
    assert holes and not live, "the large one was allocated, and everything is freed at the end"
    last_frees = [e[1] for e in events if e[0] == "f"][-((count) // 2) :]
    assert last_frees == sorted(last_frees, reverse=True), "clear() frees the list's end first"
    assert tc.summarize(events)["steps"] == 1


def test_committed_checkerboard_trace_is_the_generated_one():
    lines = gzip.decompress((TRACES / "checkerboard.trace.gz").read_bytes()).decode()
    events = [line for line in lines.splitlines() if not line.startswith("#")]
    board = tc.checkerboard_events(tc.CARD_FREE_BYTES, tc.CARD_TOTAL_BYTES)
    assert events == [tc.format_event(e) for e in board], (
        "bench/traces/checkerboard.trace.gz is stale: regenerate it with "
        "python3 -m bench.trace_capture --generate"
    )
    assert f"# device_total_bytes {tc.CARD_TOTAL_BYTES}" in lines.splitlines()


def test_written_trace_is_reproducible_and_carries_its_summary(tmp_path):
    events = [("a", 1, 100, 0), ("a", 2, 50, 3), ("r", 1, 3), ("f", 1), ("w", 0, 3), ("x",)]
    first, second = tmp_path / "one.trace.gz", tmp_path / "two.trace.gz"
    summary = tc.write_trace(first, ["workload test"], events)
    tc.write_trace(second, ["workload test"], events)
    assert first.read_bytes() == second.read_bytes()
    assert summary["peak_live_bytes"] == 150
    text = gzip.decompress(first.read_bytes()).decode()
    assert text.splitlines()[:2] == [f"# {tc.FORMAT}", "# workload test"]
    assert "# peak_live_bytes 150\n" in text
    assert text.endswith("a 1 100 0\na 2 50 3\nr 1 3\nf 1\nw 0 3\nx\n")


class FakeTorch:
    """What Recorder touches: empty(), Tensor.record_stream, cuda.Stream.wait_stream and
    cuda.synchronize, each logging its calls."""

    def __init__(self):
        self.calls = []
        self.next_addr = 0x1000
        fake = self

        class Tensor:
            def __init__(self, addr):
                self.addr = addr

            def record_stream(self, stream):
                fake.calls.append(("record_stream", self.addr, stream.cuda_stream))

            def data_ptr(self):
                return self.addr

            def untyped_storage(self):
                return types.SimpleNamespace(data_ptr=lambda: self.addr)

        class Stream:
            def __init__(self, raw):
                self.cuda_stream = raw

            def wait_stream(self, other):
                fake.calls.append(("wait_stream", self.cuda_stream, other.cuda_stream))

        def synchronize(device=None):
            fake.calls.append(("synchronize", device))

        self.Tensor, self.uint8 = Tensor, "uint8"
        self.cuda = types.SimpleNamespace(Stream=Stream, synchronize=synchronize)

    def empty(self, size, dtype, device):
        assert (size, dtype, device) == (tc.SENTINEL_BYTES, "uint8", "cuda")
        self.next_addr += 0x100
        return self.Tensor(self.next_addr)


def test_wrappers_call_the_originals_and_note_their_arguments():
    torch = FakeTorch()
    recorder = tc.Recorder(torch)
    recorder.install()
    side, main = torch.cuda.Stream(SIDE), torch.cuda.Stream(0)
    tensor = torch.Tensor(0x42)
    side.wait_stream(main)
    tensor.record_stream(side)
    torch.cuda.synchronize()
    assert torch.calls == [
        ("wait_stream", SIDE, 0),
        ("record_stream", 0x42, SIDE),
        ("synchronize", None),
    ]
    assert recorder.markers == [
        ("w", 0x1100, SIDE, 0),
        ("r", 0x1200, 0x42, SIDE),
        ("s", 0x1300, None, None),
    ]


def test_options_are_checked():
    with pytest.raises(SystemExit):
        tc.parse_args(["--workloads", "churn,gpt3"])
    with pytest.raises(SystemExit):
        tc.parse_args(["--timeout-s", "0"])
    assert tc.parse_args(["--workloads", "gpt2, bert"]).names == ["gpt2", "bert"]


class FakeAllocatingTorch(FakeTorch):
    """A fake torch whose allocator records history as PyTorch's does: empty() is an ``alloc``
    entry, dropping the last reference a ``free_requested`` + ``free_completed``."""

    def __init__(self):
        super().__init__()
        entries = []
        base_tensor = self.Tensor

        class Block(base_tensor):
            def __init__(self, addr, size):
                super().__init__(addr)
                self.size = size
                entries.append(alloc(addr, size))

            def fill_(self, value):
                return self

            def __del__(self):
                entries.extend(free(self.addr, self.size))

        self.Block = Block
        self.__version__ = "fake"
        memory = types.SimpleNamespace(
            _record_memory_history=lambda **options: None,
            _snapshot=lambda: snapshot(list(entries)),
        )
        self.cuda.memory = memory
        self.cuda.init = lambda: None
        self.cuda.current_device = lambda: 0
        self.cuda.get_device_name = lambda: "fake"
        self.cuda.max_memory_allocated = lambda: 0
        self.cuda.mem_get_info = lambda: (60 * 2**30, 80 * 2**30)
        self.cuda.get_device_properties = lambda index: types.SimpleNamespace(uuid="")

    def empty(self, size, dtype, device):
        self.next_addr += 0x100000
        return self.Block(self.next_addr, size)


def test_capture_of_churn_under_a_fake_torch_gives_the_generated_trace(tmp_path, monkeypatch):
    fake = FakeAllocatingTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    warmed = []
    monkeypatch.setattr(tc, "warm_up_libraries", warmed.append)
    summary = tc.capture("churn", tmp_path)
    assert warmed == [fake], "the libraries are warmed up before recording, as the benchmark does"
    assert summary["matches_generated"] is True
    assert summary["steps"] == len(s.build_schedule("churn").steps)
    text = gzip.decompress((tmp_path / "churn.trace.gz").read_bytes()).decode()
    assert "# workload churn" in text and "# torch fake" in text


class LoggingTorch:
    """empty() and dropping a tensor logged as ("a", size) and ("f", size)."""

    uint8 = "uint8"

    def __init__(self, free_bytes, total_bytes):
        self.log = []
        self.cuda = types.SimpleNamespace(mem_get_info=lambda: (free_bytes, total_bytes))
        log = self.log

        class Tensor:
            def __init__(self, size):
                self.size = size
                log.append(("a", size))

            def __del__(self):
                log.append(("f", self.size))

        self.Tensor = Tensor

    def empty(self, size, dtype, device):
        assert (dtype, device) == ("uint8", "cuda")
        return self.Tensor(size)


def test_checkerboard_fills_frees_every_other_and_asks_for_40_percent():
    torch = LoggingTorch(10 * 2**30, 16 * 2**30)
    step, schedule = tc.build_checkerboard(torch)
    assert schedule.steps == (None,) and schedule.warmup == 0
    step(None)
    count = int(10 * 2**30 * tc.CHECKER_FILL) // tc.CHECKER_BYTES
    big = int(16 * 2**30 * tc.CHECKER_BIG) // 2**21 * 2**21
    holes = (count + 1) // 2
    assert count == 35 and big == 6552 * 2**20
    assert torch.log[:count] == [("a", tc.CHECKER_BYTES)] * count
    assert torch.log[count : count + holes] == [("f", tc.CHECKER_BYTES)] * holes
    assert torch.log[count + holes] == ("a", big), "the big tensor comes after the holes"
    assert sorted(torch.log[count + holes + 1 :]) == sorted(
        [("f", big)] + [("f", tc.CHECKER_BYTES)] * (count - holes)
    )


def test_the_vmm_diagnostic_counts_each_steps_maps_between_step_markers():
    from bench.diag_vmm_trace import CountingConverter

    markers = [("begin", 100, None, None), ("x", 101, None, None), ("x", 102, None, None)]
    converter = CountingConverter(markers)
    entries = [
        alloc(100, tc.SENTINEL_BYTES),
        *free(100),
        alloc(5, 4096),
        {"action": "segment_map", "addr": 7, "size": 2 << 20, "stream": 0},
        alloc(101, tc.SENTINEL_BYTES),
        *free(5),
        {"action": "segment_map", "addr": 9, "size": 2 << 20, "stream": 0},
        {"action": "segment_unmap", "addr": 7, "size": 2 << 20, "stream": 0},
        {"action": "segment_map", "addr": 7, "size": 2 << 20, "stream": 0},
        alloc(102, tc.SENTINEL_BYTES),
    ]
    for e in entries:
        converter.entry(e)
    assert converter.finish() == [("a", 1, 4096, 0), ("x",), ("f", 1), ("x",)]
    assert converter.maps == [1, 2, 0]
    assert converter.unmaps == [0, 1, 0]

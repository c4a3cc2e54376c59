"""Stack frames in PyTorch's memory history under install() (streampool._frames through the
routed ``_record_memory_history`` and ``_snapshot``), on the simulated driver: allocations made
the way PyTorch makes them (``my_malloc`` / ``my_free``) carry the frames of the Python code
that made them, as ``context``, ``stacks`` and ``max_entries`` say. (GPU: parity case
memory_history_frames.)"""

import ctypes

import pytest

from streampool import _lib, _parity

DEVICE = 0
STREAM = 0x700
KiB = 1 << 10


def _c():
    lib = _lib.library()
    lib.my_malloc.restype = ctypes.c_void_p
    lib.my_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.my_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def allocate_here(size):
    """PyTorch's allocation call, from a function whose name the frames must show."""
    return _c().my_malloc(size, DEVICE, STREAM)


def free_here(ptr, size):
    _c().my_free(ptr, size, DEVICE, STREAM)


@pytest.fixture(autouse=True)
def stop_recording():
    yield
    _parity.record_memory_history(None)


def _names(frames):
    return [f["name"] for f in frames]


def _snapshot():
    snap = _parity.memory_snapshot(None)
    trace = snap["device_traces"][DEVICE]
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    return trace, live


def test_all_contexts_give_python_frames_to_allocations_frees_and_live_blocks():
    _parity.record_memory_history("all", context="all", stacks="python", max_entries=1000)
    kept = allocate_here(64 * KiB)
    gone = allocate_here(96 * KiB)
    free_here(gone, 96 * KiB)
    trace, live = _snapshot()
    alloc = next(e for e in trace if e["action"] == "alloc" and e["addr"] == kept)
    assert _names(alloc["frames"])[:2] == ["allocate_here", "test_all_contexts_give_python_frames_to_allocations_frees_and_live_blocks"]
    assert alloc["frames"][0]["filename"].endswith("test_history_frames.py") and alloc["frames"][0]["line"] > 0
    freed = [e for e in trace if e["action"] in ("free_requested", "free_completed") and e["addr"] == gone]
    assert len(freed) == 2 and all(_names(e["frames"])[0] == "free_here" for e in freed)
    assert _names(live[kept]["frames"])[0] == "allocate_here", "the live block keeps its allocation's frames"
    free_here(kept, 64 * KiB)


def test_alloc_context_gives_frees_their_allocations_frames():
    """PyTorch's frees carry their own frames with context "all", else their allocation's."""
    _parity.record_memory_history("all", context="alloc", stacks="python")
    ptr = allocate_here(8 * KiB)
    free_here(ptr, 8 * KiB)
    trace, _ = _snapshot()
    assert _names(next(e for e in trace if e["action"] == "alloc")["frames"])[0] == "allocate_here"
    frees = [e for e in trace if e["action"].startswith("free")]
    assert len(frees) == 2 and all(_names(e["frames"])[0] == "allocate_here" for e in frees)


def test_state_context_gives_frames_to_live_blocks_only():
    _parity.record_memory_history("all", context="state", stacks="python")
    ptr = allocate_here(8 * KiB)
    trace, live = _snapshot()
    assert trace and all(e["frames"] == [] for e in trace)
    assert _names(live[ptr]["frames"])[0] == "allocate_here"
    free_here(ptr, 8 * KiB)


def test_no_context_records_no_frames():
    _parity.record_memory_history("all", context=None, stacks="python")
    ptr = allocate_here(8 * KiB)
    trace, live = _snapshot()
    assert trace and all(e["frames"] == [] for e in trace) and live[ptr]["frames"] == []
    free_here(ptr, 8 * KiB)


def test_enabled_state_keeps_no_trace_but_the_live_blocks_frames():
    _parity.record_memory_history("state", context="all", stacks="python")
    ptr = allocate_here(8 * KiB)
    trace, live = _snapshot()
    assert trace == []
    assert _names(live[ptr]["frames"])[0] == "allocate_here"
    free_here(ptr, 8 * KiB)


def test_max_entries_keeps_each_devices_newest_trace_entries():
    _parity.record_memory_history("all", context="all", stacks="python", max_entries=5)
    ptrs = [allocate_here((i + 1) * KiB) for i in range(10)]
    trace, _ = _snapshot()
    assert len(trace) == 5
    assert [e["addr"] for e in trace if e["action"] == "alloc"][-1] == ptrs[-1], "the newest are kept"
    for i, ptr in enumerate(ptrs):
        free_here(ptr, (i + 1) * KiB)


def test_all_stacks_add_native_frames_from_the_allocators_caller_on():
    """stacks="all": the native stack is taken inside my_malloc; the frames shown start at its
    caller, interpreter frames left out (here the caller is ctypes in the interpreter, so what
    remains are the Python frames; on the GPU, PyTorch's C++ frames come first)."""
    from streampool import _frames

    _parity.record_memory_history("all", context="all", stacks="all")
    ptr = allocate_here(8 * KiB)
    trace, _ = _snapshot()
    gatherer = _frames.recording().gatherer
    python_only = _frames.Gatherer("python")
    context = _lib.live_contexts(DEVICE)[ptr]
    python, native = gatherer._stacks[context]
    assert native, "no native stack was taken"
    raw = [gatherer._symbol(a) for a in native]
    assert any("my_malloc" in f["name"] for f in raw), [f["name"] for f in raw][:12]
    frames = next(e for e in trace if e["action"] == "alloc")["frames"]
    assert all("libstreampool" not in f["filename"] for f in frames)
    assert _names(frames)[0] == "allocate_here"
    python_only._stacks.append((python, ()))
    assert frames == python_only.frames(1), "only interpreter frames lay between"
    free_here(ptr, 8 * KiB)


def test_native_frames_come_before_python_ones():
    from streampool import _frames

    gatherer = _frames.Gatherer("all")
    symbols = {1: "libstreampool.so", 2: "libc10_cuda.so", 3: "libpython3.11.so", 4: "libtorch_python.so"}
    gatherer._symbol = lambda a: {"filename": f"/x/{symbols[a]}", "line": 0, "name": f"f{a}"}
    gatherer._stacks.append(((("a.py", 3, "outer"),), (9, 1, 2, 3, 4)))
    symbols[9] = "libffi.so"
    frames = gatherer.frames(1)
    assert [f["name"] for f in frames] == ["f2", "f4", "outer"]


def test_stopping_stops_the_gathering_and_bad_values_are_refused():
    _parity.record_memory_history("all", context="all", stacks="python")
    _parity.record_memory_history(None)
    assert _lib.library().streampool_history_set_gatherer(None, 7) == _lib.INVALID_ARGUMENT
    for bad in ({"enabled": "everything"}, {"context": "some"}, {"stacks": "cpp"}):
        with pytest.raises(ValueError):
            _parity.record_memory_history(**{"enabled": "all", **bad})

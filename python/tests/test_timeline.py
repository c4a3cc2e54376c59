"""The memory timeline, PyTorch-format snapshots and the plot, on the simulated driver (no torch).

The structure checks are what PyTorch's viewers rely on (torch/cuda/_memory_viz.py and
MemoryViz.js): one trace list per device, blocks that tile their segment, numeric addr and size on
every trace entry, pickle protocol <= 4. test_gpu.py also feeds a GPU snapshot to torch's tools.
"""

import pickle
import struct

import pytest
from helpers import MiB, describe, run_python

import streampool
from streampool import _lib
from conftest import pool_backend_only


@pytest.fixture(autouse=True)
def fresh_timeline():
    streampool.empty_cache()
    streampool.record_history(True, max_entries=10_000)
    yield
    streampool.record_history(False)
    streampool.empty_cache()


def _alloc_free_cycle():
    a = _lib.malloc(3 * MiB, 0, 7)
    b = _lib.malloc(1000, 0, 7)
    _lib.free(a, 3 * MiB, 0, 7)
    c = _lib.malloc(3 * MiB, 0, 7)  # served from the cache: same block
    assert c == a
    return b, c


@pool_backend_only
def test_history_records_each_action_with_gauges():
    b, c = _alloc_free_cycle()
    events = streampool.history()
    actions = [e["action"] for e in events]
    assert actions[:3] == ["pool_grow", "pool_alloc", "alloc"]
    assert actions.count("alloc") == 3 and actions.count("free") == 1
    assert actions.count("pool_alloc") == 2, "the third allocation came from the cache"
    last = events[-1]
    assert last["action"] == "alloc" and last["address"] == c and last["stream"] == 7
    assert last["allocated_bytes"] == 3 * MiB + 1000 == streampool.memory_allocated(0)
    # (the device's own pools: the timeline's gauge leaves out the shareable pool)
    assert last["reserved_bytes"] == _lib.get_stats(0).reserved_bytes
    assert all(e["device"] == 0 for e in events)
    assert [e["time_us"] for e in events] == sorted(e["time_us"] for e in events)
    _lib.free(b, 1000, 0, 7)
    _lib.free(c, 3 * MiB, 0, 7)
    streampool.empty_cache()
    tail = [e["action"] for e in streampool.history()[-5:]]
    assert tail == ["free", "free", "pool_free", "pool_free", "pool_trim"]
    assert streampool.history()[-1]["reserved_bytes"] == 0


def test_stopping_keeps_the_record_and_starting_clears_it():
    b, c = _alloc_free_cycle()
    streampool.record_history(False)
    recorded = streampool.history()
    _lib.free(b, 1000, 0, 7)
    _lib.free(c, 3 * MiB, 0, 7)
    assert streampool.history() == recorded
    streampool.record_history(True, max_entries=2)
    assert streampool.history() == []
    for bad in (0, -1, 2.5, True, 2**64, 2**64 + 5):  # ctypes made 2**64 + 5 a ring of 5
        with pytest.raises(ValueError, match="max_entries"):
            streampool.record_history(True, max_entries=bad)
    for bad in ("no", "off", 0, 1, None):  # "no" is truthy: it would start recording
        with pytest.raises(TypeError, match="True or False"):
            streampool.record_history(bad)


@pool_backend_only
def test_snapshot_has_pytorchs_shape():
    b, c = _alloc_free_cycle()
    snap = streampool.snapshot()
    assert len(snap["device_traces"]) == streampool.device_count()
    by_address = {s["address"]: s for s in snap["segments"]}
    assert set(by_address) == {b, c}
    for seg in snap["segments"]:
        assert seg["device"] == 0 and seg["stream"] == 7 and seg["frames"] == []
        assert sum(block["size"] for block in seg["blocks"]) == seg["total_size"]
        assert [block["state"] for block in seg["blocks"]] == ["active_allocated"]
    assert by_address[b]["blocks"][0]["requested_size"] == 1000
    assert by_address[b]["total_size"] == 1024
    trace = snap["device_traces"][0]
    assert [t["action"] for t in trace] == [
        "segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed", "alloc",
    ]
    for t in trace:
        assert isinstance(t["addr"], int) and isinstance(t["size"], int) and isinstance(t["time_us"], int)
        assert t["frames"] == []
    assert len({id(t) for t in trace}) == len(trace), "the web viewer mutates entries in place"
    assert snap["streampool"]["dropped_events"] == 0
    _lib.free(b, 1000, 0, 7)
    _lib.free(c, 3 * MiB, 0, 7)
    after = streampool.snapshot()
    assert [s["blocks"][0]["state"] for s in after["segments"]] == ["inactive", "inactive"]


def test_out_of_memory_becomes_an_oom_trace_entry_with_device_free():
    with pytest.raises(streampool.OutOfMemoryError):
        _lib.malloc(1 << 45, 1)  # 32 TiB: at most the maximum, more than the device
    trace = streampool.snapshot()["device_traces"][1]
    assert trace[-1]["action"] == "oom" and trace[-1]["size"] == 1 << 45
    assert trace[-1]["device_free"] == streampool.memory_stats(1)["device_total_bytes"]


@pool_backend_only
def test_dump_snapshot_writes_protocol_4_and_plot_draws_it(tmp_path):
    b, c = _alloc_free_cycle()
    path = streampool.dump_snapshot(tmp_path / "snap.pickle")
    raw = path.read_bytes()
    assert raw[0] == 0x80 and raw[1] <= 4, "pytorch.org/memory_viz reads pickle protocols 2-4"
    assert pickle.loads(raw)["device_traces"][0][0]["action"] == "segment_alloc"
    png = streampool.plot_timeline(path, tmp_path / "memory.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert width > 500 and height > 200
    _lib.free(b, 1000, 0, 7)
    _lib.free(c, 3 * MiB, 0, 7)


def test_plot_replays_a_pytorch_snapshot(tmp_path):
    """A snapshot from PyTorch's own allocator has no "streampool" record: allocated and segment
    bytes are replayed from its trace, anchored to its segments."""
    seg = 0x7F0000000000
    entry = lambda action, addr, size, t: {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}
    snap = {
        "segments": [{"device": 0, "address": seg, "total_size": 2 * MiB, "stream": 0,
                      "blocks": [{"size": MiB, "state": "active_allocated"}, {"size": MiB, "state": "inactive"}]}],
        "device_traces": [[
            entry("segment_alloc", seg, 2 * MiB, 1), entry("alloc", seg, MiB, 2),
            entry("alloc", seg + MiB, MiB, 3), entry("free_completed", seg + MiB, MiB, 4),
        ]],
    }
    from streampool._timeline import _series_from_torch

    series = _series_from_torch(snap, 0)
    assert series["allocated"] == [0, MiB, 2 * MiB, MiB]
    assert series["reserved"] == [2 * MiB] * 4
    assert streampool.plot_timeline(snap, tmp_path / "torch.png").is_file()


def test_plot_command_line(tmp_path):
    streampool.record_history(True)
    p = _lib.malloc(MiB, 0)
    _lib.free(p, MiB, 0)
    snap = streampool.dump_snapshot(tmp_path / "s.pickle")
    out = tmp_path / "m.png"
    proc = run_python(args=["-m", "streampool", "plot", str(snap), "-o", str(out)],
                      env={"STREAMPOOL_LIBRARY": str(_lib.library_path())})
    assert proc.returncode == 0 and out.is_file(), describe(proc)
    assert f"wrote {out}" in proc.stdout
    bad = run_python(args=["-m", "streampool", "plot", str(tmp_path / "missing.pickle")])
    assert bad.returncode == 1 and "cannot plot" in bad.stderr, describe(bad)
    # A name without a suffix: matplotlib adds .png, and the message names what was written.
    proc = run_python(args=["-m", "streampool", "plot", str(snap), "-o", str(tmp_path / "plain")],
                      env={"STREAMPOOL_LIBRARY": str(_lib.library_path())})
    assert proc.returncode == 0 and (tmp_path / "plain.png").is_file(), describe(proc)
    assert proc.stdout.strip() == f"wrote {tmp_path / 'plain.png'}", describe(proc)
    folder = run_python(args=["-m", "streampool", "plot", str(snap), "-o", str(tmp_path)])
    assert folder.returncode == 1 and "it is a folder" in folder.stderr, describe(folder)


def test_plot_names_a_device_the_snapshot_lacks_and_a_missing_output_folder(tmp_path):
    # A PyTorch snapshot's device 5 was an IndexError traceback, a streampool one's said to call
    # record_history(); a missing output folder was blamed on the snapshot.
    torch_snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "stream": 0}]]}
    streampool.record_history(True)
    for snap in (torch_snap, streampool.snapshot()):
        count = len(snap["device_traces"])
        with pytest.raises(ValueError, match=f"device 5 is not in the snapshot, which has device\\(s\\) 0 to {count - 1}"):
            streampool.plot_timeline(snap, tmp_path / "m.png", device=5)
        with pytest.raises(ValueError, match="the folder .*missing does not exist"):
            streampool.plot_timeline(snap, tmp_path / "missing" / "m.png")


def test_plot_without_events_says_how_to_get_them():
    streampool.record_history(True)
    with pytest.raises(ValueError, match="record_history"):
        streampool.plot_timeline(streampool.snapshot(), "unused.png")


def test_peer_access_grants_and_rejects_bad_devices():
    streampool.enable_peer_access(0)  # two simulated devices, peer capable
    streampool.enable_peer_access("all")
    with pytest.raises(streampool.InvalidArgumentError, match="out of range"):
        streampool.enable_peer_access(5)

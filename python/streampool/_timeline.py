"""The memory timeline: recording it, PyTorch-format snapshots of it, and a plot.

``record_history`` starts the library's ring of events; ``snapshot`` turns the ring and the blocks
held now into the dict that ``torch.cuda.memory._snapshot()`` returns, so PyTorch's tools
(``torch.cuda._memory_viz``, https://pytorch.org/memory_viz) read it. streampool's own record,
with its byte gauges, rides along under the key ``"streampool"``, which PyTorch's tools ignore.

How streampool maps onto PyTorch's vocabulary: a "segment" is a block streampool took from the
CUDA pool (the pool's own layout is not visible); ``segment_alloc`` / ``segment_free`` are blocks
taken from and returned to the pool; ``alloc`` / ``free_*`` are tensors' allocations; with
``STREAMPOOL_BACKEND=vmm``, ``segment_map`` / ``segment_unmap`` are pages of physical memory
mapped and unmapped (as PyTorch's expandable segments show theirs).
"""

import ctypes
import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from . import _lib

DEFAULT_MAX_ENTRIES = 100_000
_SIZE_T_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
# PyTorch's web viewer reads pickle protocols 2 to 4 only.
PICKLE_PROTOCOL = 4
_SMALL_BLOCK_BYTES = 1 << 20  # PyTorch's small-pool boundary, for segment_type
_TORCH_STATES = {"live": "active_allocated", "inactive": "inactive", "waiting_for_streams": "active_pending_free"}


def record_history(enabled: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Start recording the memory timeline afresh, keeping the newest ``max_entries`` events
    (each 72 bytes), or stop (``enabled=False``; what was recorded stays readable). While off,
    recording costs one atomic load per allocation."""
    if not isinstance(enabled, bool):  # a string such as "no" is truthy: refuse it
        raise TypeError(f"record_history(enabled=...) must be True or False, not {enabled!r}")
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries <= 0:
        raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
    if max_entries > _SIZE_T_MAX:  # ctypes would wrap it (2**64 + 5 as 5)
        raise ValueError(f"max_entries must be at most {_SIZE_T_MAX} (a size_t), got {max_entries!r}")
    _lib.check(_lib.library().streampool_record_history(1 if enabled else 0, max_entries))


def history() -> List[Dict[str, Any]]:
    """The recorded events, oldest first: ``action`` (alloc, free, pool_alloc, pool_free,
    pool_grow, pool_trim, oom, and with the vmm backend map, unmap), ``time_us``, ``device``, ``stream``, ``address``, ``bytes`` and the
    device's gauges after the event (``allocated_bytes``, ``held_bytes``, ``cached_bytes``,
    ``reserved_bytes``). For ``oom``, ``address`` is the device's free bytes."""
    events, _ = _lib.history()
    return [_event_dict(e) for e in events]


def _event_dict(e: _lib.StreampoolEvent) -> Dict[str, Any]:
    return {
        "action": _lib.EVENT_KINDS.get(e.kind, f"kind {e.kind}"),
        "time_us": e.time_ns // 1000,
        "device": e.device,
        "stream": e.stream,
        "address": e.address,
        "bytes": e.bytes,
        "allocated_bytes": e.allocated_bytes,
        "held_bytes": e.held_bytes,
        "cached_bytes": e.cached_bytes,
        "reserved_bytes": e.reserved_bytes,
    }


def _segment(b: _lib.StreampoolBlock, frames: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    state = _TORCH_STATES[_lib.BLOCK_STATES[b.state]]
    size = b.block_bytes
    return {
        "device": b.device,
        "address": b.address,
        "total_size": size,
        "allocated_size": size if state == "active_allocated" else 0,
        "active_size": size if state != "inactive" else 0,
        "requested_size": b.requested_bytes,
        "stream": b.stream,
        "segment_type": "small" if size <= _SMALL_BLOCK_BYTES else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [
            {
                "address": b.address,
                "size": size,
                "requested_size": b.requested_bytes,
                "state": state,
                "frames": frames if frames is not None and state == "active_allocated" else [],
            }
        ],
    }


def _trace_entries(e: Dict[str, Any], frames: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """PyTorch trace entries for one streampool event (none for pool growth and trims, which
    PyTorch's format has no action for; they stay in the "streampool" record), with ``frames``."""
    base = {"addr": e["address"], "size": e["bytes"], "stream": e["stream"], "time_us": e["time_us"],
            "frames": frames or []}
    action = e["action"]
    if action == "alloc":
        return [dict(base, action="alloc")]
    if action == "free":
        return [dict(base, action="free_requested"), dict(base, action="free_completed")]
    if action == "pool_alloc":
        return [dict(base, action="segment_alloc")]
    if action == "pool_free":
        return [dict(base, action="segment_free")]
    if action == "oom":
        return [dict(base, action="oom", addr=0, device_free=e["address"])]
    if action in ("map", "unmap"):
        return [dict(base, action=f"segment_{action}")]
    return []


def _event_frames(recording: Any, context: int) -> List[Dict[str, Any]]:
    """The frames a trace entry carries under PyTorch's ``context`` setting: none below "alloc";
    from "alloc" on, those of the call that made it (an allocation, and the segments, mappings
    or out-of-memory it caused) — a free's own only with "all", else its block's allocation's
    (the library gives a free without a context of its own its allocation's)."""
    if recording is None or recording.gatherer is None or not context or not recording.level("alloc"):
        return []
    return recording.gatherer.frames(context)


def _live_frames(recording: Any, device: int) -> Dict[int, List[Dict[str, Any]]]:
    """address -> frames of ``device``'s live blocks (PyTorch's context "state" and above)."""
    if recording is None or recording.gatherer is None or not recording.level("state"):
        return {}
    return {a: recording.gatherer.frames(c) for a, c in _lib.live_contexts(device).items()}


def snapshot() -> Dict[str, Any]:
    """The timeline and the blocks held now, as ``torch.cuda.memory._snapshot()`` shapes them;
    with PyTorch's memory history recording under install(), with its stack frames."""
    from . import _frames

    recording = _frames.recording()
    if recording is None:
        events, dropped = _lib.history()
        contexts = [0] * len(events)
    else:
        events, contexts, dropped = _lib.history_with_contexts()
    records = [_event_dict(e) for e in events]
    count = _lib.device_count()
    segments = []
    for device in range(count):
        live = _live_frames(recording, device)
        segments += [_segment(b, live.get(b.address)) for b in _lib.blocks(device)]
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(count)]
    for record, context in zip(records, contexts):
        traces[record["device"]].extend(_trace_entries(record, _event_frames(recording, context)))
    if recording is not None:
        # PyTorch keeps the newest max_entries trace entries of each device, none with "state".
        keep = recording.max_entries if recording.trace else 0
        traces = [t[len(t) - keep:] if keep else [] for t in traces]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"allocator": "streampool", "version": _lib.version()},
        "streampool": {"driver": _lib.driver_name(), "events": records, "dropped_events": dropped},
    }


def dump_snapshot(path: Union[str, Path]) -> Path:
    """Write :func:`snapshot` as a pickle that pytorch.org/memory_viz and
    ``python -m torch.cuda._memory_viz`` open; returns the path."""
    path = Path(path)
    with path.open("wb") as f:
        pickle.dump(snapshot(), f, protocol=PICKLE_PROTOCOL)
    return path


def load_snapshot(source: Union[str, Path, Dict[str, Any]]) -> Dict[str, Any]:
    """The snapshot dict of ``source`` (a path to its pickle, or the dict); ValueError if it is
    not one (a dict with ``device_traces`` and ``segments`` lists, as streampool.snapshot() and
    torch.cuda.memory._snapshot() give)."""
    snap = source
    if not isinstance(source, dict):
        with Path(source).open("rb") as f:
            snap = pickle.load(f)
    if not (isinstance(snap, dict) and isinstance(snap.get("device_traces"), list)
            and isinstance(snap.get("segments"), list)):
        raise ValueError(f"not a memory snapshot: a {type(snap).__name__}, where the dict of "
                         "streampool.snapshot() or torch.cuda.memory._snapshot() (with "
                         "'device_traces' and 'segments') was expected")
    return snap


def _series_from_streampool(snap: Dict[str, Any], device: int) -> Dict[str, List[float]]:
    events = [e for e in snap["streampool"]["events"] if e["device"] == device]
    series: Dict[str, List[float]] = {k: [] for k in ("time_us", "allocated", "held", "cached", "reserved")}
    for e in events:
        series["time_us"].append(e["time_us"])
        for key in ("allocated", "held", "cached", "reserved"):
            series[key].append(e[f"{key}_bytes"])
    return series


def _series_from_torch(snap: Dict[str, Any], device: int) -> Dict[str, List[float]]:
    """Replays a PyTorch snapshot's trace: allocated bytes and segment bytes over time, anchored
    at the end to the segments the snapshot lists."""
    deltas = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1), "segment_map": (0, 1),
              "segment_free": (0, -1), "segment_unmap": (0, -1)}
    trace = [t for t in snap["device_traces"][device] if t["action"] in deltas]
    segments = [s for s in snap["segments"] if s["device"] == device]
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    reserved = sum(s["total_size"] for s in segments)
    allocated -= sum(deltas[t["action"]][0] * t["size"] for t in trace)
    reserved -= sum(deltas[t["action"]][1] * t["size"] for t in trace)
    series: Dict[str, List[float]] = {"time_us": [], "allocated": [], "reserved": []}
    for t in trace:
        da, dr = deltas[t["action"]]
        allocated += da * t["size"]
        reserved += dr * t["size"]
        series["time_us"].append(t.get("time_us", len(series["time_us"])))
        series["allocated"].append(allocated)
        series["reserved"].append(reserved)
    return series


def plot_timeline(
    source: Union[str, Path, Dict[str, Any]], out: Union[str, Path] = "memory.png", device: Optional[int] = None
) -> Path:
    """Draw allocated, held, cached and reserved bytes over time from a snapshot (a path or the
    dict) into ``out`` (PNG), one panel per device that has events (or only ``device``).
    PyTorch's own snapshots work too: their allocated and segment bytes are replayed from the
    trace. Needs matplotlib (``pip install 'streampool[plot]'``)."""
    snap = load_snapshot(source)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'streampool[plot]' (or pip install matplotlib)") from None
    own = "streampool" in snap
    count = len(snap["device_traces"])
    if device is not None and not (isinstance(device, int) and 0 <= device < count):
        raise ValueError(f"device {device!r} is not in the snapshot, which has device(s) 0 to {count - 1}")
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"cannot write {out}: it is a folder (name a file, such as {out / 'memory.png'})")
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {out}: the folder {out.parent} does not exist")
    if not out.suffix:
        out = out.with_name(out.name + ".png")  # what matplotlib writes for a name without one
    devices = range(count) if device is None else [device]
    panels = []
    for d in devices:
        try:
            series = _series_from_streampool(snap, d) if own else _series_from_torch(snap, d)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a memory snapshot: device {d}'s events are malformed "
                             f"({type(exc).__name__}: {exc})") from None
        if series["time_us"]:
            panels.append((d, series))
    if not panels:
        raise ValueError("the snapshot has no timeline events to plot: call streampool.record_history() before the run")
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.5 * len(panels)), squeeze=False)
    for ax, (d, series) in zip(axes[:, 0], panels):
        start = series["time_us"][0]
        seconds = [(t - start) / 1e6 for t in series["time_us"]]
        for key, values in series.items():
            if key != "time_us":
                ax.step(seconds, [v / 2**30 for v in values], where="post", label=key)
        ax.set_title(f"device {d}")
        ax.set_xlabel("seconds since the first event")
        ax.set_ylabel("GiB")
        ax.legend(loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

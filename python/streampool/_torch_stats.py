"""PyTorch's memory functions under ``install()``: ``torch.cuda.memory_stats()`` and the functions
built on it read streampool's statistics instead of raising.

PyTorch's pluggable allocator has no statistics hook: ``torch.cuda.memory_stats_as_nested_dict``
calls ``torch._C._cuda_memoryStats(device)``, which raises for every pluggable allocator, and
``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``, ``max_memory_reserved`` and
``memory_summary`` all go through it; ``reset_peak_memory_stats`` calls
``torch._C._cuda_resetPeakMemoryStats``. :func:`route` replaces those entry points (and
``memory_summary``, whose table needs figures streampool does not keep) for the process.

Invariant: every value handed to PyTorch is one of streampool's counters, under the PyTorch key
of the same meaning; a key whose figure streampool does not know is absent, never zero
(``TORCH_KEYS_ABSENT`` lists them with the reason).
"""

import threading
from typing import Any, Callable, Dict, List

from . import _lib
from ._stats import OWN_KEYS, summary

# PyTorch's keys streampool cannot fill truthfully, and why (also in the README).
TORCH_KEYS_ABSENT = {
    "{allocated_bytes,requested_bytes,active_bytes,reserved_bytes,allocation}.{large_pool,small_pool}.*":
        "streampool counts per device, not per size class",
    "active_bytes.all.{allocated,freed}, reserved_bytes.all.{allocated,freed}":
        "streampool keeps no running totals of these",
    "active.*": "streampool counts active bytes, not active blocks",
    "segment.*, inactive_split.*, inactive_split_bytes.*, oversize_*, max_split_size":
        "PyTorch's caching-allocator segments and splits; the CUDA pool's own chunks are not visible",
    "num_sync_all_streams, num_oom_rejections, reserved_bytes_by_private_pools":
        "no counterpart in streampool",
}

# Totals that torch.cuda.reset_accumulated_memory_stats() sets back to 0, as (nested key path).
_ACCUMULATED = (
    ("allocated_bytes", "all", "allocated"),
    ("allocated_bytes", "all", "freed"),
    ("requested_bytes", "all", "allocated"),
    ("requested_bytes", "all", "freed"),
    ("allocation", "all", "allocated"),
    ("allocation", "all", "freed"),
    ("num_alloc_retries",),
    ("num_ooms",),
    ("num_device_alloc",),
    ("num_device_free",),
)

_lock = threading.Lock()
# device -> the accumulated figures at the last reset_accumulated_memory_stats(device).
_accumulated_at_reset: Dict[int, Dict[tuple, int]] = {}


def _raw_nested(device: int) -> Dict[str, Any]:
    """streampool's statistics of ``device`` in PyTorch's nested layout, before any reset offsets."""
    # PyTorch's reserved bytes are everything the allocator holds from CUDA, which the segments
    # of memory_snapshot() add up to: streampool's pools, its shareable pool and graph memory.
    s, (reserved, reserved_peak) = _lib.stats_with_reserved(device)
    # streampool counts the bytes callers asked for: PyTorch's requested_bytes. PyTorch's
    # allocated_bytes rounds each block up to 512 B; streampool's blocks are rounded inside the
    # pool it cannot see, so the requested figure stands for it too (equal for 512-byte multiples).
    requested = {
        "current": s.allocated_bytes,
        "peak": s.allocated_bytes_peak,
        "allocated": s.allocated_bytes_total,
        "freed": s.freed_bytes_total,
    }
    return {
        "allocated_bytes": {"all": dict(requested)},
        "requested_bytes": {"all": dict(requested)},
        "active_bytes": {"all": {"current": s.active_bytes, "peak": s.active_bytes_peak}},
        "reserved_bytes": {"all": {"current": reserved, "peak": reserved_peak}},
        "allocation": {
            "all": {
                "current": s.allocations_current,
                "peak": s.allocations_peak,
                "allocated": s.num_allocs,
                "freed": s.num_frees,
            }
        },
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "num_device_alloc": s.num_device_allocs,
        "num_device_free": s.num_device_frees,
        "streampool": {key: int(getattr(s, field)) for key, field in sorted(OWN_KEYS.items())},
    }


def _get(tree: Dict[str, Any], path: tuple) -> int:
    for key in path[:-1]:
        tree = tree[key]
    return tree[path[-1]]


def _set(tree: Dict[str, Any], path: tuple, value: int) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def memory_stats_nested(device: int) -> Dict[str, Any]:
    """What ``torch._C._cuda_memoryStats(device)`` returns under streampool: PyTorch's nested dict
    (``{"allocated_bytes": {"all": {"current": ...}}, "num_ooms": ..., ...}``) with the keys
    streampool knows, totals counted from the last reset_accumulated_memory_stats(device), and
    streampool's own figures under ``"streampool"``."""
    tree = _raw_nested(device)
    with _lock:
        base = _accumulated_at_reset.get(device)
    if base:
        for path in _ACCUMULATED:
            _set(tree, path, _get(tree, path) - base[path])
    return tree


def reset_peak(device: int) -> None:
    """``torch._C._cuda_resetPeakMemoryStats``: the peaks of ``device`` back to the current values."""
    _lib.get_stats(device)  # raises InvalidArgumentError naming a bad index
    _lib.call_reporting("streampool_reset_peak_stats", device)


def reset_accumulated(device: int) -> None:
    """``torch._C._cuda_resetAccumulatedMemoryStats``: the totals PyTorch calls accumulated
    (``*.allocated``, ``*.freed``, ``num_alloc_retries``, ``num_ooms``, ``num_device_alloc``,
    ``num_device_free``) count from now on in what PyTorch's functions return.
    ``streampool.memory_stats()`` keeps counting from the start."""
    tree = _raw_nested(device)
    with _lock:
        _accumulated_at_reset[device] = {path: _get(tree, path) for path in _ACCUMULATED}


def _summary_function(torch: Any) -> Callable[..., str]:
    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        """streampool's memory summary of ``device`` (``torch.cuda.memory_summary`` under
        streampool.install(); ``abbreviated`` is accepted and changes nothing)."""
        index = torch.cuda._get_device_index(device, optional=True)
        return summary(index, _lib.driver_name(), *_lib.stats_with_reserved(index)) + "\n"

    return memory_summary


# (object path, attribute) replaced by route(); restore() puts the originals back (tests).
_saved: List[tuple] = []


def route(torch: Any) -> None:
    """Make PyTorch's memory functions read streampool's statistics in this process."""
    replacements = [
        (torch._C, "_cuda_memoryStats", memory_stats_nested),
        (torch._C, "_cuda_resetPeakMemoryStats", reset_peak),
        (torch._C, "_cuda_resetAccumulatedMemoryStats", reset_accumulated),
    ]
    # torch.accelerator's memory functions (PyTorch 2.8 and later) ask the device's allocator
    # through another path that does not reach streampool's.
    accelerator = [
        ("_accelerator_getDeviceStats", memory_stats_nested),
        ("_accelerator_resetPeakStats", reset_peak),
        ("_accelerator_resetAccumulatedStats", reset_accumulated),
        ("_accelerator_emptyCache", lambda: _lib.call_reporting("streampool_empty_cache")),
        ("_accelerator_isAllocatorInitialized", lambda: True),
    ]
    replacements += [(torch._C, name, f) for name, f in accelerator if hasattr(torch._C, name)]
    summary_function = _summary_function(torch)
    replacements += [
        (torch.cuda.memory, "memory_summary", summary_function),
        (torch.cuda, "memory_summary", summary_function),
    ]
    with _lock:
        for owner, name, function in replacements:
            _saved.append((owner, name, getattr(owner, name, None)))
            setattr(owner, name, function)


def restore() -> int:
    """Undo route() (for tests); returns how many entry points were put back."""
    with _lock:
        count = len(_saved)
        while _saved:
            owner, name, original = _saved.pop()
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _accumulated_at_reset.clear()
    return count

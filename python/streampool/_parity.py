"""What install() wires beyond malloc and free, so that PyTorch's features keep working:

- PyTorch's memory-pool hooks (``torch.cuda.graph`` captures, ``torch.cuda.MemPool``,
  ``use_mem_pool``, torch.compile's CUDA graph trees) on the pluggable allocator;
- streampool's C++ methods on the installed allocator object (cuDNN benchmark mode's
  ``cacheInfo``, ``MemPool``'s pool methods, out-of-memory observers, the typed
  ``torch.OutOfMemoryError``), attached by the library (``streampool_torch_attach``);
- the ``torch._C`` functions PyTorch calls from Python that a pluggable allocator cannot answer:
  CUDA graph trees' pool checks and checkpoints, memory history and snapshots.

Invariant: every feature that could not be wired is named once in the log (a warning), and its
PyTorch function is left as PyTorch has it; nothing here answers "fine" without checking.
"""

import ctypes
import logging
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _frames, _lib, _timeline

_log = logging.getLogger("streampool")

# (setter on torch._C._CUDAPluggableAllocator, export) for PyTorch's memory pools.
POOL_HOOKS = (
    ("set_begin_allocate_to_pool", "streampool_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "streampool_end_allocate_to_pool"),
    ("set_release_pool", "streampool_release_pool"),
)

# PyTorch's unbounded default (sys.maxsize) is capped: each event takes 72 bytes.
MAX_HISTORY_ENTRIES = 1_000_000

PoolId = Tuple[int, int]


def wire_pool_hooks(raw: Any) -> List[str]:
    """Sets the memory-pool hooks on ``raw`` (a ``torch._C._CUDAPluggableAllocator``); returns
    the setters this PyTorch lacks."""
    missing = []
    for setter, function in POOL_HOOKS:
        if hasattr(raw, setter):
            getattr(raw, setter)(_lib.function_address(function))
        else:
            missing.append(setter)
    return missing


def attach() -> Dict[str, Optional[str]]:
    """Gives the installed allocator streampool's C++ methods: feature -> None (wired) or why
    not. Raises StreampoolError if the installed allocator is not streampool's."""
    raw = _lib.library().streampool_torch_attach()
    if raw is None:
        raise _lib.error(None, "streampool_torch_attach failed")
    features: Dict[str, Optional[str]] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        features[parts[1]] = None if parts[0] == "ok" else (parts[2] if len(parts) > 2 else "unknown")
    return features


def _pool_rows(device: int, pool: PoolId, segments: bool) -> List[_lib.StreampoolPoolBlock]:
    """The live blocks (or segments) of ``pool`` on ``device``; StreampoolError if it does not exist."""
    function = _lib.library().streampool_graph_pool_blocks
    flag = 1 if segments else 0
    count = ctypes.c_size_t(0)
    capacity = 16
    while True:  # *count is how many were copied: all of them once it is below the room given
        rows = (_lib.StreampoolPoolBlock * capacity)()
        _lib.check(function(device, pool[0], pool[1], flag, rows, capacity, ctypes.byref(count)))
        if count.value < capacity:
            return list(rows[: count.value])
        capacity *= 2


def _pool_id(pool: Any) -> PoolId:
    a, b = pool
    return int(a), int(b)


class Block(NamedTuple):
    """A live block of a memory pool."""

    address: int
    requested_bytes: int
    block_bytes: int
    stream: int


def live_blocks(device: int, pool: Any) -> List[Block]:
    """The live blocks of memory pool ``pool`` on ``device``."""
    rows = _pool_rows(int(device), _pool_id(pool), segments=False)
    return [Block(r.address, r.requested_bytes, r.block_bytes, r.stream) for r in rows]


class GraphPoolCheckpoint:
    """A memory pool's live blocks at one moment (``torch._C._cuda_getCheckpointState`` under
    streampool): what ``_cuda_setCheckpointPoolState`` restores."""

    def __init__(self, device: int, pool: PoolId, blocks: Sequence[Block]):
        self.device = device
        self.pool = pool
        self.blocks = tuple(blocks)

    def __repr__(self) -> str:
        return f"GraphPoolCheckpoint(device={self.device}, pool={self.pool}, blocks={len(self.blocks)})"


def check_pool_live_allocations(device: int, pool: Any, expected: Any) -> bool:
    """``torch._C._cuda_checkPoolLiveAllocations``: True if the live blocks of ``pool`` are
    exactly the addresses in ``expected``."""
    addresses = {b.address for b in live_blocks(device, pool)}
    return addresses == {int(p) for p in expected}


def get_checkpoint_state(device: int, pool: Any) -> GraphPoolCheckpoint:
    """``torch._C._cuda_getCheckpointState``: the pool's live blocks now."""
    pool = _pool_id(pool)
    return GraphPoolCheckpoint(int(device), pool, live_blocks(device, pool))


_restore_lock = threading.Lock()


def _set_checkpoint_pool_state(torch: Any, original: Any) -> Any:
    def set_checkpoint_pool_state(
        device: int, state: Any, stale_storages: Sequence[int], storages_to_add_deleters_to: Sequence[int]
    ) -> None:
        """``torch._C._cuda_setCheckpointPoolState`` under streampool: the pool's live blocks
        become those of ``state`` (blocks live then and freed since come back at their
        addresses, booked by PyTorch's allocator as if just allocated), then PyTorch's own
        binding gives ``storages_to_add_deleters_to`` the allocator's deleter."""
        if not isinstance(state, GraphPoolCheckpoint):
            raise TypeError(
                f"state must be what torch._C._cuda_getCheckpointState returned under streampool, "
                f"not {type(state).__name__}"
            )
        device = int(device)
        if device != state.device:
            raise ValueError(f"the checkpoint is of device {state.device}, not {device}")
        if list(stale_storages):
            raise RuntimeError(
                "streampool cannot release stale storages during a checkpoint restore: free them "
                "before restoring (torch.compile's CUDA graph trees pass none)"
            )
        lib = _lib.library()
        with _restore_lock:
            now = {b.address for b in live_blocks(device, state.pool)}
            wanted = {b.address for b in state.blocks}
            extra = sorted(now - wanted)
            if extra:
                raise RuntimeError(
                    "Any stale tensors which are being manually freed must be passed to set "
                    f"checkpoint: memory pool {state.pool} has live blocks the checkpoint does not: "
                    f"{', '.join(hex(a) for a in extra[:8])}"
                )
            restored: List[Block] = []
            try:
                with torch.cuda.device(device):
                    for b in state.blocks:
                        if b.address in now:
                            continue
                        _restore_one(lib, torch, device, state.pool, b)
                        restored.append(b)
                addresses = (ctypes.c_uint64 * len(state.blocks))(*[b.address for b in state.blocks])
                _lib.check(lib.streampool_checkpoint_prepare(device, addresses, len(state.blocks)))
                original(device, None, [], list(storages_to_add_deleters_to))
            except BaseException:
                # Nothing half done: what this call restored goes back, and nothing stays prepared.
                lib.streampool_checkpoint_prepare(device, None, 0)
                for b in restored:
                    torch._C._cuda_cudaCachingAllocator_raw_delete(b.address)
                raise

    return set_checkpoint_pool_state


def _restore_one(lib: Any, torch: Any, device: int, pool: PoolId, b: Block) -> None:
    """Brings block ``b`` of ``pool`` back at its address through PyTorch's own allocation call,
    so that PyTorch books it."""
    _lib.check(
        lib.streampool_graph_pool_expect_restore(
            device, pool[0], pool[1], b.address, b.requested_bytes, b.block_bytes, b.stream
        )
    )
    try:
        got = torch._C._cuda_cudaCachingAllocator_raw_alloc(b.requested_bytes, b.stream)
    finally:
        lib.streampool_graph_pool_expect_restore(device, 0, 0, None, 0, 0, None)
    if got != b.address:
        torch._C._cuda_cudaCachingAllocator_raw_delete(got)
        raise RuntimeError(f"restoring block {b.address:#x} of memory pool {pool} gave {got:#x}")


def record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = MAX_HISTORY_ENTRIES,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: Optional[Sequence[str]] = None,
) -> None:
    """``torch._C._cuda_record_memory_history`` under streampool: starts (``enabled`` "state" or
    "all") or stops (None) streampool's memory timeline, which ``_snapshot()`` then returns in
    PyTorch's format, with stack frames as ``context`` ("state": live blocks'; "alloc": and the
    allocations' trace entries; "all": and the frees'; None: none) and ``stacks`` ("python", or
    "all": native frames too) say, and at most ``max_entries`` trace entries per device
    ("state" keeps none)."""
    from . import _frames
    from ._timeline import record_history

    if enabled is not None and enabled not in ("state", "all"):
        raise ValueError(f"expected state to be 'state', 'all', or None, not {enabled!r}")
    if context is not None and context not in ("state", "alloc", "all"):
        raise ValueError(f"expected context to be 'state', 'alloc', 'all', or None, not {context!r}")
    if stacks not in _frames.STACKS:
        raise ValueError(f"expected stack to be 'python', or 'all', not {stacks!r}")
    if enabled is None:
        _frames.stop()
        record_history(False)
        return
    entries = max(1, min(int(max_entries), MAX_HISTORY_ENTRIES))
    # A ring of streampool's events: a free makes two trace entries, pool growth none; the
    # snapshot keeps each device's newest max_entries trace entries.
    ring = min(MAX_HISTORY_ENTRIES, entries * 4 * max(1, _lib.device_count()))
    _frames.start(context, stacks, trace=enabled == "all", max_entries=entries)
    record_history(True, ring)


def record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    *args: Any,
) -> None:
    """``torch._C._cuda_record_memory_history_legacy`` under streampool (the boolean form of
    ``torch.cuda.memory._record_memory_history``)."""
    from . import _frames
    from ._timeline import record_history

    if not enabled:
        _frames.stop()
        record_history(False)
        return
    entries = trace_alloc_max_entries if trace_alloc_record_context else MAX_HISTORY_ENTRIES
    entries = max(1, min(int(entries), MAX_HISTORY_ENTRIES))
    # PyTorch's legacy form: frames of live blocks if record_context, of allocations too with
    # trace_alloc_record_context; Python frames.
    context = ("alloc" if trace_alloc_record_context else "state") if record_context else None
    _frames.start(context, "python", trace=True, max_entries=entries)
    record_history(True, min(MAX_HISTORY_ENTRIES, entries * 4 * max(1, _lib.device_count())))


def pool_ids(device: int) -> List[PoolId]:
    """The ids of ``device``'s PyTorch memory pools."""
    function = _lib.library().streampool_graph_pool_ids
    count = ctypes.c_size_t(0)
    capacity = 8
    while True:  # *count is how many were copied: all of them once it is below the room given
        out = (ctypes.c_uint64 * (2 * capacity))()
        _lib.check(function(device, out, capacity, ctypes.byref(count)))
        if count.value < capacity:
            return [(out[2 * i], out[2 * i + 1]) for i in range(count.value)]
        capacity *= 2


def _pool_segments(pool: PoolId, devices: Optional[List[int]] = None) -> List[Dict[str, Any]]:
    """PyTorch-format segments of memory pool ``pool`` on every device that has it."""
    segments = []
    for device in range(_lib.device_count()) if devices is None else devices:
        try:
            spans = _pool_rows(device, pool, segments=True)
        except _lib.StreampoolError:
            continue
        live = sorted(_pool_rows(device, pool, segments=False), key=lambda b: b.address)
        live_frames = _timeline._live_frames(_frames.recording(), device)
        for span in spans:
            start, end = span.address, span.address + span.block_bytes
            inside = [b for b in live if start <= b.address < end]
            blocks, at = [], start
            for b in inside:
                if b.address > at:
                    blocks.append({"address": at, "size": b.address - at, "requested_size": 0, "state": "inactive", "frames": []})
                blocks.append(
                    {"address": b.address, "size": b.block_bytes, "requested_size": b.requested_bytes,
                     "state": "active_allocated", "frames": live_frames.get(b.address, [])}
                )
                at = b.address + b.block_bytes
            if at < end:
                blocks.append({"address": at, "size": end - at, "requested_size": 0, "state": "inactive", "frames": []})
            allocated = sum(b.block_bytes for b in inside)
            segments.append(
                {
                    "device": device,
                    "address": start,
                    "total_size": span.block_bytes,
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": sum(b.requested_bytes for b in inside),
                    "stream": inside[0].stream if inside else 0,
                    "segment_type": "large",
                    "segment_pool_id": pool,
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
    return segments


def _whole_snapshot() -> Dict[str, Any]:
    """``streampool.snapshot()`` with PyTorch's memory pools as PyTorch lists them: their
    segments under their pool ids (what graph trees look for), the rest as held blocks."""
    from ._timeline import snapshot

    snap = snapshot()
    pooled: List[Dict[str, Any]] = []
    for device in range(_lib.device_count()):
        for pool in pool_ids(device):
            pooled.extend(_pool_segments(pool, [device]))
    inside = {(s["device"], b["address"]) for s in pooled for b in s["blocks"]}
    rest = [s for s in snap["segments"] if (s["device"], s["address"]) not in inside]
    snap["segments"] = rest + pooled
    for device in range(_lib.device_count()):
        listed = sum(s["total_size"] for s in snap["segments"] if s["device"] == device)
        unheld = _lib.reserved_total(device)[0] - listed
        if unheld > 0:
            snap["segments"].append(_unheld_segment(device, unheld))
    return snap


def _unheld_segment(device: int, size: int) -> Dict[str, Any]:
    """The memory ``device``'s pools reserve and streampool does not hold (free inside a CUDA
    pool, or in the vmm backend's mapped pages), as one inactive segment: so that the segments add
    up to ``memory_reserved()``, as PyTorch's do. The pools' own layout is not visible, so it has
    no address (0)."""
    block = {"address": 0, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
    return {
        "device": device,
        "address": 0,
        "total_size": size,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [block],
        "streampool_unheld": True,
    }


def memory_snapshot(arg: Any = None) -> Dict[str, Any]:
    """``torch._C._cuda_memorySnapshot`` under streampool: None or pool (0, 0) gives the whole
    timeline and every block held, PyTorch's memory pools under their ids; another pool id,
    that pool's segments and blocks."""
    if arg is None:
        return _whole_snapshot()
    pool = _pool_id(tuple(arg)[:2])
    include_traces = bool(arg[2]) if len(arg) > 2 else True
    if pool == (0, 0):
        snap = _whole_snapshot()
        if not include_traces:
            snap["device_traces"] = [[] for _ in snap["device_traces"]]
        return snap
    return {
        "segments": _pool_segments(pool),
        "device_traces": [[] for _ in range(_lib.device_count())],
        "allocator_settings": {"allocator": "streampool", "version": _lib.version()},
    }


# (owner, attribute, original) replaced by route(); restore() puts them back (tests).
_saved: List[tuple] = []


# What torch.cuda.memory._set_allocator_settings calls, by PyTorch version.
SETTINGS_FUNCTIONS = (
    "_cuda_cudaCachingAllocator_set_allocator_settings",
    "_accelerator_setAllocatorSettings",
)

# The C++ method the checkpoint routes need (the feature name the library reports).
CHECKPOINTS = "torch.compile CUDA graph trees (setCheckpointPoolState)"


def route(torch: Any, checkpoints: bool = True) -> List[str]:
    """Routes the ``torch._C`` functions PyTorch calls from Python to streampool's answers (the
    checkpoint ones only if ``checkpoints``: the C++ method they end in is wired); returns the
    names left alone."""
    from ._alloc_conf import set_allocator_settings

    original_set = getattr(torch._C, "_cuda_setCheckpointPoolState", None)
    replacements = {
        "_cuda_record_memory_history": record_memory_history,
        "_cuda_record_memory_history_legacy": record_memory_history_legacy,
        "_cuda_memorySnapshot": memory_snapshot,
    }
    # torch.cuda.memory._set_allocator_settings calls one of two names, by PyTorch version (the
    # older CUDA one, or the accelerator-wide one since 2.9): whichever exists is routed.
    settings = [name for name in SETTINGS_FUNCTIONS if getattr(torch._C, name, None) is not None]
    for name in settings:
        replacements[name] = set_allocator_settings(getattr(torch._C, name))
    if not settings:
        replacements[SETTINGS_FUNCTIONS[0]] = None
    if checkpoints:
        replacements.update(
            {
                "_cuda_checkPoolLiveAllocations": check_pool_live_allocations,
                "_cuda_getCheckpointState": get_checkpoint_state,
                "_cuda_setCheckpointPoolState": (
                    _set_checkpoint_pool_state(torch, original_set) if original_set is not None else None
                ),
            }
        )
    missing = []
    for name, function in replacements.items():
        original = getattr(torch._C, name, None)
        if original is None or function is None:
            missing.append(name)
            continue
        _saved.append((torch._C, name, original))
        setattr(torch._C, name, function)
    return missing


def restore() -> int:
    """Undo route() (for tests); returns how many functions were put back."""
    count = len(_saved)
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)
    return count


def wire(torch: Any, raw: Any) -> Dict[str, Optional[str]]:
    """Everything above, after ``change_current_allocator``: feature -> None (wired) or why not.
    Logs one warning per feature that stays unavailable."""
    features: Dict[str, Optional[str]] = {}
    for setter in wire_pool_hooks(raw):
        features[f"memory pools ({setter})"] = "this PyTorch has no such setter"
    try:
        features.update(attach())
    except _lib.StreampoolError as exc:
        features["PyTorch's C++ allocator methods"] = str(exc)
    checkpoints = features.get(CHECKPOINTS, "not attached") is None
    for name in route(torch, checkpoints):
        features[f"torch._C.{name}"] = "this PyTorch has no such function"
    for feature, why in features.items():
        if why is not None:
            _log.warning("streampool: %s stays unavailable under install(): %s", feature, why)
    return features

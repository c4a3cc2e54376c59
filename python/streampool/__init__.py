"""streampool: a PyTorch CUDA allocator, a small Rust layer over its own virtual-memory pool (the
default) or CUDA stream-ordered pools.

Typical use, before any CUDA work in the process::

    import streampool
    streampool.install(release_threshold="8GiB")
    ...
    print(streampool.memory_summary())

Or, scoped to a region (works after CUDA is initialised)::

    with torch.cuda.use_mem_pool(streampool.mempool()):
        ...

Importing this package needs neither torch nor a GPU; the library is loaded on first use.
All sizes are in bytes. Every failure of the library raises :class:`StreampoolError` (or a
subclass) with the library's message.
"""

import contextlib
import ctypes
import operator
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

from . import _lib
from ._device import device_index
from ._lib import (
    ConfigError,
    DriverError,
    InvalidArgumentError,
    LibraryError,
    OutOfMemoryError,
    StreampoolError,
    UnknownPointerError,
)
from ._stats import stats_dict, summary
from ._ipc import ipc_collect, ipc_supported, open_shared, share, shareable, shared_block_count
from ._timeline import dump_snapshot, history, plot_timeline, record_history, snapshot
from ._torch import install, is_installed, mempool

__all__ = [
    "ConfigError",
    "DriverError",
    "InvalidArgumentError",
    "LibraryError",
    "OutOfMemoryError",
    "StreampoolError",
    "UnknownPointerError",
    "device_count",
    "driver_name",
    "dump_snapshot",
    "empty_cache",
    "enable_peer_access",
    "history",
    "install",
    "ipc_collect",
    "ipc_supported",
    "is_installed",
    "is_out_of_memory",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "mempool",
    "open_shared",
    "plot_timeline",
    "record_history",
    "reset_peak_memory_stats",
    "release_sleep_buffer",
    "reserve_sleep_buffer",
    "set_release_threshold",
    "share",
    "shareable",
    "shared_block_count",
    "sleep",
    "sleep_host_buffer_bytes",
    "sleep_saved_bytes",
    "sleeping_bytes",
    "snapshot",
    "tag",
    "trim",
    "wake",
]

Device = Any  # None, int, "cuda", "cuda:N" or torch.device
Size = Union[int, str]  # bytes, or "8GiB", "512MB", "80%", "max"


def __getattr__(name: str) -> str:
    # __version__ comes from the library, loaded only when asked for.
    if name == "__version__":
        return _lib.version()
    raise AttributeError(f"module 'streampool' has no attribute {name!r}")


OUT_OF_MEMORY_PREFIX = "CUDA out of memory."


def is_out_of_memory(error: BaseException) -> bool:
    """True if ``error`` is a CUDA out-of-memory error, whichever allocator raised it.

    With ``install()``, PyTorch raises streampool's out-of-memory error as its own typed
    ``torch.cuda.OutOfMemoryError`` (a ``RuntimeError``), so ``except torch.OutOfMemoryError``
    works; on a PyTorch whose exception type streampool cannot find (the install log says so) it
    is a plain ``RuntimeError("CUDA out of memory. ...")``. This accepts both, and
    streampool's own ``OutOfMemoryError``::

        try:
            step()
        except RuntimeError as exc:
            if not streampool.is_out_of_memory(exc):
                raise
            ...  # smaller batch, free caches, retry
    """
    if isinstance(error, OutOfMemoryError):
        return True
    torch = sys.modules.get("torch")
    typed = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(typed, type) and isinstance(error, typed):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith(OUT_OF_MEMORY_PREFIX)


def library_path() -> str:
    """Path of the libstreampool.so in use (see ``STREAMPOOL_LIBRARY``)."""
    return str(_lib.library_path())


def driver_name() -> str:
    """"cuda" or "sim" (``STREAMPOOL_DRIVER``)."""
    return _lib.driver_name()


def device_count() -> int:
    """Number of devices the driver sees."""
    return _lib.device_count()


def memory_stats(device: Device = None) -> Dict[str, int]:
    """Statistics of ``device`` under ``torch.cuda.memory_stats()`` names (bytes and counts),
    plus streampool's ``cached_bytes``, ``cache_hits``, ``pool_used_bytes``,
    ``memory_limit_bytes`` (2**64 - 1 when no limit is set), ``device_total_bytes``,
    ``num_growth_syncs``, the vmm backend's driver calls (``num_maps``, ``num_unmaps``,
    ``num_mem_creates``, ``num_mem_releases``, ``num_set_access_calls``), blocks handed to a stream
    after a GPU-side wait (``num_stream_waits``) and idle releases (``num_idle_releases``).
    ``reserved_bytes.all.*`` are ``memory_reserved()`` and ``max_memory_reserved()``, read at the
    same moment as the rest: read again while another thread's allocation or free ends between
    the two reads, up to 64 times (a storm of allocations that long gets the last reading)."""
    index = device_index(device)
    return stats_dict(*_lib.stats_with_reserved(index))


def memory_allocated(device: Device = None) -> int:
    """Bytes requested by live allocations."""
    return _lib.get_stats(device_index(device)).allocated_bytes


def max_memory_allocated(device: Device = None) -> int:
    """Peak of memory_allocated since start or reset_peak_memory_stats, in bytes."""
    return _lib.get_stats(device_index(device)).allocated_bytes_peak


def memory_reserved(device: Device = None) -> int:
    """Bytes streampool holds from CUDA on the device, in bytes: its pools, the shareable pool,
    graph memory — what ``torch.cuda.memory_reserved()`` says under install(), and what the
    segments of ``torch.cuda.memory_snapshot()`` add up to."""
    return _lib.reserved_total(device_index(device))[0]


def max_memory_reserved(device: Device = None) -> int:
    """Peak of memory_reserved since start or reset_peak_memory_stats, in bytes: each pool's own
    peak added up (at or above the peak of their sum), plus graph memory and the segments of
    memory pools with an allocator of their own as they are now."""
    return _lib.reserved_total(device_index(device))[1]


def reset_peak_memory_stats(device: Device = None) -> None:
    """Set the peaks (allocated, active, reserved, allocation count) to the current values."""
    index = device_index(device)
    _lib.get_stats(index)  # raises InvalidArgumentError naming a bad index
    _lib.call_reporting("streampool_reset_peak_stats", index)


def memory_summary(device: Device = None) -> str:
    """A readable table of the device's statistics, like ``torch.cuda.memory_summary()``."""
    index = device_index(device)
    return summary(index, _lib.driver_name(), *_lib.stats_with_reserved(index))


def empty_cache() -> None:
    """Return cached blocks to the pools, synchronise and trim the pools to 0 bytes
    (also what ``torch.cuda.empty_cache()`` does once streampool is installed)."""
    _lib.call_reporting("streampool_empty_cache")


def _bytes(value: Size, index: int, what: str) -> int:
    """``value`` in bytes: an int as is, a string resolved by the library for device ``index``."""
    if isinstance(value, str):
        return _lib.parse_bytes(value, index)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**64:
            raise ValueError(f"{what} must be >= 0 and < 2**64 bytes (a uint64), got {value}")
        return value
    raise TypeError(f"{what} must be bytes (int) or a string like '8GiB', '80%', 'max', not {value!r}")


def set_release_threshold(value: Size, device: Device = None) -> int:
    """Set the pool's release threshold: bytes the pool keeps reserved across synchronisations.
    Accepts bytes or "8GiB", "80%" (of device memory), "max". Returns the threshold in bytes."""
    index = device_index(device)
    threshold = _bytes(value, index, "release threshold")
    _lib.check(_lib.library().streampool_set_release_threshold(index, threshold))
    return threshold


def sleep(level: int = 1, device: Device = None, discard: Optional[Iterable[str]] = None) -> int:
    """Give all of ``device``'s memory back to the GPU while every tensor keeps its address
    (the vmm backend, ``STREAMPOOL_BACKEND=vmm``): the device is synchronised first; at level 1
    what live tensors hold waits in page-locked host memory, at level 2 it is discarded.
    ``discard`` names tags (:func:`tag`): at level 1 the contents of tensors made under one of
    them are discarded too, the rest kept (a tensor sharing a memory page with a kept one may
    keep its contents). Allocating on the device raises until :func:`wake`. Returns the bytes
    given back. Shared tensors every receiver has released are let go first (:func:`ipc_collect`).
    Raises InvalidArgumentError (and changes nothing) on the pool backend, during a CUDA graph
    capture, when asleep already, while a tensor shared page by page (:func:`share` under a plain
    ``install()``) is still held for a receiver, when the host memory cannot be pinned, or when
    ``discard`` names a tag no thread ever used; a copy that fails leaves the device awake with
    every kept tensor's contents (memory no tensor used may have gone back, as ``empty_cache()``
    gives it, and tensors of the discarded tags may have lost theirs, as the sleep would have);
    in the rare case that the memory already given back cannot be mapped again, the device is
    left asleep, the error says so, and :func:`wake` restores it."""
    index, level = device_index(device), _sleep_level(level)  # checked before the library is asked
    if shared_block_count():
        ipc_collect()  # their blocks, freed, no longer keep the device from sleeping
    given_back = ctypes.c_uint64()
    names = _tag_names(discard)
    if names:
        tags = (ctypes.c_char_p * len(names))(*names)
        status = _lib.library().streampool_sleep_discarding(
            index, level, tags, len(names), ctypes.byref(given_back)
        )
    else:
        status = _lib.library().streampool_sleep(index, level, ctypes.byref(given_back))
    _lib.check(status)
    return given_back.value


def _sleep_level(level: Any) -> int:
    """``level`` as sleep() takes it: 1 or 2, an integer (a NumPy one too; not a bool, a float
    or a string, which int() would turn into one, nor one that a C int would wrap into range)."""
    try:
        if isinstance(level, bool):
            raise TypeError
        level = operator.index(level)
    except TypeError:
        raise TypeError(f"sleep(level=...) must be the int 1 or 2, not {type(level).__name__} {level!r}") from None
    if level not in (1, 2):
        raise InvalidArgumentError(
            f"sleep(level={level!r}): the level is 1 (tensors' contents kept in page-locked host "
            "memory) or 2 (discarded)"
        )
    return level


def _tag_name(name: str) -> bytes:
    """A tag name as the library takes it: UTF-8 without NUL (the library checks the rest)."""
    if not isinstance(name, str):
        raise TypeError(f"a tag name must be a str, not {type(name).__name__}")
    if "\0" in name:
        raise InvalidArgumentError(f"tag name {name!r} contains a NUL character")
    # surrogatepass: a name that is not UTF-8 reaches the library, which says so.
    return name.encode("utf-8", "surrogatepass")


def _tag_names(discard: Optional[Iterable[str]]) -> List[bytes]:
    """The tag names of ``sleep(discard=...)``; one str is one name."""
    if discard is None:
        return []
    if isinstance(discard, str):
        discard = [discard]
    return [_tag_name(name) for name in discard]


@contextlib.contextmanager
def tag(name: str) -> Iterator[None]:
    """Inside the block, memory this thread allocates carries the tag ``name`` (1 to 256 bytes
    of UTF-8), so that ``sleep(discard=[name])`` discards what it holds and keeps the rest.
    Tags nest (the innermost applies) and are per thread: allocations made on other threads —
    autograd's backward pass included — carry their own thread's tag, or none. Only the vmm
    backend uses tags; elsewhere they mark nothing. A tag follows the thread, not an asyncio
    task: do not hold one across an ``await`` (another task of the thread would allocate under
    it). A process may use at most 4096 distinct names (never forgotten): tag kinds of memory,
    not requests."""
    encoded = _tag_name(name)
    _lib.check(_lib.library().streampool_tag_push(encoded))
    try:
        yield
    except BaseException:
        _lib.library().streampool_tag_pop()  # the body's exception is the one to see
        raise
    _lib.check(_lib.library().streampool_tag_pop())


def wake(device: Device = None) -> int:
    """Map memory again under every live tensor where ``device`` slept, at the same addresses,
    and restore what a level-1 sleep saved; tensors, CUDA graphs and compiled code keep working
    (memory no tensor used was given back as ``empty_cache()`` gives it back, and is mapped again
    when an allocation needs it; so is the memory of tensors freed while asleep). Returns the
    bytes restored. Raises InvalidArgumentError when the device is not asleep (on the pool backend
    it never is). Out of memory part way raises OutOfMemoryError; what was restored stays, and
    calling wake() again goes on. The page-locked host buffer a level-1 sleep used is kept for
    the next sleep (pinning gigabytes again would take longer than the copies):
    :func:`release_sleep_buffer` gives it back."""
    index = device_index(device)
    restored = ctypes.c_uint64()
    _lib.check(_lib.library().streampool_wake(index, ctypes.byref(restored)))
    return restored.value


def sleeping_bytes(device: Device = None) -> int:
    """Bytes of ``device`` asleep now: the memory under the tensors live when it went to sleep
    (0 when awake, and on the pool backend, which never sleeps). A tensor freed while asleep
    stays counted until :func:`wake`, which does not map its memory again (once the work queued
    before its free has finished)."""
    index = device_index(device)
    out = ctypes.c_uint64()
    _lib.check(_lib.library().streampool_sleeping_bytes(index, ctypes.byref(out)))
    return out.value


def sleep_saved_bytes(device: Device = None) -> int:
    """Bytes of the sleeping ``device``'s contents waiting in page-locked host memory (0 when
    awake, or when nothing was kept)."""
    index = device_index(device)
    out = ctypes.c_uint64()
    _lib.check(_lib.library().streampool_sleep_saved_bytes(index, ctypes.byref(out)))
    return out.value


def sleep_host_buffer_bytes(device: Device = None) -> int:
    """Bytes of page-locked host memory ``device`` holds for sleeping: the buffer of a sleep's
    saved contents, and the one kept after :func:`wake` for the next level-1 sleep (0 if
    none)."""
    index = device_index(device)
    out = ctypes.c_uint64()
    _lib.check(_lib.library().streampool_sleep_host_buffer_bytes(index, ctypes.byref(out)))
    return out.value


def release_sleep_buffer(device: Device = None) -> int:
    """Free the page-locked host buffer ``device`` keeps after :func:`wake` for its next level-1
    sleep; returns the bytes freed (0 if none was kept). Raises InvalidArgumentError while the
    buffer holds the contents of the device's sleep."""
    index = device_index(device)
    freed = ctypes.c_uint64()
    _lib.check(_lib.library().streampool_release_sleep_buffer(index, ctypes.byref(freed)))
    return freed.value


def reserve_sleep_buffer(device: Device = None, *, size: Optional[Size] = None) -> int:
    """Page-lock now the host memory ``device``'s next level-1 :func:`sleep` copies its contents
    into, so that the sleep does not have to: pinning is the first sleep's slowest step (several
    times the copy's time). ``size`` is bytes or "8GiB", "80%" (of device memory); None reserves
    what live tensors hold now. The call takes as long as the pinning (seconds for tens of GiB)
    but holds no lock of the device meanwhile and releases the GIL: from a thread of its own,
    training goes on beside it. A buffer kept after an earlier sleep or reservation that is at
    least that large stays as it is; :func:`release_sleep_buffer` frees it. Returns the bytes of
    the buffer kept. Raises InvalidArgumentError on the pool backend, while the device is asleep,
    or when the host memory cannot be page-locked (a buffer kept before stays)."""
    index = device_index(device)
    wanted = 0 if size is None else _bytes(size, index, "size")
    if wanted == 0 and size is not None:
        raise InvalidArgumentError("reserve_sleep_buffer: size must be more than 0 (None: what "
                                   "live tensors hold now)")
    reserved = ctypes.c_uint64()
    _lib.check(
        _lib.library().streampool_reserve_sleep_buffer(index, wanted, ctypes.byref(reserved))
    )
    return reserved.value


def trim(keep_bytes: Size = 0, device: Device = None) -> None:
    """Flush streampool's cache, synchronise and shrink the device's pools to ``keep_bytes``
    reserved; the pool of :func:`shareable` allocations, where it is one of its own, keeps none."""
    index = device_index(device)
    _lib.check(_lib.library().streampool_trim(index, _bytes(keep_bytes, index, "keep_bytes")))


def enable_peer_access(device: Device = None) -> None:
    """Let every other device read and write ``device``'s pool (every device's pool if
    ``device`` is "all"), through ``cuMemPoolSetAccess``. Raises InvalidArgumentError naming any
    device pair without peer capability (``cuDeviceCanAccessPeer``), after granting the rest.

    By default (``STREAMPOOL_PEER_ACCESS=auto``) devices the process allocates on already get
    access to each other's pools, which PyTorch's cross-device copies need."""
    index = -1 if device == "all" else device_index(device)
    _lib.check(_lib.library().streampool_enable_peer_access(index))

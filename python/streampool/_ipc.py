"""Sharing CUDA tensors between processes: through streampool's shareable pools, or, on the vmm
backend, page by page (any tensor: every page is exportable where the device allows).

The exporting process keeps each shared block alive until every process that received it has
released it. Each handle it sends gets one byte in a file under /dev/shm that only the receiver
writes (1 = released), so no lock is needed; ``ipc_collect()`` (also run by every ``share``)
lets go of blocks whose bytes are all 1. A receiver releases its import (freeing it, waiting
for its device) when its tensor is freed, or at exit at the latest.

The pool's file descriptor, or the pages' descriptors, travel the way ``multiprocessing`` passes
descriptors (``multiprocessing.reduction.DupFd``); the rest of a handle is bytes. An exporter
keeps a block's page descriptors until every receiver has released it.
"""

import atexit
import contextlib
import ctypes
import logging
import mmap
import os
import re
import tempfile
import threading
import uuid
import weakref
from multiprocessing import resource_sharer
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import DupFd
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _lib
from ._device import device_index
from ._torch import _import_torch

_log = logging.getLogger("streampool")

# --- the scope ------------------------------------------------------------------------------


@contextlib.contextmanager
def shareable() -> Iterator[None]:
    """Inside the block, this thread's CUDA allocations come from the device's shareable pool, so
    tensors made there can be sent to other processes (``torch.multiprocessing`` queues, or
    :func:`share`). Without it, only ``install(ipc=True)`` makes memory shareable."""
    depth = _lib.library().streampool_shareable_begin()
    if depth < 0:
        _lib.check(depth)
    try:
        yield
    finally:
        status = _lib.library().streampool_shareable_end()
        if status < 0:
            _lib.check(status)


def ipc_supported(device: Any = 0) -> bool:
    """True if ``device`` (None = current device, an int, "cuda:N" or a torch.device) can share
    pool memory with other processes (POSIX file descriptors)."""
    return _lib.device_flag("streampool_ipc_supported", device_index(device))


# --- release bytes ---------------------------------------------------------------------------


class _ReleaseBytes:
    """Exporter side: one byte per handle sent, in files other processes map (0 = in use)."""

    FILE_BYTES = 1 << 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: Dict[str, mmap.mmap] = {}
        self._path: Optional[str] = None
        self._next = 0

    def allocate(self) -> Tuple[str, int]:
        with self._lock:
            if self._path is None or self._next == self.FILE_BYTES:
                self._path = self._new_file()
                self._next = 0
            index, self._next = self._next, self._next + 1
            return self._path, index

    def _new_file(self) -> str:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = os.path.join(folder, f"streampool-ipc-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        with open(path, "w+b") as f:
            f.truncate(self.FILE_BYTES)
            self._maps[path] = mmap.mmap(f.fileno(), self.FILE_BYTES)
        atexit.register(_unlink_quietly, path)
        return path

    def released(self, slot: Tuple[str, int]) -> bool:
        path, index = slot
        return self._maps[path][index] == 1


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


_received_maps: Dict[str, Optional[mmap.mmap]] = {}
_received_lock = threading.Lock()


def _mark_released(slot: Tuple[str, int]) -> None:
    """Receiver side: tell the exporter this handle is released (nothing to tell if it exited)."""
    path, index = slot
    with _received_lock:
        if path not in _received_maps:
            try:
                with open(path, "r+b") as f:
                    _received_maps[path] = mmap.mmap(f.fileno(), 0)
            except OSError:
                _received_maps[path] = None  # the exporter is gone, and its memory with it
        mapped = _received_maps[path]
    if mapped is not None:
        mapped[index] = 1


# --- exporting -------------------------------------------------------------------------------


class BlockHandle:
    """What another process needs to map one shared block; picklable (the pool's file
    descriptor is passed by ``multiprocessing``'s descriptor sharing). Each pickling is one
    receiver: it gets its own release byte, and the exporter keeps the block until every
    receiver has released it."""

    def __init__(self, raw: bytes, key: Tuple[str, int], fd: int, slot: Optional[Tuple[str, int]], nbytes: int,
                 owned_fd: bool = False, sent_key: Optional[Tuple[int, int, str]] = None,
                 page_fds: Optional[List[int]] = None):
        self.raw, self.key, self.fd, self.slot, self.nbytes = raw, key, fd, slot, nbytes
        self.owned_fd, self.sent_key = owned_fd, sent_key
        # A block shared page by page: one descriptor per page (``raw`` is a StreampoolIpcPages).
        self.page_fds = page_fds

    @property
    def device(self) -> int:
        return self.key[1]

    def __reduce__(self) -> Any:
        if self.sent_key is None:
            raise RuntimeError("a received streampool handle cannot be sent on: send from the process that shared it")
        slot = _add_receiver(self.sent_key)
        if self.page_fds is not None:
            dups = [_dup_fd(fd) if fd >= 0 else None for fd in self.page_fds]
            return (_rebuild_page_handle, (self.raw, self.key, dups, slot, self.nbytes))
        return (_rebuild_block_handle, (self.raw, self.key, _dup_fd(self.fd), slot, self.nbytes))


def _dup_fd(fd: int) -> Any:
    """``multiprocessing``'s descriptor passing for ``fd``. While a process is being spawned (a
    tensor among its arguments), one object per descriptor: the spawn passes each descriptor once
    and refuses duplicates."""
    popen = get_spawning_popen()
    if popen is None:
        return DupFd(fd)  # through the resource sharer: a new descriptor per receiver
    passed = popen.__dict__.setdefault("_streampool_fds", {})
    if fd not in passed:
        passed[fd] = DupFd(fd)
    return passed[fd]


def _received_fd(dup: Any) -> int:
    """The descriptor ``dup`` brought, this handle's own."""
    fd = dup.detach()
    if not isinstance(dup, resource_sharer.DupFd):
        fd = os.dup(fd)  # inherited at spawn and shared by every handle that came with it
    return fd


def _rebuild_block_handle(raw: bytes, key: Tuple[str, int], dup: Any, slot: Tuple[str, int], nbytes: int) -> BlockHandle:
    return BlockHandle(raw, key, _received_fd(dup), slot, nbytes, owned_fd=True)


def _rebuild_page_handle(raw: bytes, key: Tuple[str, int], dups: List[Any], slot: Tuple[str, int], nbytes: int) -> BlockHandle:
    page_fds = [_received_fd(d) if d is not None else -1 for d in dups]
    return BlockHandle(raw, key, -1, slot, nbytes, owned_fd=True, page_fds=page_fds)


class _Export:
    """One export of a block: its event, its page descriptors (page sharing), the release bytes
    of its receivers. Let go of once it has receivers and all of them released it."""

    def __init__(self, event: int, fds: List[int]):
        self.event, self.fds = event, fds
        self.slots: List[Tuple[str, int]] = []

    def released(self) -> bool:
        return bool(self.slots) and all(map(_release_bytes.released, self.slots))


class _Sent:
    """A block this process shared: kept (``keep``) while any of its exports is not let go of."""

    def __init__(self, keep: Any, device: int):
        self.keep, self.device = keep, device
        self.exports: Dict[str, _Export] = {}


_release_bytes = _ReleaseBytes()
# (device, address) -> the block's exports; a handle names its export by (device, address, id),
# so a handle whose export was let go of is refused even if the address is shared again.
_sent: Dict[Tuple[int, int], _Sent] = {}
_sent_lock = threading.Lock()
# (device, pool fd) -> a random name for that pool, so receivers never mix up two exporters'
# pools (a process id can be reused).
_pool_names: Dict[Tuple[int, int], str] = {}


# How a block can be shared (streampool_ipc_kind).
_KIND_PAGES = 2


def share_block(ptr: int, device: int, stream: Optional[int], keep: Any, nbytes: int) -> BlockHandle:
    """Export the block at ``ptr`` (shareable: from a shareable pool, or any block of the vmm
    backend): ready after the work queued on ``stream``, kept alive (by holding ``keep``) until
    every receiver of the returned handle has released it."""
    ipc_collect()
    if ptr in _imported_ptrs and (device, ptr) not in _sent:  # (blocks shared from here)
        raise RuntimeError(
            "this tensor was received from another process and cannot be sent on: send it from the "
            "process that shared it"
        )
    kind = _lib.library().streampool_ipc_kind(ptr, device)
    if kind < 0:
        _lib.check(kind)
    if kind == _KIND_PAGES:
        return _share_pages(ptr, device, stream, keep, nbytes)
    raw = _lib.StreampoolIpcHandle()
    _lib.check(_lib.library().streampool_ipc_export(ptr, device, stream, ctypes.byref(raw)))
    with _sent_lock:
        sent_key = _add_export(device, ptr, keep, _Export(raw.event, []))
        name = _pool_names.setdefault((device, raw.pool_fd), uuid.uuid4().hex)
    return BlockHandle(bytes(raw), (name, device), raw.pool_fd, None, nbytes, sent_key=sent_key)


def _share_pages(ptr: int, device: int, stream: Optional[int], keep: Any, nbytes: int) -> BlockHandle:
    """:func:`share_block` for a block of the vmm backend: one descriptor per page."""
    pages = _lib.StreampoolIpcPages()
    # Pages are at least 1 MiB (the device's granule is 2 MiB); a span (one handle for several
    # pages, up to 256 MiB by default) may add pages before and after the block (-1 entries). Too
    # little room is an error naming the room needed (nothing made, nothing left open): asked again.
    room = nbytes // (1 << 20) + 3 + 2 * 256
    for _ in range(2):
        fds = (ctypes.c_int * room)()
        status = _lib.library().streampool_ipc_export_pages(ptr, device, stream, ctypes.byref(pages), fds, room)
        needed = re.search(r"needs room for (\d+) descriptors", _lib.last_error()) if status else None
        if needed is None or int(needed.group(1)) <= room:
            break
        room = int(needed.group(1))
    _lib.check(status)
    page_fds = list(fds[: pages.page_count])
    with _sent_lock:
        sent_key = _add_export(device, ptr, keep, _Export(pages.event, page_fds))
    key = (uuid.uuid4().hex, device)
    return BlockHandle(bytes(pages), key, -1, None, nbytes, sent_key=sent_key, page_fds=page_fds)


def _add_export(device: int, ptr: int, keep: Any, export: _Export) -> Tuple[int, int, str]:
    """Records ``export`` of the block ``(device, ptr)`` (under ``_sent_lock``); its key."""
    sent = _sent.setdefault((device, ptr), _Sent(keep, device))
    export_id = uuid.uuid4().hex
    sent.exports[export_id] = export
    return (device, ptr, export_id)


def _add_receiver(sent_key: Tuple[int, int, str]) -> Tuple[str, int]:
    """A release byte for one more receiver of the export ``sent_key``."""
    slot = _release_bytes.allocate()
    with _sent_lock:
        sent = _sent.get(sent_key[:2])
        export = sent.exports.get(sent_key[2]) if sent is not None else None
        if export is None:
            raise RuntimeError("this handle's block was already released by its receivers: call share() again")
        export.slots.append(slot)
    return slot


def ipc_collect() -> int:
    """Let go of shared blocks every receiver has released (their memory can then be reused);
    returns how many. ``share`` runs it too. A block no receiver has taken yet is kept. Every
    export let go of is released even if one release fails (the first failure is raised)."""
    finished: List[Tuple[int, _Export]] = []
    with _sent_lock:
        for key, sent in list(_sent.items()):
            for export_id, export in list(sent.exports.items()):
                if export.released():
                    finished.append((sent.device, sent.exports.pop(export_id)))
        blocks = [key for key, sent in _sent.items() if not sent.exports]
        for key in blocks:
            del _sent[key]
    first_error: Optional[BaseException] = None
    for device, export in finished:
        for fd in export.fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            _lib.check(_lib.library().streampool_ipc_release_export(device, export.event))
        except Exception as exc:  # noqa: BLE001  (the others are released first)
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return len(blocks)


def shared_block_count() -> int:
    """Blocks this process shared that some receiver has not released yet."""
    with _sent_lock:
        return len(_sent)


# --- importing -------------------------------------------------------------------------------

_imported_pools: Dict[Tuple[str, int], int] = {}
_imported_ptrs: Dict[int, int] = {}  # address -> open imports of it, in this process
_open_imports: "weakref.WeakSet[ImportedBlock]" = weakref.WeakSet()
_import_lock = threading.Lock()


def _pool_token(handle: BlockHandle) -> int:
    """The imported pool of ``handle`` (imported once per exporting pool); closes the handle's
    descriptor if it was received (the exporter's own stays open)."""
    with _import_lock:
        try:
            token = _imported_pools.get(handle.key)
            if token is None:
                if handle.fd < 0:
                    raise ValueError("this handle's pool descriptor was already used")
                out = ctypes.c_uint64()
                _lib.check(_lib.library().streampool_ipc_import_pool(handle.device, handle.fd, ctypes.byref(out)))
                token = _imported_pools[handle.key] = out.value
            return token
        finally:
            if handle.owned_fd and handle.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(handle.fd)
                handle.fd = -1


def _import_pages(handle: BlockHandle, stream: Optional[int], out: ctypes.c_void_p) -> None:
    """Maps a block shared page by page; the received descriptors are closed either way."""
    fds = handle.page_fds or []
    if not fds:
        raise ValueError("this handle's page descriptors were already used")
    try:
        raw = _lib.StreampoolIpcPages.from_buffer_copy(handle.raw)
        array = (ctypes.c_int * len(fds))(*fds)
        _lib.check(
            _lib.library().streampool_ipc_import_pages(ctypes.byref(raw), array, len(fds), stream, ctypes.byref(out))
        )
    finally:
        if handle.owned_fd:  # received: this handle's own descriptors
            for fd in fds:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            handle.page_fds = []


class ImportedBlock:
    """A block of another process mapped here; released by :meth:`close`, when garbage collected,
    or at exit. Exposes ``__cuda_array_interface__`` (bytes) for ``torch.as_tensor``."""

    def __init__(self, handle: BlockHandle, stream: Optional[int]):
        self.ptr: Optional[int] = None
        self._lock = threading.Lock()
        if handle.slot is None:
            raise ValueError("open a handle in the process it was sent to (pickle it there), not in the exporter")
        try:
            out = ctypes.c_void_p()
            if handle.page_fds is not None:
                _import_pages(handle, stream, out)
            else:
                token = _pool_token(handle)
                raw = _lib.StreampoolIpcHandle.from_buffer_copy(handle.raw)
                _lib.check(_lib.library().streampool_ipc_import(token, ctypes.byref(raw), stream, ctypes.byref(out)))
        except BaseException:
            _mark_released(handle.slot)  # never mapped here: the exporter need not wait for us
            raise
        self.ptr = out.value
        self.device, self.nbytes, self._slot, self._stream = handle.device, handle.nbytes, handle.slot, stream
        with _import_lock:
            _imported_ptrs[self.ptr] = _imported_ptrs.get(self.ptr, 0) + 1
        _open_imports.add(self)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if self.ptr is None:
            raise ValueError("the imported block was closed")
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}

    def close(self) -> None:
        """Unmap the block and tell the exporter (after this process's work on it is done)."""
        with self._lock:
            ptr, self.ptr = self.ptr, None
            if ptr is None:
                return
            status = _lib.library().streampool_ipc_close(ptr, self._stream)
            if status != _lib.OK:
                self.ptr = ptr  # still mapped: a later close (or the one at exit) tries again
                _lib.check(status)
        with _import_lock:
            left = _imported_ptrs.pop(ptr, 1) - 1
            if left:
                _imported_ptrs[ptr] = left
        _mark_released(self._slot)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001  (a finalizer must not raise)
            _log.warning("streampool: releasing an imported block failed: %s", exc)


@atexit.register
def _close_imports_at_exit() -> None:
    """A receiver that exits still releases what it imported, so the exporter can reuse it."""
    for block in list(_open_imports):
        with contextlib.suppress(Exception):
            block.close()


# --- tensors ---------------------------------------------------------------------------------


class SharedTensor:
    """A picklable handle to a CUDA tensor in a shareable pool: :func:`open_shared` turns it into
    a tensor on the same memory in the receiving process."""

    def __init__(self, block: BlockHandle, dtype: Any, size: Tuple[int, ...], stride: Tuple[int, ...], offset: int, requires_grad: bool):
        self.block, self.dtype, self.size, self.stride = block, dtype, size, stride
        self.offset, self.requires_grad = offset, requires_grad


def share(tensor: Any) -> SharedTensor:
    """A handle to ``tensor``'s memory for another process. On the vmm backend any tensor can be
    shared (page by page); on the pool backend it must come from a shareable pool (``with
    streampool.shareable():`` or ``install(ipc=True)``). Its memory stays allocated here until the
    receiver releases it. The receiver sees the data as of now (an event on the
    current stream)."""
    torch = _import_torch("share")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise TypeError(f"streampool.share() takes a CUDA tensor, not {type(tensor).__name__}")
    storage = tensor.untyped_storage()
    device = tensor.device.index
    stream = torch.cuda.current_stream(device).cuda_stream
    block = share_block(storage.data_ptr(), device, stream, storage, storage.nbytes())
    return SharedTensor(block, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.requires_grad)


def open_shared(shared: SharedTensor) -> Any:
    """The tensor a :class:`SharedTensor` describes, on the exporting process's memory; the
    current stream waits until the exporter's data is ready."""
    torch = _import_torch("open_shared")
    device = shared.block.device
    block = ImportedBlock(shared.block, torch.cuda.current_stream(device).cuda_stream)
    with torch.cuda.device(device):
        raw = torch.as_tensor(block, device=f"cuda:{device}")  # keeps `block` alive
    tensor = torch.empty(0, dtype=shared.dtype, device=raw.device)
    tensor.set_(raw.untyped_storage(), shared.offset, shared.size, shared.stride)
    return tensor.requires_grad_(shared.requires_grad)

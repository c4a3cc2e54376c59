"""Stack frames for PyTorch's memory history under install() (``_record_memory_history``'s
``context`` and ``stacks``): the library calls :class:`Gatherer` at ``my_malloc`` (and
``my_free``) before it takes a lock; the gatherer returns an id for the calling thread's stack,
which the events of that call carry; snapshots turn ids back into PyTorch's frame dicts.

PyTorch's meanings (torch/cuda/memory.py): ``context`` None records no frames; "state" only
those of live blocks (the snapshot's segments); "alloc" also the allocations' trace entries;
"all" also the frees'. ``stacks`` "python" gives Python frames; "all" adds the native (C++)
frames, taken with glibc's ``backtrace`` and named (``dladdr``, demangled) only when a snapshot
asks.

Invariant: identical stacks share one id, so memory grows with the number of distinct call
sites, not of allocations; a gatherer that fails returns 0 (no frames), never raises into C.
"""

import atexit
import ctypes
import ctypes.util
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _lib

ALLOC, FREE = 1, 2
# PyTorch's context levels, in order: what each records.
CONTEXTS = (None, "state", "alloc", "all")
STACKS = ("python", "all")
_NATIVE_DEPTH = 64
_GATHERER = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_int)

Frame = Dict[str, Any]


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


class _Native:
    """glibc's backtrace and dladdr, and libstdc++'s demangler where loaded."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None)
        self.backtrace = libc.backtrace
        self.backtrace.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.backtrace.restype = ctypes.c_int
        self.dladdr = libc.dladdr
        self.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        self.dladdr.restype = ctypes.c_int
        self.free = libc.free
        self.free.argtypes = [ctypes.c_void_p]
        self.demangle = None
        try:
            cxx = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            self.demangle = cxx.__cxa_demangle
            self.demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            self.demangle.restype = ctypes.c_void_p
        except (OSError, AttributeError):
            pass

    def addresses(self) -> Tuple[int, ...]:
        buffer = (ctypes.c_void_p * _NATIVE_DEPTH)()
        n = self.backtrace(buffer, _NATIVE_DEPTH)
        return tuple(a or 0 for a in buffer[:n])

    def frame(self, address: int) -> Frame:
        info = _DlInfo()
        if not self.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
            return {"filename": "??", "line": 0, "name": f"{address:#x}"}
        filename = (info.dli_fname or b"??").decode("utf-8", "replace")
        name = info.dli_sname
        text = name.decode("utf-8", "replace") if name else f"{address:#x}"
        if name and self.demangle is not None:
            status = ctypes.c_int(1)
            out = self.demangle(name, None, None, ctypes.byref(status))
            if out and status.value == 0:
                text = ctypes.string_at(out).decode("utf-8", "replace")
            if out:
                self.free(out)
        return {"filename": filename, "line": 0, "name": text}


def _native() -> Optional[_Native]:
    try:
        return _Native()
    except (OSError, AttributeError):
        return None


# Frames of the Python interpreter (replaced by the Python frames they run) and of ctypes' call
# into the gatherer are left out of native stacks.
_INTERPRETER_FILES = ("python", "libpython", "_ctypes", "libffi")


class Gatherer:
    """Gives the calling thread's stack an id (``__call__``, the library's callback) and turns
    ids back into frames (``frames``)."""

    def __init__(self, stacks: str) -> None:
        self._lock = threading.Lock()
        self._ids: Dict[Tuple[Any, ...], int] = {}
        self._stacks: List[Tuple[Any, ...]] = [((), ())]  # id -> (python frames, native addresses)
        self._symbols: Dict[int, Frame] = {}
        self._native = _native() if stacks == "all" else None
        self.callback = _GATHERER(self._gather)

    def _gather(self, kind: int) -> int:
        try:
            frame = sys._getframe(1)
            python = []
            while frame is not None:
                code = frame.f_code
                python.append((code.co_filename, frame.f_lineno or 0, code.co_name))
                frame = frame.f_back
            native = self._native.addresses() if self._native is not None else ()
            key = (tuple(python), native)
            with self._lock:
                found = self._ids.get(key)
                if found is None:
                    found = self._ids[key] = len(self._stacks)
                    self._stacks.append(key)
            return found
        except BaseException:  # noqa: BLE001  (nothing may raise into the library's C entry)
            return 0

    def frames(self, context_id: int) -> List[Frame]:
        """PyTorch's frame dicts for an id (innermost first: native frames, then Python's)."""
        with self._lock:
            if not 0 < context_id < len(self._stacks):
                return []
            python, native = self._stacks[context_id]
        out = [self._symbol(a) for a in native] if native else []
        if out:
            own = [i for i, f in enumerate(out) if os.path.basename(f["filename"]).startswith("libstreampool")]
            out = out[own[-1] + 1:] if own else out  # from the allocator's caller on
            out = [f for f in out if not os.path.basename(f["filename"]).startswith(_INTERPRETER_FILES)]
        out += [{"filename": f, "line": line, "name": name} for f, line, name in python]
        return out

    def _symbol(self, address: int) -> Frame:
        frame = self._symbols.get(address)
        if frame is None and self._native is not None:
            frame = self._symbols[address] = self._native.frame(address)
        return dict(frame or {"filename": "??", "line": 0, "name": f"{address:#x}"})


class _Recording:
    """What ``record_memory_history`` asked for."""

    def __init__(self, context: Optional[str], trace: bool, max_entries: int, gatherer: Optional[Gatherer]):
        self.context = context
        self.trace = trace
        self.max_entries = max_entries
        self.gatherer = gatherer

    def level(self, at_least: str) -> bool:
        return CONTEXTS.index(self.context) >= CONTEXTS.index(at_least)


_recording: Optional[_Recording] = None
_recording_lock = threading.Lock()


def start(context: Optional[str], stacks: str, trace: bool, max_entries: int) -> None:
    """Frames from now on as ``context`` and ``stacks`` say (PyTorch's values; checked by the
    caller); ``trace`` False keeps no trace entries (``enabled="state"``); ``max_entries`` trace
    entries per device at most."""
    global _recording
    gatherer = Gatherer(stacks) if context is not None else None
    when = 0
    if gatherer is not None:
        when = ALLOC | (FREE if context == "all" else 0)
    with _recording_lock:
        _at_exit()
        address = ctypes.cast(gatherer.callback, ctypes.c_void_p).value if gatherer is not None else None
        _lib.check(_lib.library().streampool_history_set_gatherer(address, when))
        _recording = _Recording(context, trace, max_entries, gatherer)


def stop() -> None:
    """No more gathering; what was gathered stays for snapshots of what was recorded."""
    with _recording_lock:
        _lib.check(_lib.library().streampool_history_set_gatherer(None, 0))


def recording() -> Optional[_Recording]:
    return _recording


_exit_registered = False


def _at_exit() -> None:
    """Once a gatherer may be set: unset it at exit, so that no callback reaches an interpreter
    that is shutting down."""
    global _exit_registered
    if not _exit_registered:
        atexit.register(_stop_at_exit)
        _exit_registered = True


def _stop_at_exit() -> None:
    try:
        _lib.library().streampool_history_set_gatherer(None, 0)
    except Exception:  # noqa: BLE001  (at exit: nothing to report to)
        pass

"""``torch.cuda.synchronize()`` under install(): streampool is told before PyTorch's
synchronisation (``streampool_synchronizing``) and after it (``streampool_synchronized``): blocks
that waited for other streams (``record_stream``) before it began go back without a driver query,
on the vmm backend what was freed becomes ready for every stream where more than one
stream allocated or freed since the last synchronisation (so that the next requests see it
merged), and memory above a release threshold goes back at the synchronisation,
as a CUDA pool's does (and as PyTorch's own ``cudaMallocAsync`` backend gives it).

Invariant: PyTorch's synchronisation decides the outcome (an error included) the caller gets;
streampool's parts never hide it: a failure of the part before it is ignored (the part after it
then asks the driver), and of the part after it logged, not raised (the synchronisation itself
succeeded).
"""

import logging
import threading
from typing import Any, List, Tuple

from . import _lib

_log = logging.getLogger("streampool")
_lock = threading.Lock()
# (owner, name, original) replaced by route(); restore() puts them back (tests).
_saved: List[Tuple[Any, str, Any]] = []


def route(torch: Any) -> None:
    """Make ``torch._C._cuda_synchronize`` (what ``torch.cuda.synchronize()`` calls) tell
    streampool as it begins and once it has returned. Idempotent. The library's two functions
    and the device query are looked up here, once: looked up at every synchronisation they cost
    2 to 4 us more each time (bench/diag_sync.py), which a program that synchronises after every
    step of a few hundred microseconds pays at every step."""
    with _lock:
        if _saved:
            return
        original = getattr(torch._C, "_cuda_synchronize", None)
        if original is None:
            return
        lib = _lib.library()
        # The mark the end's call reads (a library older than it lacks it).
        begin = getattr(lib, "streampool_synchronizing", None)
        end = getattr(lib, "streampool_synchronized", None)
        if end is None:
            return  # an older library still: it has nothing to hear of a synchronisation
        # torch.cuda.synchronize(device) calls this inside torch.cuda.device(device), CUDA
        # initialised: the current device is the one synchronised.
        current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            try:
                device = current_device()
                if begin is not None:
                    begin(device)
            except Exception:  # noqa: BLE001  (PyTorch's synchronisation says what is wrong)
                # A failure leaves no mark: the end's call then asks the driver.
                device = None
            result = original(*args, **kwargs)
            try:
                if device is None:
                    device = current_device()
                status = end(device)
                if status != _lib.OK:
                    _lib.check(status)
            except Exception as exc:  # noqa: BLE001  (the synchronisation itself succeeded)
                _log.warning("streampool: after torch.cuda.synchronize(): %s", exc)
            return result

        synchronize.__wrapped__ = original  # type: ignore[attr-defined]
        _saved.append((torch._C, "_cuda_synchronize", original))
        torch._C._cuda_synchronize = synchronize


def restore() -> None:
    """Undo route() (for tests)."""
    with _lock:
        while _saved:
            owner, name, original = _saved.pop()
            setattr(owner, name, original)

"""``torch.cuda.synchronize()`` under install(): after PyTorch's synchronisation, streampool is
told (``streampool_synchronized``): blocks that waited for other streams (``record_stream``) go
back, on the vmm backend what was freed becomes ready for every stream where more than one
stream allocated or freed since the last synchronisation (so that the next requests see it
merged), and memory above a release threshold goes back at the synchronisation,
as a CUDA pool's does (and as PyTorch's own ``cudaMallocAsync`` backend gives it).

Invariant: PyTorch's synchronisation runs first and its outcome (an error included) is what the
caller gets; streampool's part never hides it, and a failure of streampool's part is logged, not
raised (the synchronisation itself succeeded).
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
    streampool once it has returned. Idempotent."""
    with _lock:
        if _saved:
            return
        original = getattr(torch._C, "_cuda_synchronize", None)
        if original is None:
            return

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                status = _lib.library().streampool_synchronized(torch.cuda.current_device())
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

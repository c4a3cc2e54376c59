"""CUDA tensors through ``multiprocessing`` and ``torch.multiprocessing`` under install():
reducers that send them through streampool's sharing (:mod:`streampool._ipc`), and queue puts
that pickle in the calling thread, so that a tensor that cannot be sent raises at ``put``.

Invariant: PyTorch's own reducers stay in place for CPU tensors; queue puts change only in a
process where CUDA is initialised, and :func:`pickle_at_put` is idempotent.
"""

import logging
from typing import Any, Dict, Optional

from ._ipc import SharedTensor, open_shared, share

_log = logging.getLogger("streampool")

# --- torch.multiprocessing ---------------------------------------------------------------------

_torch_reducers: Dict[type, Any] = {}


def _reduce_tensor(tensor: Any) -> Any:
    import torch

    if not tensor.is_cuda:
        return _torch_reducers[type(tensor)](tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to send a non-leaf tensor that requires grad to another process: "
            "send tensor.detach() instead"
        )
    return (_rebuild_tensor, (share(tensor), type(tensor) is torch.nn.Parameter))


def _rebuild_tensor(shared: SharedTensor, parameter: bool) -> Any:
    import torch

    tensor = open_shared(shared)
    return torch.nn.Parameter(tensor, requires_grad=shared.requires_grad) if parameter else tensor


def register_reductions() -> None:
    """Make ``multiprocessing`` (and ``torch.multiprocessing``) send CUDA tensors and parameters
    through streampool's shareable pools; CPU tensors keep PyTorch's own way. Queues of a
    process with CUDA initialised pickle in the thread that puts (:func:`pickle_at_put`)."""
    import torch
    import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)
    from multiprocessing.reduction import ForkingPickler

    for cls in (torch.Tensor, torch.nn.Parameter):
        if cls not in _torch_reducers:
            _torch_reducers[cls] = ForkingPickler._extra_reducers[cls]
        ForkingPickler.register(cls, _reduce_tensor)
    pickle_at_put()
    raise_open_file_limit()


def raise_open_file_limit() -> None:
    """A tensor shared page by page (the vmm backend) travels as one file descriptor per physical
    handle (a 2 MiB page, or by default a span of up to 8 MiB): raise this process's soft limit on
    open files to its hard limit, as far as the system lets it, so that a large tensor does not run
    out of descriptors (a 1 GiB tensor on 2 MiB pages holds 512 in the exporter while it is
    sent)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError) as exc:
        _log.info("streampool: the open-file limit stays as it is (%s)", exc)


# --- queues: pickling in the thread that puts --------------------------------------------------
#
# ``multiprocessing.Queue.put`` only appends the object to a buffer; the queue's feeder thread
# pickles it later, and an exception there is printed and dropped (``_on_queue_feeder_error``):
# the receiver waits for ever. A CUDA tensor streampool cannot share (one from an ordinary pool)
# is refused while it is pickled, so under install() the pickling moves to the thread that puts,
# where the refusal is raised by ``put`` itself. Only in a process where CUDA is initialised (the
# only one that can hold a CUDA tensor): DataLoader workers and other CPU-only processes keep the
# feeder's pickling. SimpleQueue, Pipe, Pool and Process arguments pickle in the caller already.


class _Pickled:
    """An object pickled by the thread that put it on a queue; the receiver's unpickling of this
    wrapper returns the object itself."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self) -> Any:
        import pickle

        return (pickle.loads, (self.data,))


def _cuda_initialised() -> bool:
    """True if torch is imported and CUDA is initialised in this process (a fork child of such a
    process is not: PyTorch says so)."""
    import sys

    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


# Whether a put pickles in the caller (a seam for the CPU tests, which have no CUDA).
_caller_pickles = _cuda_initialised
_original_puts: Dict[type, Any] = {}


def _pickling_put(original: Any) -> Any:
    def put(self: Any, obj: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        if _caller_pickles():
            if self._closed:
                raise ValueError(f"Queue {self!r} is closed")
            from multiprocessing.reduction import ForkingPickler

            # Raises here, in the caller, if obj cannot be sent (a CUDA tensor streampool cannot
            # share says how to make it shareable).
            obj = _Pickled(bytes(ForkingPickler.dumps(obj)))
        return original(self, obj, block, timeout)

    put.__doc__ = original.__doc__
    put.__wrapped__ = original  # type: ignore[attr-defined]
    return put


def pickle_at_put() -> None:
    """``multiprocessing.Queue.put`` (and ``JoinableQueue.put``) pickle in the calling thread
    while CUDA is initialised in this process, so an object that cannot be sent raises there
    instead of being lost in the queue's feeder thread. Idempotent."""
    from multiprocessing import queues

    for cls in (queues.Queue, queues.JoinableQueue):
        if cls not in _original_puts:
            _original_puts[cls] = cls.__dict__["put"]
            cls.put = _pickling_put(_original_puts[cls])


def restore_queue_puts() -> None:
    """Undo :func:`pickle_at_put` (for tests)."""
    while _original_puts:
        cls, original = _original_puts.popitem()
        cls.put = original

"""Plugging streampool into PyTorch: the process-wide allocator (install) and scoped pools (mempool).

torch is imported only here, and only when one of these functions runs.
"""

import logging
import os
import sys
import warnings
from typing import Any, Dict, List, Optional

from . import _lib
from ._config import option_environment
from ._device import device_index

_log = logging.getLogger("streampool")

# (setter on torch._C._CUDAPluggableAllocator, exported C function it receives)
_HOOKS = (
    ("set_init_fn", "streampool_init"),
    ("set_reset_fn", "streampool_empty_cache"),
    ("set_record_stream_fn", "streampool_record_stream"),
    ("set_memory_fraction_fn", "streampool_set_memory_fraction"),
)


class _Installation:
    """The allocator handed to PyTorch (kept alive here for the life of the process), and the
    PyTorch features wired beyond malloc and free (feature -> None, or why it is unavailable)."""

    def __init__(self, allocator: Any, options: Dict[str, Any], variables: Dict[str, str],
                 torch_stats: bool, features: Dict[str, Optional[str]], ignored_settings: List[str]):
        self.allocator = allocator
        self.options = options
        # What the options set (ipc=True and ipc="1" alike) and whether statistics are routed:
        # a second install() asking for the same is no different one.
        self.variables = variables
        self.torch_stats = torch_stats
        self.features = features
        # Keys of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF warned about at install().
        self.ignored_settings = ignored_settings


_installation: Optional[_Installation] = None
_scoped_allocator: Any = None
# For tests only: False leaves Tensor.record_stream unwired (a GPU case shows what that breaks).
_wire_record_stream = True


def _import_torch(caller: str) -> Any:
    try:
        import torch
    except ImportError as exc:  # one line, not torch's import traceback chained above it
        raise ImportError(
            f"streampool.{caller}() needs PyTorch 2.5 or newer, and this Python ({sys.executable}) "
            f"cannot import it ({exc}): pip install torch"
        ) from None
    return torch


def _apply_environment(variables: Dict[str, str]) -> Dict[str, Optional[str]]:
    """Put install() options into os.environ, where the library reads them on first use, and
    have the library check them; returns the variables' values before (None: not set), for
    :func:`_restore_environment`. A malformed value raises ConfigError with os.environ as it
    was, so a retry with corrected options works. Raises RuntimeError if the library was
    already loaded with different values."""
    loaded = _lib.environment_at_load()  # None: the library has not read the variables yet
    if loaded is not None:
        changed = sorted(k for k, v in variables.items() if loaded.get(k) != v)
        if changed:
            raise RuntimeError(
                f"streampool's library already read its settings in this process, before install() "
                f"could set {', '.join(changed)}: call install() with its options before any other "
                "streampool function that allocates or reads statistics (an earlier install() counts), "
                "or set the variables in the environment before starting Python"
            )
    previous = {name: os.environ.get(name) for name in variables}
    try:
        os.environ.update(variables)
        _lib.check_config()
    except Exception:
        _restore_environment(previous)
        if loaded is None:  # only check_config() saw the values, and it keeps nothing
            _lib.forget_environment()
        raise
    return previous


def _restore_environment(previous: Dict[str, Optional[str]]) -> None:
    """Set each variable back to its value in ``previous`` (None: it was not set)."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _require_cuda_driver() -> None:
    _lib.check_config()
    driver = _lib.driver_name()
    if driver != "cuda":
        raise RuntimeError(
            f"STREAMPOOL_DRIVER={driver}: the simulated driver serves host memory and cannot back "
            "PyTorch CUDA tensors; unset STREAMPOOL_DRIVER to use the GPU"
        )


def _new_allocator(torch: Any, wire_record_stream: bool = True, malloc: str = "my_malloc") -> Any:
    """A CUDAPluggableAllocator over libstreampool with every hook this PyTorch offers wired.
    ``malloc`` is the export PyTorch allocates with: ``my_malloc`` throws on failure (what the
    process-wide allocator must do), ``streampool_malloc`` returns NULL (what a MemPool's
    allocator may do: PyTorch's caching allocator above it then frees its own cache, retries and
    raises torch.OutOfMemoryError)."""
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(_lib.library_path()), malloc, "my_free")
    raw = allocator.allocator()
    for setter, function in _HOOKS:
        if function == "streampool_record_stream" and not wire_record_stream:
            continue
        if hasattr(raw, setter):
            getattr(raw, setter)(_lib.function_address(function))
        else:
            _log.debug("this PyTorch has no %s: %s is not wired", setter, function)
    return allocator


def install(*, torch_stats: bool = True, **options: Any) -> Any:
    """Make streampool PyTorch's CUDA allocator for this process; returns the
    ``torch.cuda.memory.CUDAPluggableAllocator``, or None where PyTorch finds no CUDA GPU (then
    nothing is installed and one warning line says so).

    Options (each sets the STREAMPOOL_* variable of its name in capitals — left as it was where
    nothing is installed — which the README's
    Configuration table describes and ``python -m streampool info`` lists; sizes in bytes or
    strings such as "8GiB", "80%", "max"): backend ("vmm", the default: every block on streampool's
    own virtual-memory pool; "pool": CUDA's stream-ordered pools; "managed": managed memory), vmm_page_size, vmm_span_size, release_threshold,
    max_pool_size, cache_limit, cache_max_block, small_pool_max (0: one pool for all sizes), trim_on_growth, peer_access
    ("auto", True or False), ipc (every allocation shareable with other processes),
    reuse_follow_event_dependencies, reuse_allow_opportunistic,
    reuse_allow_internal_dependencies (bools), log (a log filter such as "info").

    ``torch_stats`` (default True): ``torch.cuda.memory_stats()``, ``memory_allocated()``,
    ``max_memory_allocated()``, ``memory_reserved()``, ``max_memory_reserved()``,
    ``reset_peak_memory_stats()``, ``reset_accumulated_memory_stats()`` and ``memory_summary()``
    read streampool's statistics (PyTorch's key names and meanings; keys streampool cannot know are
    absent). False leaves them as PyTorch has them for pluggable allocators: they raise.

    Must run before CUDA is initialised in the process. A second call returns the same allocator
    (with a warning if its options differ).
    """
    global _installation
    if not isinstance(torch_stats, bool):
        raise TypeError(f"install(torch_stats=...) must be True or False, not {torch_stats!r}")
    variables = option_environment(options)
    torch = _import_torch("install")
    if _installation is not None:
        if (variables, torch_stats) != (_installation.variables, _installation.torch_stats):
            before = {**_installation.options, "torch_stats": _installation.torch_stats}
            warnings.warn(
                f"streampool.install() already ran with options {before}; "
                f"the new options {({**options, 'torch_stats': torch_stats})} are ignored",
                RuntimeWarning,
                stacklevel=2,
            )
        return _installation.allocator
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialised in this process, so PyTorch's allocator can no longer be "
            "replaced: call streampool.install() before any CUDA tensor or CUDA call, or use "
            "scoped mode instead: `with torch.cuda.use_mem_pool(streampool.mempool()): ...`"
        )
    previous = _apply_environment(variables)
    try:
        _require_cuda_driver()
    except Exception:
        _restore_environment(previous)
        raise
    if not torch.cuda.is_available():  # does not initialise CUDA
        # Nothing is installed: processes started from here see the environment as it was.
        _restore_environment(previous)
        _log.warning(
            "streampool.install(): PyTorch finds no CUDA GPU (torch.cuda.is_available() is False), "
            "so nothing was installed; CPU tensors are unaffected"
        )
        return None
    allocator = _new_allocator(torch, wire_record_stream=_wire_record_stream)
    torch.cuda.memory.change_current_allocator(allocator)
    from ._parity import wire

    # cuDNN benchmark mode, MemPool, CUDA graph pools and trees, memory history, typed OOM.
    features = wire(torch, allocator.allocator())
    from ._alloc_conf import warn_environment

    # PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF keys of PyTorch's caching allocator: one
    # warning each, naming what to do instead.
    ignored_settings = warn_environment(os.environ)
    from ._ipc_torch import register_reductions

    register_reductions()  # CUDA tensors sent to other processes go through shareable pools
    from . import _sync

    _sync.route(torch)  # a release threshold applies at torch.cuda.synchronize(), as PyTorch's does
    if torch_stats:
        from ._torch_stats import route

        route(torch)
    _installation = _Installation(allocator, dict(options), variables, torch_stats, features, ignored_settings)
    return allocator


def is_installed() -> bool:
    """True once install() has made streampool PyTorch's allocator in this process."""
    return _installation is not None


def _check_index(device: Any, index: int, count: int) -> None:
    """ValueError if ``device`` (``index``) is not one of the ``count`` devices streampool sees."""
    if not 0 <= index < count:
        raise ValueError(
            f"device {device!r} (index {index}) does not exist: streampool sees {count} device(s), "
            f"indices 0 to {count - 1}"
        )


def mempool(device: Any = None) -> Any:
    """A ``torch.cuda.MemPool`` backed by streampool, for
    ``with torch.cuda.use_mem_pool(pool, device=...):`` (scoped mode; works after CUDA is
    initialised). PyTorch's native allocator caches above streampool inside the region.

    ``device`` (None = current device, an int, "cuda:N" or a torch.device) is the device the pool
    is meant for. A MemPool belongs to the process, not to a device, so it is only checked here
    (ValueError if streampool has no such device); pass the same device to ``use_mem_pool``.

    Out of memory inside the region raises ``torch.cuda.OutOfMemoryError``: PyTorch's allocator
    above streampool raises its typed error when streampool returns no memory. After
    ``install()``, streampool serves every block already: this returns a plain
    ``torch.cuda.MemPool()``, a memory pool of streampool's."""
    global _scoped_allocator
    index = device_index(device)
    try:
        count: Optional[int] = _lib.device_count()
    except _lib.StreampoolError:
        count = None  # no usable CUDA driver: what is missing is said below, torch first
    if count is not None:
        _check_index(device, index, count)
    torch = _import_torch("mempool")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "streampool.mempool() needs a CUDA GPU, and PyTorch finds none (torch.cuda.is_available() is False)"
        )
    _require_cuda_driver()
    _check_index(device, index, _lib.device_count())
    if _installation is not None:
        # streampool already serves every block of the process: a plain MemPool is a pool of
        # streampool's (a MemPool with an allocator of its own takes its segments from that allocator).
        return torch.cuda.MemPool()
    if _scoped_allocator is None:
        _scoped_allocator = _new_allocator(torch, malloc="streampool_malloc")
    return torch.cuda.MemPool(_scoped_allocator.allocator())

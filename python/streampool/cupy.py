"""CuPy on streampool's pools: after :func:`install`, CuPy allocates from the same per-device
stream-ordered pools as PyTorch, so memory one library frees is there for the other instead of
sitting in a second cache.

CuPy's C allocator interface passes no stream, so this uses its Python allocator interface and
allocates on ``cupy.cuda.get_current_stream()``; a free is ordered on the stream the memory was
allocated on. Statistics (``streampool.memory_stats()``) count both libraries. Needs CuPy
(``pip install cupy-cuda13x``); importing this module does not.
"""

from typing import Any, Optional

from . import _lib

_installed: Optional[Any] = None  # the cupy.cuda.PythonFunctionAllocator in use


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise ImportError("streampool.cupy.install() needs CuPy (pip install cupy-cuda13x)") from exc
    return cupy


def _malloc(size: int, device: int) -> int:
    """CuPy's malloc hook: ``size`` bytes on ``device``, ordered on CuPy's current stream. A
    negative size raises InvalidArgumentError before anything reaches the library."""
    size = _lib.check_size(size)
    import cupy

    return _lib.malloc(size, device, cupy.cuda.get_current_stream().ptr) or 0


def _free(ptr: int, device: int) -> None:
    """CuPy's free hook (the library remembers the size and the allocation stream)."""
    if ptr:
        _lib.free(ptr, 0, device, None)


def install() -> None:
    """Make CuPy allocate through streampool. Calling it again is harmless. CuPy's own memory
    pool is no longer used; call ``cupy.get_default_memory_pool().free_all_blocks()`` first if it
    holds memory you want back."""
    global _installed
    cupy = _import_cupy()
    _lib.check_config()  # a malformed STREAMPOOL_* variable is reported here, not at first use
    if _installed is None:
        _installed = cupy.cuda.PythonFunctionAllocator(_malloc, _free)
    cupy.cuda.set_allocator(_installed.malloc)


def is_installed() -> bool:
    return _installed is not None

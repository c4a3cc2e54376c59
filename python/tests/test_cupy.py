"""streampool.cupy on the simulated driver, with a stand-in for CuPy's allocator interface (CuPy
itself needs a GPU; test_gpu.py drives the real one)."""

import sys
import types

import pytest
from conftest import BACKEND
from helpers import HIDE_TORCH, describe, run_python

import streampool
from streampool import _lib

CUPY_STREAM = 0x4321


class _Memory:
    """What cupy.cuda.PythonFunctionAllocator.malloc returns: frees through the hook when dropped."""

    def __init__(self, ptr, device, free):
        self.ptr, self._device, self._free = ptr, device, free

    def __del__(self):
        self._free(self.ptr, self._device)


def _fake_cupy(current_device=0):
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace(allocator=None)

    class PythonFunctionAllocator:
        def __init__(self, malloc_func, free_func):
            self._malloc, self._free = malloc_func, free_func

        def malloc(self, size):
            return _Memory(self._malloc(size, current_device), current_device, self._free)

    cuda.PythonFunctionAllocator = PythonFunctionAllocator
    cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=CUPY_STREAM)
    cuda.set_allocator = lambda allocator: setattr(cuda, "allocator", allocator)
    cupy.cuda = cuda
    return cupy


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    streampool.empty_cache()
    return cupy


def test_cupy_allocates_from_streampool_on_its_current_stream(fake_cupy):
    import streampool.cupy

    streampool.cupy.install()
    streampool.cupy.install()  # harmless twice
    assert streampool.cupy.is_installed()
    before = _lib.get_stats(0).as_dict()
    memory = fake_cupy.cuda.allocator(3 * 4096)
    during = _lib.get_stats(0).as_dict()
    assert during["allocated_bytes"] - before["allocated_bytes"] == 3 * 4096
    assert during["num_allocs"] - before["num_allocs"] == 1
    ptr = memory.ptr
    del memory
    after = _lib.get_stats(0).as_dict()
    assert after["allocated_bytes"] == before["allocated_bytes"]
    # Freed on CuPy's stream: the next allocation of that size on it reuses the block (a cache
    # hit on the pool backend; the vmm backend caches nothing and reuses it itself).
    again = fake_cupy.cuda.allocator(3 * 4096)
    assert again.ptr == ptr
    hits = 1 if BACKEND == "pool" else 0
    assert _lib.get_stats(0).num_cache_hits == after["num_cache_hits"] + hits
    del again


def test_a_cupy_allocation_that_does_not_fit_raises_out_of_memory(fake_cupy):
    import streampool.cupy

    streampool.cupy.install()
    with pytest.raises(streampool.OutOfMemoryError, match=r"^CUDA out of memory\."):
        fake_cupy.cuda.allocator(1 << 45)  # 32 TiB: at most the maximum, more than the device


def test_install_without_cupy_says_what_is_missing():
    proc = run_python(
        HIDE_TORCH + "import sys; sys.modules['cupy'] = None\nimport streampool.cupy\n"
        "try:\n    streampool.cupy.install()\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    assert proc.returncode == 0, describe(proc)
    assert "ERR streampool.cupy.install() needs CuPy" in proc.stdout, describe(proc)


def test_a_negative_cupy_size_is_refused_before_the_library_sees_it(fake_cupy):
    import streampool.cupy

    streampool.cupy.install()
    before = _lib.get_stats(0).as_dict()
    with pytest.raises(streampool.InvalidArgumentError, match="must not be negative, got -1"):
        fake_cupy.cuda.allocator(-1)
    assert _lib.get_stats(0).as_dict() == before

"""The floor allocator (bench/floor/floor.c), built with host memory in place of device memory:
its size classes, its reuse, and its refusals (each in a process of its own: a refusal aborts)."""

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parent.parent / "floor" / "build"
MIB = 2**20


@pytest.fixture
def floor(tmp_path):
    """A fresh copy of the library (its state is process-wide), with typed entry points."""
    path = tmp_path / "libfloor.so"
    env = dict(os.environ, FLOOR_CFLAGS="-DFLOOR_HOST_MEMORY")
    subprocess.run([str(BUILD), str(path)], check=True, env=env, capture_output=True)
    lib = ctypes.CDLL(str(path))
    lib.floor_malloc.restype = ctypes.c_void_p
    lib.floor_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.floor_free.restype = None
    lib.floor_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.floor_class_of.restype = ctypes.c_size_t
    lib.floor_class_of.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.floor_host_calls.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
    lib.path = path
    return lib


def class_of(lib, size):
    class_bytes = ctypes.c_size_t()
    index = lib.floor_class_of(size, ctypes.byref(class_bytes))
    return index, class_bytes.value


def test_every_size_has_a_class_that_fits_it_with_little_waste(floor):
    sizes = [1, 511, 512, 513, 4096, MIB - 1, MIB, MIB + 1, 3 * MIB, 2 * MIB, 2 * MIB + 1]
    sizes += [(1 << k) + d for k in range(21, 63) for d in (-1, 0, 1)]
    previous = (-1, 0)
    for size in sorted(set(sizes)):
        index, class_bytes = class_of(floor, size)
        assert class_bytes >= size, size
        # 512-byte steps below 1 MiB, eighths of a doubling above it.
        assert class_bytes - size < max(512, size // 8 + 1), size
        assert (index, class_bytes) >= previous, size
        assert (index == previous[0]) == (class_bytes == previous[1]), size
        previous = (index, class_bytes)


def test_sizes_past_the_largest_class_have_none_and_no_size_gets_an_address(floor):
    assert class_of(floor, 2**63 + 1)[1] == 0
    assert class_of(floor, 2**64 - 1)[1] == 0
    assert floor.floor_malloc(-1, 0, None) is None
    assert floor.floor_malloc(0, 0, None) is None


def host_calls(lib):
    allocs, frees = ctypes.c_size_t(), ctypes.c_size_t()
    lib.floor_host_calls(ctypes.byref(allocs), ctypes.byref(frees))
    return allocs.value, frees.value


def test_a_freed_block_serves_the_next_request_of_its_class(floor):
    first = floor.floor_malloc(1000, 0, None)
    other = floor.floor_malloc(1000, 0, None)
    assert first and other and first != other
    assert first % 512 == 0
    floor.floor_free(first, 1000, 0, None)
    assert host_calls(floor) == (2, 0)
    assert floor.floor_malloc(600, 0, None) == first  # 600 and 1000 share the 1024-byte class
    assert host_calls(floor) == (2, 0), "a hit takes no memory"
    assert floor.floor_malloc(1000, 0, None) not in (first, other)
    assert host_calls(floor) == (3, 0)


def run_refused(floor_path, body):
    """Runs ``body`` (Python, with ``lib`` loaded) in a process of its own: what it printed and
    its exit status (a refusal aborts)."""
    script = (
        "import ctypes\n"
        f"lib = ctypes.CDLL({str(floor_path)!r})\n"
        "lib.floor_malloc.restype = ctypes.c_void_p\n"
        "lib.floor_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]\n"
        "lib.floor_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,"
        " ctypes.c_void_p]\n" + body
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return done.returncode, done.stderr


@pytest.mark.parametrize("call", [
    "lib.floor_malloc(4096, 0, 0x5678)",
    "lib.floor_malloc(4096, 1, 0x1234)",
    "lib.floor_free(lib.floor_malloc(4096, 0, 0x1234), 4096, 0, 0x5678)",
])
def test_another_device_or_stream_ends_the_process_with_a_message(floor, call):
    status, err = run_refused(floor.path, f"assert lib.floor_malloc(4096, 0, 0x1234)\n{call}\n")
    assert status == -signal.SIGABRT, err
    assert "another device or stream" in err and "it serves device 0, stream 0x1234 only" in err


def test_out_of_memory_frees_the_cache_retries_once_then_ends_the_process(floor):
    body = (
        "kept = lib.floor_malloc(4096, 0, None)\n"
        "lib.floor_free(kept, 4096, 0, None)\n"
        "lib.floor_malloc(2**62, 0, None)\n"  # more than any host can give
        "print('returned')\n"
    )
    status, err = run_refused(floor.path, body)
    assert status == -signal.SIGABRT, err
    assert "1 cached block(s) freed before the retry" in err
    assert "out of memory after freeing its cache (4611686018427387904 bytes" in err


def test_a_worker_without_the_library_skips_the_configuration(monkeypatch, tmp_path):
    from bench import engine
    from bench.worker import Skipped

    monkeypatch.delenv(engine.FLOOR_VARIABLE, raising=False)
    with pytest.raises(Skipped, match="BENCH_FLOOR_LIBRARY"):
        engine.install_allocator("floor")
    monkeypatch.setenv(engine.FLOOR_VARIABLE, str(tmp_path / "missing.so"))
    with pytest.raises(Skipped, match="missing.so"):
        engine.install_allocator("floor")

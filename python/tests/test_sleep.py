"""streampool.sleep() / wake() on the simulated driver: on the vmm backend every page goes back
and comes again at the same addresses; on the pool backend the call is refused, changing
nothing. (The contents and PyTorch tensors are checked on the GPU: test_gpu.py's sleep case.)"""

import pytest
from conftest import BACKEND
from helpers import MiB

import streampool
from streampool import _lib


@pytest.fixture(autouse=True)
def awake():
    yield
    if streampool.sleeping_bytes(0):
        streampool.wake(0)
    streampool.empty_cache()


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it under vmm)")
def test_sleep_gives_every_page_back_and_wake_maps_them_again():
    ptr = _lib.malloc(5 * MiB, 0, 0)
    held = streampool.memory_reserved(0)
    assert streampool.sleep(level=1, device=0) == held
    assert streampool.memory_reserved(0) == 0
    assert streampool.sleeping_bytes(0) == held
    with pytest.raises(streampool.StreampoolError, match="asleep"):
        _lib.malloc(MiB, 0, 0)
    with pytest.raises(streampool.InvalidArgumentError, match="asleep already"):
        streampool.sleep(device=0)
    assert streampool.wake(0) == held
    assert streampool.memory_reserved(0) == held and streampool.sleeping_bytes(0) == 0
    with pytest.raises(streampool.InvalidArgumentError, match="not asleep"):
        streampool.wake(0)
    _lib.free(ptr, 5 * MiB, 0)


@pytest.mark.skipif(BACKEND != "pool", reason="the pool backend's refusal")
def test_the_pool_backend_refuses_to_sleep():
    ptr = _lib.malloc(MiB, 0, 0)
    held = streampool.memory_reserved(0)
    with pytest.raises(streampool.InvalidArgumentError, match="STREAMPOOL_BACKEND=vmm"):
        streampool.sleep(device=0)
    assert streampool.memory_reserved(0) == held
    _lib.free(ptr, MiB, 0)


def test_bad_levels_are_refused():
    with pytest.raises(streampool.InvalidArgumentError, match="level"):
        streampool.sleep(level=3, device=0)

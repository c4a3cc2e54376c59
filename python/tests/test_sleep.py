"""streampool.sleep() / wake() on the simulated driver: on the vmm backend every page goes back
and comes again at the same addresses, and a sleep that discards tags (streampool.tag()) keeps
only the other blocks' pages in host memory; on the pool backend the call is refused, changing
nothing. (The contents bit for bit are checked in tests/sleep.rs, PyTorch tensors on the GPU:
test_gpu.py's sleep case.)"""

import threading

import pytest
from conftest import BACKEND
from helpers import MiB

import streampool
from streampool import _lib
from streampool._stats import format_bytes


@pytest.fixture(autouse=True)
def awake():
    yield
    if streampool.sleeping_bytes(0):
        streampool.wake(0)
    streampool.release_sleep_buffer(0)
    streampool.empty_cache()


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_sleep_gives_every_page_back_and_wake_maps_them_again():
    ptr = _lib.malloc(5 * MiB, 0, 0)
    freed = _lib.malloc(8 * MiB, 0, 0)
    _lib.free(freed, 8 * MiB, 0)
    held = streampool.memory_reserved(0)
    # The shareable pool (streampool.shareable(); another test's, when the tests run together)
    # does not sleep: a CUDA pool, whose memory stays counted as held.
    shareable = streampool.memory_stats(0)["ipc_reserved_bytes"]
    assert streampool.sleep(level=1, device=0) == held - shareable
    assert streampool.memory_reserved(0) == shareable
    # Only the pages under the live block sleep; the freed block's went back for good.
    asleep = streampool.sleeping_bytes(0)
    assert 5 * MiB <= asleep <= held - shareable - 8 * MiB, (asleep, held)
    with pytest.raises(streampool.StreampoolError, match="asleep"):
        _lib.malloc(MiB, 0, 0)
    with pytest.raises(streampool.InvalidArgumentError, match="asleep already"):
        streampool.sleep(device=0)
    assert streampool.wake(0) == asleep
    assert streampool.memory_reserved(0) == asleep + shareable and streampool.sleeping_bytes(0) == 0
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


@pytest.mark.parametrize("level, error", [(3, streampool.InvalidArgumentError), (0, streampool.InvalidArgumentError),
                                          (2**32 + 2, streampool.InvalidArgumentError), (2**32 + 1, streampool.InvalidArgumentError),
                                          (1.9, TypeError), ("1", TypeError), ("x", TypeError), (True, TypeError)])
def test_bad_levels_are_refused_and_nothing_sleeps(level, error):
    # int() made 1.9 level 1 and ctypes 2**32 + 2 level 2 (discarding every tensor's contents).
    with pytest.raises(error, match=r"level"):
        streampool.sleep(level=level, device=0)
    assert streampool.sleeping_bytes(0) == 0


def _saved_after_sleep(discard=None) -> int:
    """Sleeps device 0 at level 1 (discarding ``discard``), wakes it; the bytes kept in host memory."""
    streampool.sleep(level=1, device=0, discard=discard)
    saved = streampool.sleep_saved_bytes(0)
    assert streampool.sleeping_bytes(0) > 0
    streampool.wake(0)
    assert streampool.sleep_saved_bytes(0) == 0
    return saved


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_a_discarded_tag_keeps_its_blocks_out_of_host_memory_and_tags_nest_per_thread():
    # Blocks of whole pages (2 MiB), so that no page holds two of them.
    untagged = _lib.malloc(4 * MiB, 0, 0)
    with streampool.tag("kv_cache"):
        kv = _lib.malloc(4 * MiB, 0, 0)
        with streampool.tag("inner"):
            inner = _lib.malloc(2 * MiB, 0, 0)
        kv_again = _lib.malloc(2 * MiB, 0, 0)  # kv_cache again
        # Another thread has no tag of its own.
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("ptr", _lib.malloc(2 * MiB, 0, 0)))
        thread.start()
        thread.join()
    after = _lib.malloc(2 * MiB, 0, 0)  # no tag
    everything = _saved_after_sleep()
    assert everything >= 16 * MiB
    assert _saved_after_sleep(discard=["kv_cache"]) == everything - 6 * MiB
    assert _saved_after_sleep(discard="inner") == everything - 2 * MiB  # one name as a str
    assert _saved_after_sleep(discard=["inner", "kv_cache"]) == everything - 8 * MiB
    for ptr, size in [(untagged, 4 * MiB), (kv, 4 * MiB), (inner, 2 * MiB), (kv_again, 2 * MiB),
                      (result["ptr"], 2 * MiB), (after, 2 * MiB)]:
        _lib.free(ptr, size, 0)


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_discarding_an_unknown_tag_is_refused_and_changes_nothing():
    with streampool.tag("kv_cache"):
        ptr = _lib.malloc(MiB, 0, 0)
    held = streampool.memory_reserved(0)
    with pytest.raises(streampool.InvalidArgumentError, match="unknown tag 'never_used_tag'|\"never_used_tag\""):
        streampool.sleep(level=1, device=0, discard=["kv_cache", "never_used_tag"])
    assert streampool.sleeping_bytes(0) == 0 and streampool.memory_reserved(0) == held
    _lib.free(ptr, MiB, 0)


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_a_tagged_block_freed_while_asleep_and_info_shows_the_sleeping_memory():
    from streampool.__main__ import _device_line

    keep = _lib.malloc(2 * MiB, 0, 0)
    with streampool.tag("kv_cache"):
        kv = _lib.malloc(2 * MiB, 0, 0)
    assert "asleep 0 B" in _device_line(0)
    slept = streampool.sleep(level=1, device=0, discard=["kv_cache"])
    line = _device_line(0)
    assert f"asleep {format_bytes(slept)} (2.00 MiB of contents in host memory)" in line, line
    _lib.free(kv, 2 * MiB, 0)  # frees are fine while asleep
    streampool.wake(0)
    again = _lib.malloc(2 * MiB, 0, 0)  # no tag, whatever the freed block at its place had
    assert _saved_after_sleep(discard=["kv_cache"]) == 4 * MiB
    _lib.free(again, 2 * MiB, 0)
    _lib.free(keep, 2 * MiB, 0)


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_the_host_buffer_is_kept_after_wake_until_released():
    from streampool.__main__ import _device_line

    ptr = _lib.malloc(4 * MiB, 0, 0)
    assert streampool.sleep_host_buffer_bytes(0) == 0
    streampool.sleep(level=1, device=0)
    saved = streampool.sleep_saved_bytes(0)
    assert saved >= 4 * MiB and streampool.sleep_host_buffer_bytes(0) == saved
    with pytest.raises(streampool.InvalidArgumentError, match="wake it first"):
        streampool.release_sleep_buffer(0)
    streampool.wake(0)
    assert streampool.sleep_host_buffer_bytes(0) == saved
    assert f"asleep 0 B (host buffer {format_bytes(saved)} kept)" in _device_line(0)
    assert streampool.release_sleep_buffer(0) == saved
    assert streampool.sleep_host_buffer_bytes(0) == 0 and streampool.release_sleep_buffer(0) == 0
    _lib.free(ptr, 4 * MiB, 0)


def test_with_no_sleep_there_is_no_host_buffer_to_release():
    assert streampool.sleep_host_buffer_bytes(0) == 0
    assert streampool.release_sleep_buffer(0) == 0


@pytest.mark.skipif(BACKEND != "pool", reason="the pool backend's refusal")
def test_the_pool_backend_refuses_a_sleep_that_discards_tags():
    with streampool.tag("kv_cache"):
        ptr = _lib.malloc(MiB, 0, 0)
    with pytest.raises(streampool.InvalidArgumentError, match="STREAMPOOL_BACKEND=vmm"):
        streampool.sleep(device=0, discard=["kv_cache"])
    assert streampool.sleeping_bytes(0) == 0
    _lib.free(ptr, MiB, 0)


def _no_tag_pushed() -> bool:
    """True if this thread has no tag pushed (a pop is then refused)."""
    status = _lib.library().streampool_tag_pop()
    if status == _lib.OK:
        return False
    with pytest.raises(streampool.InvalidArgumentError, match="no tag to pop"):
        _lib.check(status)
    return True


@pytest.mark.parametrize(
    "name, error, words",
    [
        ("", streampool.InvalidArgumentError, "empty"),
        ("k" * 257, streampool.InvalidArgumentError, "at most 256"),
        ("kv\0cache", streampool.InvalidArgumentError, "NUL"),
        ("kv\udc80", streampool.InvalidArgumentError, "not UTF-8"),
        (b"kv_cache", TypeError, "str"),
    ],
)
def test_bad_tag_names_are_refused_and_push_nothing(name, error, words):
    with pytest.raises(error, match=words):
        with streampool.tag(name):
            pytest.fail("the body runs under a refused tag")
    assert _no_tag_pushed()
    with pytest.raises(error, match=words):
        streampool.sleep(device=0, discard=[name])
    assert streampool.sleeping_bytes(0) == 0


def test_a_tag_is_popped_when_its_block_raises():
    with pytest.raises(KeyError):
        with streampool.tag("kv_cache"):
            with streampool.tag("inner"):
                raise KeyError("inside")
    assert _no_tag_pushed()


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_a_reserved_sleep_buffer_is_what_the_next_sleep_uses():
    ptr = _lib.malloc(4 * MiB, 0, 0)
    needed = streampool.reserve_sleep_buffer(0)
    assert needed >= 4 * MiB and streampool.sleep_host_buffer_bytes(0) == needed
    # More than the sleep needs: a sleep that pinned a buffer of its own would hold `needed`.
    assert streampool.reserve_sleep_buffer(0, size="64MiB") == 64 * MiB
    assert streampool.reserve_sleep_buffer(0, size=MiB) == 64 * MiB, "a larger one is kept"
    streampool.sleep(level=1, device=0)
    assert streampool.sleep_saved_bytes(0) == needed
    assert streampool.sleep_host_buffer_bytes(0) == 64 * MiB, "the sleep pinned another"
    with pytest.raises(streampool.InvalidArgumentError, match="asleep"):
        streampool.reserve_sleep_buffer(0)
    streampool.wake(0)
    with pytest.raises(streampool.InvalidArgumentError, match="more than 0"):
        streampool.reserve_sleep_buffer(0, size=0)
    with pytest.raises(TypeError):
        streampool.reserve_sleep_buffer(0, MiB)  # the size is named: reserve_sleep_buffer(1) is device 1
    assert streampool.release_sleep_buffer(0) == 64 * MiB
    _lib.free(ptr, 4 * MiB, 0)


@pytest.mark.skipif(BACKEND != "pool", reason="the pool backend's refusal")
def test_the_pool_backend_refuses_to_reserve_a_sleep_buffer():
    with pytest.raises(streampool.InvalidArgumentError, match="STREAMPOOL_BACKEND=vmm"):
        streampool.reserve_sleep_buffer(0)
    assert streampool.sleep_host_buffer_bytes(0) == 0


def test_a_numpy_integer_is_a_level():
    import numpy

    from streampool import _sleep_level

    assert _sleep_level(numpy.int64(2)) == 2 and _sleep_level(numpy.int32(1)) == 1


@pytest.mark.skipif(BACKEND != "vmm", reason="the vmm backend sleeps (scripts/test runs it on vmm, the default)")
def test_sleep_first_lets_go_of_shared_tensors_every_receiver_released(monkeypatch):
    # A tensor shared page by page holds the device awake while streampool keeps it for its
    # receivers; those every receiver released are let go (ipc_collect) before the sleep.
    collected = []
    monkeypatch.setattr(streampool, "shared_block_count", lambda: 1)
    monkeypatch.setattr(streampool, "ipc_collect", lambda: collected.append(True) or 1)
    streampool.sleep(device=0)
    assert collected == [True]
    streampool.wake(0)

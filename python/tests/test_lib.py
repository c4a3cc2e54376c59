"""The C ABI through ctypes, on the simulated driver: statistics after known sequences, errors."""

import pytest
from helpers import GiB, MiB

import streampool
from streampool import _lib
from conftest import pool_backend_only

STREAM_A = 0x1234  # fake stream handles: the simulated driver accepts any value
STREAM_B = 0x5678


@pytest.fixture(autouse=True)
def empty_pools():
    """Each test starts with an empty cache and nothing allocated on device 0 and 1."""
    streampool.empty_cache()
    for device in (0, 1):
        assert _lib.get_stats(device).allocated_bytes == 0, "an earlier test leaked an allocation"
    yield


def stats(device=0):
    return _lib.get_stats(device).as_dict()


def delta(after, before):
    return {key: after[key] - before[key] for key in after}


def test_alloc_and_free_update_counters_exactly():
    before = stats()
    a = _lib.malloc(1000, 0, None)
    b = _lib.malloc(4096, 0, STREAM_A)
    live = delta(stats(), before)
    assert live["allocated_bytes"] == 5096
    assert live["active_bytes"] == 5096
    assert live["allocated_bytes_total"] == 5096
    assert live["allocations_current"] == 2
    assert live["num_allocs"] == 2
    assert live["freed_bytes_total"] == 0 and live["num_frees"] == 0

    _lib.free(a, 1000, 0, None)
    half = delta(stats(), before)
    assert half["allocated_bytes"] == 4096
    assert half["freed_bytes_total"] == 1000
    assert half["num_frees"] == 1

    _lib.free(b, 4096, 0, STREAM_A)
    done = delta(stats(), before)
    assert done["allocated_bytes"] == 0 and done["allocations_current"] == 0
    assert done["active_bytes"] == 0
    assert done["freed_bytes_total"] == 5096 and done["num_frees"] == 2


def test_pointers_are_distinct_and_aligned():
    sizes = [1, 511, 512, 513, 1 * MiB, 3 * MiB + 7]
    pointers = [_lib.malloc(size, 0, STREAM_A) for size in sizes]
    assert len(set(pointers)) == len(sizes)
    assert all(p % 512 == 0 for p in pointers)
    ranges = sorted(zip(pointers, sizes))
    for (start, size), (next_start, _) in zip(ranges, ranges[1:]):
        assert start + size <= next_start, "live allocations overlap"
    for p, size in zip(pointers, sizes):
        _lib.free(p, size, 0, STREAM_A)


def test_peak_follows_the_maximum_and_reset_lowers_it_to_current():
    streampool.reset_peak_memory_stats(0)
    a = _lib.malloc(1 * MiB, 0)
    b = _lib.malloc(2 * MiB, 0)
    _lib.free(b, 2 * MiB, 0)
    s = stats()
    assert s["allocated_bytes"] == 1 * MiB
    assert s["allocated_bytes_peak"] == 3 * MiB
    assert s["allocations_peak"] == 2
    assert s["reserved_bytes_peak"] >= s["reserved_bytes"] > 0

    streampool.reset_peak_memory_stats(0)
    s = stats()
    assert s["allocated_bytes_peak"] == 1 * MiB
    assert s["active_bytes_peak"] == 1 * MiB
    assert s["allocations_peak"] == 1
    assert s["reserved_bytes_peak"] == s["reserved_bytes"]
    _lib.free(a, 1 * MiB, 0)


@pool_backend_only
def test_same_stream_reuse_is_a_cache_hit_without_a_device_allocation():
    first = _lib.malloc(1 * MiB, 0, STREAM_A)
    _lib.free(first, 1 * MiB, 0, STREAM_A)
    before = stats()
    assert before["cached_bytes"] == 1 * MiB

    second = _lib.malloc(1 * MiB, 0, STREAM_A)
    after = delta(stats(), before)
    assert second == first
    assert after["num_cache_hits"] == 1
    assert after["num_device_allocs"] == 0
    assert stats()["cached_bytes"] == 0
    _lib.free(second, 1 * MiB, 0, STREAM_A)


@pool_backend_only
def test_a_block_freed_on_one_stream_is_not_served_from_the_cache_to_another():
    block = _lib.malloc(1 * MiB, 0, STREAM_A)
    _lib.free(block, 1 * MiB, 0, STREAM_A)
    before = stats()
    other = _lib.malloc(1 * MiB, 0, STREAM_B)
    assert delta(stats(), before)["num_cache_hits"] == 0
    assert other != block
    _lib.free(other, 1 * MiB, 0, STREAM_B)


def test_record_stream_keeps_a_freed_block_active_until_the_streams_finish():
    block = _lib.malloc(4 * MiB, 0, STREAM_A)
    _lib.library().streampool_record_stream(block, STREAM_B)
    _lib.free(block, 4 * MiB, 0, STREAM_A)
    s = stats()
    assert s["allocated_bytes"] == 0
    assert s["active_bytes"] == 4 * MiB  # waits for an event on STREAM_B
    again = _lib.malloc(4 * MiB, 0, STREAM_A)
    assert again != block, "reused while another stream may still read it"
    _lib.free(again, 4 * MiB, 0, STREAM_A)

    streampool.empty_cache()  # synchronises: the simulated streams complete
    assert stats()["active_bytes"] == 0


@pytest.mark.parametrize("offset", [0, 512], ids=["double-free", "interior-pointer"])
def test_freeing_a_pointer_not_owned_raises_and_changes_nothing(offset):
    block = _lib.malloc(2048, 0)
    if offset == 0:
        _lib.free(block, 2048, 0)
    before = stats()
    with pytest.raises(streampool.UnknownPointerError, match="unknown pointer") as raised:
        _lib.free(block + offset, 2048, 0)
    assert raised.value.status == _lib.UNKNOWN_POINTER
    assert stats() == before
    if offset:
        _lib.free(block, 2048, 0)


def test_freeing_a_foreign_pointer_raises_with_its_address():
    with pytest.raises(streampool.UnknownPointerError, match="0xdead0000"):
        _lib.free(0xDEAD0000, 64, 0)


def test_record_stream_of_an_unknown_pointer_is_reported_in_last_error():
    _lib.library().streampool_record_stream(0xDEAD0000, STREAM_B)
    assert "unknown pointer 0xdead0000" in _lib.last_error()


def test_my_free_of_an_unknown_pointer_does_not_throw_and_sets_last_error():
    before = stats()
    _lib.library().my_free(0xDEAD0000, 64, 0, None)
    assert "unknown pointer" in _lib.last_error()
    assert stats() == before


def test_my_malloc_serves_pytorch_allocations():
    ptr = _lib.library().my_malloc(4096, 0, STREAM_A)
    assert ptr and stats()["allocated_bytes"] == 4096
    _lib.library().my_free(ptr, 4096, 0, STREAM_A)
    assert stats()["allocated_bytes"] == 0


def test_size_zero_gives_null_quietly():
    before = stats()
    assert _lib.library().streampool_malloc(0, 0, None) is None
    assert _lib.last_error() == ""
    assert _lib.malloc(0, 0) is None
    assert _lib.library().my_malloc(0, 0, None) is None
    assert stats() == before


@pytest.mark.parametrize("size, match", [(-1, "must not be negative, got -1"), (-(2**63), "must not be negative"),
                                         (2**64, "must be below 2\\*\\*64")])
def test_sizes_ctypes_would_wrap_are_refused_before_the_library_sees_them(size, match):
    # ctypes.c_size_t turns -1 into 2**64 - 1, a size the library must never be asked for.
    before = stats()
    with pytest.raises(streampool.InvalidArgumentError, match=match) as raised:
        _lib.malloc(size, 0)
    assert raised.value.status == _lib.INVALID_ARGUMENT
    assert stats() == before


def test_a_size_that_is_not_an_integer_is_a_type_error():
    with pytest.raises(TypeError, match="allocation size must be an int"):
        _lib.malloc(4096.0, 0)


def test_a_failed_status_without_a_message_names_the_header_constant():
    _lib.device_count()  # clears this thread's last error
    with pytest.raises(streampool.StreampoolError, match="failed with STREAMPOOL_STATUS_INTERNAL_ERROR$"):
        _lib.check(_lib.INTERNAL_ERROR)


def test_errors_carry_their_public_path_and_survive_pickling():
    import pickle

    for name in ("StreampoolError", "ConfigError", "DriverError", "InvalidArgumentError", "OutOfMemoryError",
                 "UnknownPointerError"):
        cls = getattr(streampool, name)
        assert f"{cls.__module__}.{cls.__qualname__}" == f"streampool.{name}"
        copy = pickle.loads(pickle.dumps(cls("message", -1)))
        assert type(copy) is cls and str(copy) == "message"


def test_is_out_of_memory_knows_every_form_of_the_error():
    assert streampool.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1.00 PiB"))
    assert streampool.is_out_of_memory(streampool.OutOfMemoryError("CUDA out of memory.", _lib.OUT_OF_MEMORY))
    assert not streampool.is_out_of_memory(RuntimeError("CUDA error: an illegal memory access"))
    assert not streampool.is_out_of_memory(ValueError("CUDA out of memory."))
    assert not streampool.is_out_of_memory(KeyboardInterrupt())


@pytest.mark.parametrize("size", [-1, -4096, -(1 << 63), 1 << 64, (1 << 64) + 512])
def test_a_size_that_is_no_size_t_is_refused_before_ctypes_wraps_it(size):
    """ctypes once passed -1 as SIZE_MAX and 2**64 + 512 as 512."""
    before = stats()
    with pytest.raises(streampool.InvalidArgumentError, match="allocation size"):
        _lib.malloc(size, 0)
    assert stats() == before


@pytest.mark.parametrize("size", [(1 << 64) - 1, (1 << 64) - 2048, (1 << 48) + 1, 1 << 50])
def test_a_size_above_the_maximum_is_out_of_memory_counted_and_changes_nothing_else(size):
    """Sizes whose rounding overflowed used to succeed in release builds; above the maximum a size
    is out of memory, as PyTorch reports any request it cannot serve: counted in num_ooms only."""
    before = stats()
    with pytest.raises(streampool.OutOfMemoryError) as raised:
        _lib.malloc(size, 0)
    message = str(raised.value)
    assert message.startswith("CUDA out of memory. Tried to allocate "), message
    assert "which is larger than streampool's maximum of 256.00 TiB" in message, message
    assert streampool.is_out_of_memory(raised.value)
    after = stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 1
    assert after == before


def test_free_of_null_is_a_no_op():
    assert _lib.library().streampool_free(None, 0, 0, None) == _lib.OK
    _lib.library().my_free(None, 0, 0, None)


@pytest.mark.parametrize("device", [-1, 2, 99])
def test_bad_device_index_is_an_error_naming_the_index(device):
    with pytest.raises(streampool.InvalidArgumentError, match=f"device index {device} is out of range"):
        _lib.get_stats(device)
    with pytest.raises(streampool.StreampoolError, match=f"device index {device}"):
        _lib.malloc(64, device)
    with pytest.raises(streampool.StreampoolError, match=f"device index {device}"):
        streampool.trim(0, device)


def test_device_one_is_independent_of_device_zero():
    block = _lib.malloc(1 * MiB, 1)
    assert stats(1)["allocated_bytes"] == 1 * MiB
    assert stats(0)["allocated_bytes"] == 0
    _lib.free(block, 1 * MiB, 1)


def test_pool_out_of_memory_raises_counts_and_recovers():
    before = stats()
    with pytest.raises(streampool.OutOfMemoryError) as raised:
        _lib.malloc(32 * GiB, 0)  # the simulated device has 16 GiB
    message = str(raised.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 32.00 GiB")
    after = delta(stats(), before)
    assert after["num_ooms"] == 1
    assert after["num_alloc_retries"] == 1
    assert after["allocated_bytes"] == 0 and after["num_allocs"] == 0
    block = _lib.malloc(1 * MiB, 0)
    _lib.free(block, 1 * MiB, 0)


def test_memory_fraction_caps_the_bytes_held_from_the_pool():
    lib = _lib.library()
    total = stats(1)["device_total_bytes"]
    lib.streampool_set_memory_fraction(0.001, 1)
    try:
        assert stats(1)["memory_limit_bytes"] == int(total * 0.001)
        with pytest.raises(streampool.OutOfMemoryError, match="set_per_process_memory_fraction"):
            _lib.malloc(32 * MiB, 1)
        assert stats(1)["num_ooms"] >= 1
        small = _lib.malloc(1 * MiB, 1)
        _lib.free(small, 1 * MiB, 1)
    finally:
        lib.streampool_set_memory_fraction(1.0, 1)


def test_invalid_memory_fraction_is_reported_in_last_error_and_ignored():
    before = stats(1)["memory_limit_bytes"]
    _lib.library().streampool_set_memory_fraction(1.5, 1)
    assert "memory fraction 1.5 is outside" in _lib.last_error()
    assert stats(1)["memory_limit_bytes"] == before


def test_parse_bytes_resolves_units_and_percentages():
    total = stats(0)["device_total_bytes"]
    assert _lib.parse_bytes("8GiB", 0) == 8 * GiB
    assert _lib.parse_bytes("512MB", 0) == 512_000_000
    assert _lib.parse_bytes("4096", 0) == 4096
    assert _lib.parse_bytes("80%", 0) == int(total * 0.8)
    assert _lib.parse_bytes("max", 0) == 2**64 - 1
    with pytest.raises(streampool.InvalidArgumentError, match="12XB"):
        _lib.parse_bytes("12XB", 0)


@pool_backend_only
def test_trim_returns_cached_memory_and_shrinks_the_pool():
    block = _lib.malloc(8 * MiB, 0, STREAM_A)
    _lib.free(block, 8 * MiB, 0, STREAM_A)
    s = stats()
    assert s["cached_bytes"] == 8 * MiB and s["reserved_bytes"] >= 8 * MiB
    streampool.trim(0, 0)
    s = stats()
    assert s["cached_bytes"] == 0
    assert s["reserved_bytes"] == 0
    assert s["num_device_frees"] >= 1


def test_trim_keeps_the_requested_bytes_reserved():
    blocks = [_lib.malloc(8 * MiB, 0, STREAM_A) for _ in range(4)]
    for block in blocks:
        _lib.free(block, 8 * MiB, 0, STREAM_A)
    streampool.trim("16MiB", 0)
    s = stats()
    assert s["cached_bytes"] == 0
    assert 16 * MiB <= s["reserved_bytes"] < 32 * MiB


def test_version_driver_and_device_count():
    assert streampool.__version__ == _lib.version()
    assert streampool.__version__.count(".") == 2
    assert streampool.driver_name() == "sim"
    assert streampool.device_count() == 2
    assert streampool.library_path().endswith(".so")


def test_is_out_of_memory_knows_torch_typed_error(monkeypatch):
    import sys
    import types

    class OutOfMemoryError(RuntimeError):
        """Stands in for torch.OutOfMemoryError, whose message need not start as streampool's."""

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError))
    assert streampool.is_out_of_memory(OutOfMemoryError("out of memory on device 0"))

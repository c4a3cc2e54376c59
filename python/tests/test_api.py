"""The public Python API on the simulated driver, without torch."""

import sys

import pytest
from helpers import MiB

import streampool
from streampool import _lib
from streampool._config import option_environment, variables_in_effect
from streampool._device import device_index
from streampool._stats import format_bytes
from conftest import pool_backend_only

TORCH_KEYS = {
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "allocation.all.current",
    "allocation.all.peak",
    "allocation.all.allocated",
    "allocation.all.freed",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
}
OWN_KEYS = {
    "cached_bytes",
    "cache_hits",
    "pool_used_bytes",
    "memory_limit_bytes",
    "device_total_bytes",
    "ipc_reserved_bytes",
    "ipc_used_bytes",
    "num_growth_syncs",
    "num_maps",
    "num_unmaps",
    "num_mem_creates",
    "num_mem_releases",
    "num_set_access_calls",
    "num_stream_waits",
    "num_idle_releases",
}


@pytest.fixture(autouse=True)
def empty_pools():
    streampool.empty_cache()
    assert streampool.memory_allocated(0) == 0, "an earlier test leaked an allocation"
    yield


def test_memory_stats_has_pytorch_and_streampool_keys_sorted():
    stats = streampool.memory_stats()
    assert set(stats) == TORCH_KEYS | OWN_KEYS
    assert list(stats) == sorted(stats)
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["device_total_bytes"] == 16 << 30


def _flat_stats():
    return streampool.memory_stats()


def _torch_named_stats():
    from streampool import _torch_stats

    nested = _torch_stats._raw_nested(0)
    return {"allocated_bytes.all.current": nested["allocated_bytes"]["all"]["current"],
            "reserved_bytes.all.current": nested["reserved_bytes"]["all"]["current"]}


@pytest.mark.parametrize("read", [_flat_stats, _torch_named_stats])
@pytest.mark.parametrize("race", ["free", "malloc"])
def test_stats_never_pair_reserved_bytes_and_allocated_bytes_of_two_moments(
        monkeypatch, read, race):
    # Another thread, as under a thread storm, frees 64 MiB and empties the cache just before the
    # reserved bytes are read, or allocates 64 MiB just after: the figures must be of one moment,
    # never reserved below allocated.
    streampool.empty_cache()
    block = _lib.malloc(64 * MiB, 0) if race == "free" else None
    read_reserved = _lib.reserved_total
    raced = []

    def race_the_read(device):
        nonlocal block
        if raced:
            return read_reserved(device)
        raced.append(True)
        if race == "free":
            _lib.free(block, 64 * MiB, 0)
            block = None
            streampool.empty_cache()
            return read_reserved(device)
        figures = read_reserved(device)
        block = _lib.malloc(64 * MiB, 0)
        return figures

    monkeypatch.setattr(_lib, "reserved_total", race_the_read)
    try:
        stats = read()
    finally:
        if block is not None:
            _lib.free(block, 64 * MiB, 0)
    assert raced
    assert stats["allocated_bytes.all.current"] == (0 if race == "free" else 64 * MiB)
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]


def test_memory_stats_values_follow_allocations():
    streampool.reset_peak_memory_stats()
    before = streampool.memory_stats()
    a = _lib.malloc(3 * MiB, 0)
    b = _lib.malloc(1000, 0)
    _lib.free(b, 1000, 0)
    after = streampool.memory_stats()
    assert after["allocated_bytes.all.current"] == 3 * MiB
    assert after["allocated_bytes.all.peak"] == 3 * MiB + 1000
    assert after["allocated_bytes.all.allocated"] - before["allocated_bytes.all.allocated"] == 3 * MiB + 1000
    assert after["allocated_bytes.all.freed"] - before["allocated_bytes.all.freed"] == 1000
    assert after["allocation.all.current"] == 1
    assert after["allocation.all.allocated"] - before["allocation.all.allocated"] == 2
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == 1
    assert after["reserved_bytes.all.current"] >= 3 * MiB
    assert streampool.memory_allocated() == 3 * MiB
    assert streampool.max_memory_allocated() == 3 * MiB + 1000
    assert streampool.memory_reserved() == after["reserved_bytes.all.current"]
    assert streampool.max_memory_reserved() == after["reserved_bytes.all.peak"]
    _lib.free(a, 3 * MiB, 0)
    streampool.reset_peak_memory_stats()
    assert streampool.max_memory_allocated() == 0


def test_reset_peak_memory_stats_rejects_a_bad_device():
    with pytest.raises(streampool.InvalidArgumentError, match="device index 7"):
        streampool.reset_peak_memory_stats(7)


def test_memory_summary_is_a_readable_table():
    block = _lib.malloc(3 * MiB, 1)
    text = streampool.memory_summary("cuda:1")
    _lib.free(block, 3 * MiB, 1)
    lines = text.splitlines()
    assert "device 1 (driver sim)" in lines[1]
    assert len({len(line) for line in lines}) == 1, "ragged table"
    allocated = next(line for line in lines if line.startswith("| Allocated memory"))
    assert "3.00 MiB" in allocated
    assert "16.00 GiB" in text
    for label in ("Reserved memory", "Active memory", "Allocations", "Cache hits", "Memory limit"):
        assert label in text


@pytest.mark.parametrize(
    "limit, shown", [((1 << 64) - 1, "none"), (0, "0 B"), (8 << 30, "8.00 GiB")]
)
def test_memory_summary_tells_no_limit_from_a_cap_of_zero(limit, shown):
    from streampool._lib import StreampoolStats
    from streampool._stats import summary

    text = summary(0, "sim", StreampoolStats(memory_limit_bytes=limit), (0, 0))
    row = next(line for line in text.splitlines() if "Memory limit" in line)
    assert row.rstrip("| ").endswith(shown), row


@pytest.mark.parametrize(
    "count, text",
    [(0, "0 B"), (511, "511 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (3 * MiB, "3.00 MiB"), (10 << 40, "10.00 TiB")],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


class device:  # stands in for torch.device: same class name and attributes
    def __init__(self, type, index=None):
        self.type, self.index = type, index


@pytest.mark.parametrize(
    "argument, index",
    [(None, 0), (1, 1), ("cuda", 0), ("cuda:1", 1), (device("cuda", 1), 1), (device("cuda"), 0)],
)
def test_device_arguments(argument, index):
    assert device_index(argument) == index


@pytest.mark.parametrize(
    "argument, error",
    [("cpu", ValueError), ("cuda:x", ValueError), (device("cpu", 0), ValueError), (1.5, TypeError), (True, TypeError)],
)
def test_bad_device_arguments(argument, error):
    with pytest.raises(error):
        device_index(argument)


@pytest.mark.parametrize("index", [2**32, 2**32 + 1, -(2**31) - 1, 2**64])
def test_a_device_index_no_c_int_holds_is_refused_not_wrapped(index):
    # ctypes wrapped 2**32 to device 0: its statistics were read, its threshold changed.
    for call in (lambda: streampool.memory_allocated(index),
                 lambda: streampool.set_release_threshold("1GiB", device=index),
                 lambda: streampool.ipc_supported(index),
                 lambda: streampool.memory_allocated(f"cuda:{abs(index)}")):
        with pytest.raises(streampool.InvalidArgumentError, match="does not exist"):
            call()


def test_ipc_supported_takes_every_form_of_device():
    assert streampool.ipc_supported("cuda:1") == streampool.ipc_supported(1)
    assert streampool.ipc_supported(None) == streampool.ipc_supported(0)


def test_set_release_threshold_accepts_bytes_and_strings():
    total = streampool.memory_stats()["device_total_bytes"]
    assert streampool.set_release_threshold("80%") == int(total * 0.8)
    assert streampool.set_release_threshold(1 << 30, device="cuda:1") == 1 << 30
    assert streampool.set_release_threshold("max") == 2**64 - 1


@pytest.mark.parametrize(
    "value, error, match",
    [
        ("12XB", streampool.InvalidArgumentError, "12XB"),
        (-1, ValueError, "must be >= 0"),
        (2**64, ValueError, "uint64"),
        (1.5, TypeError, "must be bytes"),
        (True, TypeError, "must be bytes"),
        # C would read "1GiB" and drop the rest: refused whole, naming the value.
        ("1GiB\0 and more", streampool.InvalidArgumentError, "NUL character"),
        ("1GiB\udcff", streampool.InvalidArgumentError, "not UTF-8"),
    ],
)
def test_set_release_threshold_rejects_bad_values(value, error, match):
    with pytest.raises(error, match=match):
        streampool.set_release_threshold(value)


def test_trim_refuses_a_size_with_a_nul_character():
    with pytest.raises(streampool.InvalidArgumentError, match="NUL"):
        streampool.trim("0\0x")


@pytest.mark.parametrize("value", [-1, 2**64, 2**70])
def test_trim_rejects_sizes_outside_uint64_before_ctypes_wraps_them(value):
    with pytest.raises(ValueError, match=r"must be >= 0 and < 2\*\*64 bytes"):
        streampool.trim(value)


@pool_backend_only
def test_trim_through_the_public_api_empties_the_cache():
    block = _lib.malloc(4 * MiB, 0)
    _lib.free(block, 4 * MiB, 0)
    assert streampool.memory_stats()["cached_bytes"] == 4 * MiB
    streampool.trim()
    assert streampool.memory_stats()["cached_bytes"] == 0
    assert streampool.memory_reserved() == 0


def test_empty_cache_returns_every_cached_block():
    for device in (0, 1):
        block = _lib.malloc(2 * MiB, device)
        _lib.free(block, 2 * MiB, device)
    streampool.empty_cache()
    assert [streampool.memory_stats(d)["cached_bytes"] for d in (0, 1)] == [0, 0]


def test_empty_cache_and_reset_peak_do_not_report_an_earlier_error():
    _lib.library().streampool_record_stream(0xDEAD0000, 0x5678)
    assert "unknown pointer" in _lib.last_error()
    streampool.empty_cache()
    streampool.reset_peak_memory_stats(1)
    assert _lib.last_error() == ""


def test_an_error_set_by_a_void_export_becomes_an_exception():
    # empty_cache() and reset_peak_memory_stats() call their exports this way.
    before = streampool.memory_stats(1)["memory_limit_bytes"]
    with pytest.raises(streampool.StreampoolError, match="memory fraction 1.5 is outside"):
        _lib.call_reporting("streampool_set_memory_fraction", 1.5, 1)
    assert streampool.memory_stats(1)["memory_limit_bytes"] == before


@pytest.mark.parametrize("device", [2, -1, "cuda:7", "cpu"])
def test_mempool_rejects_a_device_streampool_does_not_have_before_needing_torch(device):
    with pytest.raises(ValueError, match="device"):
        streampool.mempool(device)


def test_install_rejects_unknown_options_before_needing_torch():
    with pytest.raises(TypeError, match="release_treshold"):
        streampool.install(release_treshold="8GiB")


def test_option_values_become_environment_text():
    assert option_environment(
        {"release_threshold": 8 << 30, "cache_limit": "10%", "reuse_allow_opportunistic": False, "log": "info"}
    ) == {
        "STREAMPOOL_RELEASE_THRESHOLD": str(8 << 30),
        "STREAMPOOL_CACHE_LIMIT": "10%",
        "STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC": "0",
        "STREAMPOOL_LOG": "info",
    }
    with pytest.raises(TypeError, match="max_pool_size must be a bool, int or str"):
        option_environment({"max_pool_size": 1.5})


def test_variables_in_effect_tell_environment_from_default():
    rows = {name: (value, source) for name, value, source in variables_in_effect(
        {"STREAMPOOL_DRIVER": "sim", "RUST_LOG": "debug"}
    )}
    assert rows["STREAMPOOL_DRIVER"] == ("sim", "environment")
    assert rows["STREAMPOOL_RELEASE_THRESHOLD"] == ("max", "default")
    assert rows["STREAMPOOL_LOG"] == ("debug", "environment (RUST_LOG)")


def test_is_installed_is_false_without_install():
    assert not streampool.is_installed()


def test_install_takes_torch_stats_as_a_bool_only():
    # "no" was taken for True: the statistics were routed.
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match=r"install\(torch_stats=...\) must be True or False"):
            streampool.install(torch_stats=bad)


def test_sharing_without_torch_says_what_needs_it_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as where it is absent
    for call, name in ((lambda: streampool.share(object()), "share"), (lambda: streampool.open_shared(None), "open_shared")):
        with pytest.raises(ImportError, match=rf"^streampool\.{name}\(\) needs PyTorch 2\.5 or newer") as raised:
            call()
        assert "\n" not in str(raised.value)

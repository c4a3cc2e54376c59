"""The C ABI of libstreampool as ctypes sees it: the structs, the enums' names and every export's
signature, exactly as include/streampool.h and docs/abi.md give them (python/tests/test_header.py
checks them against the header).
"""

import ctypes
from typing import Dict

STATS_FIELDS = (
    "allocated_bytes",
    "allocated_bytes_peak",
    "allocated_bytes_total",
    "freed_bytes_total",
    "active_bytes",
    "active_bytes_peak",
    "reserved_bytes",
    "reserved_bytes_peak",
    "pool_used_bytes",
    "cached_bytes",
    "num_allocs",
    "num_frees",
    "allocations_current",
    "allocations_peak",
    "num_cache_hits",
    "num_device_allocs",
    "num_device_frees",
    "num_alloc_retries",
    "num_ooms",
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
)


class StreampoolStats(ctypes.Structure):
    """``struct StreampoolStats``: 31 ``uint64_t`` counters, in the C field order."""

    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]

    def as_dict(self) -> Dict[str, int]:
        return {name: int(getattr(self, name)) for name in STATS_FIELDS}


class StreampoolEvent(ctypes.Structure):
    """``struct StreampoolEvent``: one memory-timeline entry (include/streampool.h)."""

    _fields_ = [
        ("time_ns", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_uint64),
        ("address", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("held_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
    ]


class StreampoolBlock(ctypes.Structure):
    """``struct StreampoolBlock``: one block a device holds from its pool."""

    _fields_ = [
        ("address", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("requested_bytes", ctypes.c_uint64),
        ("stream", ctypes.c_uint64),
        ("state", ctypes.c_uint32),
        ("device", ctypes.c_int32),
    ]


class StreampoolPoolBlock(ctypes.Structure):
    """A live block or a segment of a PyTorch memory pool (``streampool_graph_pool_blocks``)."""

    _fields_ = [
        ("address", ctypes.c_uint64),
        ("requested_bytes", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("stream", ctypes.c_uint64),
    ]


class StreampoolIpcHandle(ctypes.Structure):
    """``struct StreampoolIpcHandle``: what another process needs to map one shareable block."""

    _fields_ = [
        ("pointer_data", ctypes.c_uint8 * 64),
        ("event_handle", ctypes.c_uint8 * 64),
        ("event", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("pool_fd", ctypes.c_int32),
        ("device", ctypes.c_int32),
    ]


class StreampoolIpcPages(ctypes.Structure):
    """``struct StreampoolIpcPages``: what another process needs, besides one file descriptor per
    page, to map a block of the vmm backend."""

    _fields_ = [
        ("event_handle", ctypes.c_uint8 * 64),
        ("event", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("offset_bytes", ctypes.c_uint64),
        ("page_bytes", ctypes.c_uint64),
        ("page_count", ctypes.c_uint64),
        ("device", ctypes.c_int32),
    ]


# enum StreampoolEventKind / StreampoolBlockState values -> names used in Python.
EVENT_KINDS = {
    1: "alloc",
    2: "free",
    3: "pool_alloc",
    4: "pool_free",
    5: "pool_grow",
    6: "pool_trim",
    7: "oom",
    8: "map",
    9: "unmap",
}
BLOCK_STATES = {1: "live", 2: "inactive", 3: "waiting_for_streams"}

_c_void_p = ctypes.c_void_p
_c_int = ctypes.c_int
_c_uint64 = ctypes.c_uint64

# name -> (restype, argtypes), exactly as in docs/abi.md.
_SIGNATURES = {
    "my_malloc": (_c_void_p, [ctypes.c_ssize_t, _c_int, _c_void_p]),
    "my_free": (None, [_c_void_p, ctypes.c_ssize_t, _c_int, _c_void_p]),
    "streampool_malloc": (_c_void_p, [ctypes.c_size_t, _c_int, _c_void_p]),
    "streampool_free": (_c_int, [_c_void_p, ctypes.c_size_t, _c_int, _c_void_p]),
    "streampool_last_error": (ctypes.c_char_p, []),
    "streampool_init": (None, [_c_int]),
    "streampool_empty_cache": (None, []),
    "streampool_record_stream": (None, [_c_void_p, _c_void_p]),
    "streampool_set_memory_fraction": (None, [ctypes.c_double, _c_int]),
    "streampool_get_stats": (_c_int, [_c_int, ctypes.POINTER(StreampoolStats)]),
    "streampool_reset_peak_stats": (None, [_c_int]),
    "streampool_set_release_threshold": (_c_int, [_c_int, _c_uint64]),
    "streampool_trim": (_c_int, [_c_int, _c_uint64]),
    "streampool_parse_bytes": (_c_int, [ctypes.c_char_p, _c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_device_count": (_c_int, []),
    "streampool_check_config": (_c_int, []),
    "streampool_check_setting": (_c_int, [ctypes.c_char_p, ctypes.c_char_p]),
    "streampool_version": (ctypes.c_char_p, []),
    "streampool_driver_name": (ctypes.c_char_p, []),
    "streampool_enable_peer_access": (_c_int, [_c_int]),
    "streampool_record_history": (_c_int, [_c_int, ctypes.c_size_t]),
    "streampool_history": (
        _c_int,
        [
            ctypes.POINTER(StreampoolEvent),
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(_c_uint64),
        ],
    ),
    "streampool_shareable_begin": (_c_int, []),
    "streampool_shareable_end": (_c_int, []),
    "streampool_ipc_supported": (_c_int, [_c_int]),
    "streampool_pools_supported": (_c_int, [_c_int]),
    "streampool_vmm_supported": (_c_int, [_c_int]),
    "streampool_ipc_export": (_c_int, [_c_void_p, _c_int, _c_void_p, ctypes.POINTER(StreampoolIpcHandle)]),
    "streampool_ipc_release_export": (_c_int, [_c_int, _c_uint64]),
    "streampool_ipc_import_pool": (_c_int, [_c_int, _c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_ipc_import": (
        _c_int,
        [_c_uint64, ctypes.POINTER(StreampoolIpcHandle), _c_void_p, ctypes.POINTER(_c_void_p)],
    ),
    "streampool_ipc_close": (_c_int, [_c_void_p, _c_void_p]),
    "streampool_ipc_kind": (_c_int, [_c_void_p, _c_int]),
    "streampool_synchronizing": (_c_int, [_c_int]),
    "streampool_synchronized": (_c_int, [_c_int]),
    "streampool_sleep": (_c_int, [_c_int, _c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_wake": (_c_int, [_c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_sleeping_bytes": (_c_int, [_c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_sleep_saved_bytes": (_c_int, [_c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_sleep_host_buffer_bytes": (_c_int, [_c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_release_sleep_buffer": (_c_int, [_c_int, ctypes.POINTER(_c_uint64)]),
    "streampool_reserve_sleep_buffer": (_c_int, [_c_int, _c_uint64, ctypes.POINTER(_c_uint64)]),
    "streampool_sleep_discarding": (
        _c_int,
        [_c_int, _c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.POINTER(_c_uint64)],
    ),
    "streampool_tag_push": (_c_int, [ctypes.c_char_p]),
    "streampool_tag_pop": (_c_int, []),
    "streampool_ipc_export_pages": (
        _c_int,
        [
            _c_void_p,
            _c_int,
            _c_void_p,
            ctypes.POINTER(StreampoolIpcPages),
            ctypes.POINTER(_c_int),
            ctypes.c_size_t,
        ],
    ),
    "streampool_ipc_import_pages": (
        _c_int,
        [
            ctypes.POINTER(StreampoolIpcPages),
            ctypes.POINTER(_c_int),
            ctypes.c_size_t,
            _c_void_p,
            ctypes.POINTER(_c_void_p),
        ],
    ),
    "streampool_blocks": (
        _c_int,
        [_c_int, ctypes.POINTER(StreampoolBlock), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "streampool_begin_allocate_to_pool": (None, [_c_int, _c_uint64, _c_uint64, _c_void_p]),
    "streampool_end_allocate_to_pool": (None, [_c_int, _c_uint64, _c_uint64]),
    "streampool_release_pool": (None, [_c_int, _c_uint64, _c_uint64]),
    "streampool_torch_attach": (ctypes.c_char_p, []),
    "streampool_graph_pool_use_count": (_c_int, [_c_int, _c_uint64, _c_uint64]),
    "streampool_graph_pool_blocks": (
        _c_int,
        [
            _c_int,
            _c_uint64,
            _c_uint64,
            _c_int,
            ctypes.POINTER(StreampoolPoolBlock),
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ],
    ),
    "streampool_graph_pool_expect_restore": (
        _c_int,
        [_c_int, _c_uint64, _c_uint64, _c_void_p, _c_uint64, _c_uint64, _c_void_p],
    ),
    "streampool_checkpoint_prepare": (_c_int, [_c_int, ctypes.POINTER(_c_uint64), ctypes.c_size_t]),
    "streampool_graph_pool_ids": (
        _c_int,
        [_c_int, ctypes.POINTER(_c_uint64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "streampool_reserved_total": (_c_int, [_c_int, ctypes.POINTER(_c_uint64), ctypes.POINTER(_c_uint64)]),
    "streampool_history_set_gatherer": (_c_int, [_c_void_p, _c_int]),
    "streampool_history_contexts": (
        _c_int,
        [
            ctypes.POINTER(StreampoolEvent),
            ctypes.POINTER(_c_uint64),
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(_c_uint64),
        ],
    ),
    "streampool_history_live_contexts": (
        _c_int,
        [_c_int, ctypes.POINTER(_c_uint64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
}

# Exports newer than libstreampool 0.1.0 as last measured on the GPU: a library without them still
# loads (the benchmark compares a build against the previous one with STREAMPOOL_LIBRARY), and
# asking for one of them there says so.
_NEWER_EXPORTS = frozenset(
    {
        "streampool_check_setting",
        "streampool_vmm_supported",
        "streampool_begin_allocate_to_pool",
        "streampool_end_allocate_to_pool",
        "streampool_release_pool",
        "streampool_torch_attach",
        "streampool_graph_pool_use_count",
        "streampool_graph_pool_blocks",
        "streampool_graph_pool_expect_restore",
        "streampool_checkpoint_prepare",
        "streampool_graph_pool_ids",
        "streampool_reserved_total",
        "streampool_history_set_gatherer",
        "streampool_history_contexts",
        "streampool_history_live_contexts",
        "streampool_ipc_kind",
        "streampool_ipc_export_pages",
        "streampool_ipc_import_pages",
        "streampool_synchronizing",
        "streampool_synchronized",
        "streampool_sleep",
        "streampool_wake",
        "streampool_sleeping_bytes",
        "streampool_sleep_saved_bytes",
        "streampool_sleep_host_buffer_bytes",
        "streampool_release_sleep_buffer",
        "streampool_reserve_sleep_buffer",
        "streampool_sleep_discarding",
        "streampool_tag_push",
        "streampool_tag_pop",
    }
)

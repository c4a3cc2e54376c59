"""CPU tests of install()'s PyTorch routing (streampool._parity) on the simulated driver, with a
fake ``torch`` that calls the library the way PyTorch does: allocations through ``my_malloc``,
memory pools begun through the hook PyTorch calls. (GPU behaviour: test_gpu_parity.py.)"""

import ctypes
import types

import pytest

from streampool import _lib, _parity

DEVICE = 0
POOL = (11, 0)
STREAM = 0x500


def _c():
    lib = _lib.library()
    lib.my_malloc.restype = ctypes.c_void_p
    lib.my_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.my_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib


class FakeTorch:
    """What _parity touches of torch: the current device, PyTorch's raw allocation call (which
    reaches my_malloc as PyTorch's does) and the real setCheckpointPoolState binding (recorded)."""

    def __init__(self):
        lib = _c()
        self.binding_calls = []
        self.booked = {}

        def raw_alloc(size, stream):
            ptr = lib.my_malloc(size, DEVICE, stream)
            self.booked[ptr] = size  # as PyTorch books it (allocation_metadata_)
            return ptr

        self._C = types.SimpleNamespace(
            _cuda_cudaCachingAllocator_raw_alloc=raw_alloc,
            _cuda_setCheckpointPoolState=lambda *args: self.binding_calls.append(args),
            _cuda_checkPoolLiveAllocations=object(),
            _cuda_getCheckpointState=object(),
            _cuda_record_memory_history=object(),
            _cuda_record_memory_history_legacy=object(),
            _cuda_memorySnapshot=object(),
            _cuda_cudaCachingAllocator_set_allocator_settings=lambda settings: None,
        )

        class _Device:
            def __init__(self, index):
                assert index == DEVICE

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.cuda = types.SimpleNamespace(device=_Device)


@pytest.fixture
def pool_route():
    """A route to POOL that claims every allocation of DEVICE (PyTorch's use_mem_pool claims its
    thread; NULL here claims all), ended and released afterwards."""
    lib = _c()
    lib.streampool_begin_allocate_to_pool(DEVICE, POOL[0], POOL[1], None)
    allocated = []

    def malloc(size):
        ptr = lib.my_malloc(size, DEVICE, STREAM)
        allocated.append((ptr, size))
        return ptr

    yield malloc
    lib.streampool_end_allocate_to_pool(DEVICE, POOL[0], POOL[1])
    for b in _parity.live_blocks(DEVICE, POOL):
        lib.my_free(b.address, b.requested_bytes, DEVICE, STREAM)
    lib.streampool_release_pool(DEVICE, POOL[0], POOL[1])
    lib.streampool_empty_cache()


def test_live_allocations_check_is_exact(pool_route):
    a, b = pool_route(4096), pool_route(1 << 20)
    assert _parity.check_pool_live_allocations(DEVICE, POOL, {a, b})
    assert not _parity.check_pool_live_allocations(DEVICE, POOL, {a})
    assert not _parity.check_pool_live_allocations(DEVICE, POOL, {a, b, b + 4096})
    with pytest.raises(_lib.StreampoolError, match="no memory pool"):
        _parity.check_pool_live_allocations(DEVICE, (99, 99), set())


def test_checkpoint_restores_freed_blocks_through_pytorchs_allocation_call(pool_route):
    torch = FakeTorch()
    restore = _parity._set_checkpoint_pool_state(torch, torch._C._cuda_setCheckpointPoolState)
    a, b = pool_route(4096), pool_route(3 << 20)
    state = _parity.get_checkpoint_state(DEVICE, POOL)
    assert {blk.address for blk in state.blocks} == {a, b}
    lib = _c()
    lib.my_free(a, 4096, DEVICE, STREAM)
    lib.my_free(b, 3 << 20, DEVICE, STREAM)
    restore(DEVICE, state, [], [1234])
    # Both came back at their addresses, through the raw allocation call (PyTorch booked them).
    assert _parity.check_pool_live_allocations(DEVICE, POOL, {a, b})
    assert torch.booked == {a: 4096, b: 3 << 20}
    # PyTorch's binding then ran with no state of its own and the storages to give deleters.
    assert torch.binding_calls == [(DEVICE, None, [], [1234])]


def test_a_checkpoint_refuses_to_drop_blocks_it_does_not_hold(pool_route):
    torch = FakeTorch()
    restore = _parity._set_checkpoint_pool_state(torch, torch._C._cuda_setCheckpointPoolState)
    a = pool_route(4096)
    state = _parity.get_checkpoint_state(DEVICE, POOL)
    extra = pool_route(8192)
    with pytest.raises(RuntimeError, match="stale tensors"):
        restore(DEVICE, state, [], [])
    assert torch.binding_calls == []
    assert _parity.check_pool_live_allocations(DEVICE, POOL, {a, extra})
    with pytest.raises(TypeError):
        restore(DEVICE, object(), [], [])
    with pytest.raises(RuntimeError, match="stale storages"):
        restore(DEVICE, state, [5], [])


def test_a_failed_restore_leaves_nothing_restored(pool_route):
    torch = FakeTorch()

    def refuse(*args):
        raise RuntimeError("PyTorch refused")

    deleted = []
    torch._C._cuda_cudaCachingAllocator_raw_delete = lambda ptr: (deleted.append(ptr), _c().my_free(ptr, 0, DEVICE, STREAM))
    restore = _parity._set_checkpoint_pool_state(torch, refuse)
    a = pool_route(4096)
    state = _parity.get_checkpoint_state(DEVICE, POOL)
    _c().my_free(a, 4096, DEVICE, STREAM)
    with pytest.raises(RuntimeError, match="PyTorch refused"):
        restore(DEVICE, state, [], [])
    assert deleted == [a], "the block restored before the failure stayed live"
    assert _parity.check_pool_live_allocations(DEVICE, POOL, set())


def test_the_whole_snapshot_lists_pool_segments_under_their_ids(pool_route):
    a = pool_route(4096)
    snapshot = _parity.memory_snapshot(None)
    pooled = [s for s in snapshot["segments"] if s["segment_pool_id"] == POOL]
    assert len(pooled) == 1 and pooled[0]["blocks"][0]["address"] == a
    others = [s for s in snapshot["segments"] if s["segment_pool_id"] != POOL]
    assert all(s["address"] != a for s in others), "a pool block listed twice"
    assert _parity.pool_ids(DEVICE) == [POOL]


def test_a_pool_snapshot_lists_its_segments_with_their_blocks(pool_route):
    a = pool_route(4096)
    snapshot = _parity.memory_snapshot((POOL[0], POOL[1], True))
    (segment,) = snapshot["segments"]
    assert segment["segment_pool_id"] == POOL and segment["total_size"] == 2 << 20
    states = [(blk["address"], blk["state"]) for blk in segment["blocks"]]
    assert states[0] == (a, "active_allocated") and states[1][1] == "inactive"
    assert sum(blk["size"] for blk in segment["blocks"]) == segment["total_size"]


def test_history_routing_records_and_stops():
    _parity.record_memory_history("all", max_entries=100)
    ptr = _lib.malloc(4096, DEVICE)
    _lib.free(ptr, 4096, DEVICE)
    actions = [e["action"] for e in _parity.memory_snapshot(None)["device_traces"][DEVICE]]
    assert "alloc" in actions and "free_completed" in actions
    _parity.record_memory_history(None)
    with pytest.raises(ValueError):
        _parity.record_memory_history("everything")


def test_route_replaces_and_restore_puts_back():
    torch = FakeTorch()
    original = dict(vars(torch._C))
    assert _parity.route(torch) == []
    assert torch._C._cuda_checkPoolLiveAllocations is _parity.check_pool_live_allocations
    assert _parity.restore() == 7
    assert vars(torch._C) == original
    # Without the C++ side of checkpoints, their routes stay PyTorch's.
    assert _parity.route(torch, checkpoints=False) == []
    assert torch._C._cuda_checkPoolLiveAllocations is original["_cuda_checkPoolLiveAllocations"]
    assert _parity.restore() == 4


def test_attach_without_pytorch_says_why():
    with pytest.raises(_lib.StreampoolError, match="libc10_cuda"):
        _parity.attach()


def _segments_total(snapshot, device=DEVICE):
    return sum(s["total_size"] for s in snapshot["segments"] if s["device"] == device)


def _torch_reserved(device=DEVICE):
    """torch.cuda.memory_reserved() under install() (streampool._torch_stats)."""
    from streampool import _torch_stats

    return _torch_stats._raw_nested(device)["reserved_bytes"]["all"]["current"]


def test_snapshot_segments_add_up_to_memory_reserved():
    """With tensors of 1, 5, 33 and 130 MiB live, then some freed, then with a shareable block and
    a memory pool's blocks too: the snapshot's segments always add up to memory_reserved(), and
    that is at least what the device's pools reserve."""
    MiB = 1 << 20
    from streampool import shareable

    lib = _c()
    checks = []

    def check(when):
        snapshot = _parity.memory_snapshot(None)
        total, reserved = _segments_total(snapshot), _torch_reserved()
        assert total == reserved, f"{when}: the segments add up to {total} B, memory_reserved() is {reserved} B"
        assert reserved >= _lib.get_stats(DEVICE).reserved_bytes, when
        checks.append(reserved)

    live = [(lib.my_malloc(n * MiB, DEVICE, STREAM), n * MiB) for n in (1, 5, 33, 130)]
    routed = False
    try:
        check("four tensors live")
        for ptr, size in live[1:3]:
            lib.my_free(ptr, size, DEVICE, STREAM)
        del live[1:3]
        with shareable():
            live.append((lib.my_malloc(3 * MiB, DEVICE, STREAM), 3 * MiB))
        check("a shareable block")
        lib.streampool_begin_allocate_to_pool(DEVICE, POOL[0], POOL[1], None)
        routed = True
        in_pool = [lib.my_malloc(size, DEVICE, STREAM) for size in (7 * MiB, 4096)]
        lib.streampool_end_allocate_to_pool(DEVICE, POOL[0], POOL[1])
        routed = False
        check("a memory pool's blocks")
        lib.my_free(in_pool[0], 7 * MiB, DEVICE, STREAM)
        check("a memory pool's block freed")
    finally:
        if routed:
            lib.streampool_end_allocate_to_pool(DEVICE, POOL[0], POOL[1])
        for ptr, size in live:
            lib.my_free(ptr, size, DEVICE, STREAM)
        if POOL in _parity.pool_ids(DEVICE):
            for b in _parity.live_blocks(DEVICE, POOL):
                lib.my_free(b.address, b.requested_bytes, DEVICE, STREAM)
            lib.streampool_release_pool(DEVICE, POOL[0], POOL[1])
        lib.streampool_empty_cache()
    check("after empty_cache")
    assert all(reserved > 0 for reserved in checks[:-1])



@pytest.mark.parametrize("name", ["_cuda_cudaCachingAllocator_set_allocator_settings",
                                  "_accelerator_setAllocatorSettings"])
def test_allocator_settings_are_routed_under_either_name_pytorch_has(name):
    calls = []
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(**{name: calls.append}))
    missing = _parity.route(torch, checkpoints=False)
    try:
        assert name not in missing and not any("settings" in m.lower() for m in missing), missing
        getattr(torch._C, name)("expandable_segments:False")
        assert calls == ["expandable_segments:False"]  # PyTorch's own call still made
    finally:
        _parity.restore()


def test_allocator_settings_are_missing_only_without_either_name():
    torch = types.SimpleNamespace(_C=types.SimpleNamespace())
    assert "_cuda_cudaCachingAllocator_set_allocator_settings" in _parity.route(torch, checkpoints=False)
    _parity.restore()

"""Sharing blocks between processes on the simulated driver, without torch: handles
survive pickling (the pool's descriptor through multiprocessing's descriptor sharing), the
exporter keeps a block until every receiver has released it, and only shareable memory exports.
The simulator cannot map memory across processes, so the receiver here is this process; the GPU
tests (test_gpu_ipc.py) use real ones."""

import pickle

import pytest
from conftest import BACKEND, pool_backend_only
from helpers import MiB, describe, run_python

import streampool
from streampool import _ipc, _ipc_torch, _lib
from streampool._stats import format_bytes


@pytest.fixture(autouse=True)
def clean():
    streampool.empty_cache()
    yield
    assert _ipc.ipc_collect() >= 0
    streampool.empty_cache()


def _shareable_block(size=3 * MiB, device=0):
    with streampool.shareable():
        return _lib.malloc(size, device, 0)


def test_a_handle_survives_pickling_and_maps_the_same_block():
    ptr = _shareable_block()
    handle = _ipc.share_block(ptr, 0, None, keep=None, nbytes=3 * MiB)
    received = pickle.loads(pickle.dumps(handle))
    assert received.fd != handle.fd and received.fd >= 0, "a new descriptor, passed by multiprocessing"
    block = _ipc.ImportedBlock(received, None)
    assert block.ptr == ptr
    assert block.__cuda_array_interface__["shape"] == (3 * MiB,)
    assert _ipc.ipc_collect() == 0, "not released yet"
    block.close()
    block.close()  # harmless twice
    assert _ipc.ipc_collect() == 1
    assert _ipc.shared_block_count() == 0
    _lib.free(ptr, 3 * MiB, 0)


def test_the_exporter_waits_for_every_receiver():
    ptr = _shareable_block()
    first = _ipc.ImportedBlock(pickle.loads(pickle.dumps(_ipc.share_block(ptr, 0, None, None, MiB))), None)
    second = _ipc.ImportedBlock(pickle.loads(pickle.dumps(_ipc.share_block(ptr, 0, None, None, MiB))), None)
    assert _ipc.shared_block_count() == 1, "one block, two handles"
    first.close()
    assert _ipc.ipc_collect() == 0
    del second  # garbage collection releases too
    assert _ipc.ipc_collect() == 1
    _lib.free(ptr, 3 * MiB, 0)


def test_shareable_scope_routes_to_the_shareable_pool_and_nests():
    before = streampool.memory_stats(0)
    with streampool.shareable():
        with streampool.shareable():
            inner = _lib.malloc(MiB, 0)
        outer = _lib.malloc(MiB, 0)
    plain = _lib.malloc(MiB, 0)
    after = streampool.memory_stats(0)
    assert after["ipc_used_bytes"] - before["ipc_used_bytes"] == 2 * MiB
    if BACKEND == "pool":  # (on the vmm backend every block shares, page by page)
        with pytest.raises(streampool.InvalidArgumentError, match=r"not in a shareable pool.*streampool\.shareable\(\)"):
            _ipc.share_block(plain, 0, None, None, MiB)
    assert _lib.library().streampool_shareable_end() == _lib.INVALID_ARGUMENT, "unmatched end"
    for ptr in (inner, outer):
        _ipc.ImportedBlock(pickle.loads(pickle.dumps(_ipc.share_block(ptr, 0, None, None, MiB))), None).close()
    _ipc.ipc_collect()  # (each share collects what was released before it, too)
    assert _ipc.shared_block_count() == 0
    assert streampool.ipc_supported(0)
    for ptr in (inner, outer, plain):
        _lib.free(ptr, MiB, 0)


def test_memory_reserved_counts_the_shareable_pool_as_torch_does():
    """streampool.memory_reserved() is torch.cuda.memory_reserved()'s figure under install():
    every byte the device holds from CUDA, the shareable pool's included, never below the bytes
    allocated."""
    ptr = _shareable_block(3 * MiB)
    stats = streampool.memory_stats(0)
    assert stats["ipc_reserved_bytes"] >= 3 * MiB
    assert streampool.memory_reserved(0) == _lib.reserved_total(0)[0] == stats["reserved_bytes.all.current"]
    pools = _lib.get_stats(0).reserved_bytes  # the device's own pools
    assert streampool.memory_reserved(0) == pools + stats["ipc_reserved_bytes"]
    assert streampool.memory_reserved(0) >= streampool.memory_allocated(0)
    assert streampool.max_memory_reserved(0) >= streampool.memory_reserved(0)
    assert stats["reserved_bytes.all.peak"] == streampool.max_memory_reserved(0)
    row = next(line for line in streampool.memory_summary(0).splitlines() if "Reserved memory" in line)
    assert format_bytes(streampool.memory_reserved(0)) in row, row
    _lib.free(ptr, 3 * MiB, 0)
    streampool.empty_cache()  # the shareable pool's free memory goes back too
    assert streampool.memory_stats(0)["ipc_reserved_bytes"] < 3 * MiB


def test_with_ipc_on_every_allocation_is_shareable():
    code = (
        "import pickle, streampool\nfrom streampool import _ipc, _lib\n"
        "p = _lib.malloc(4096, 1)\n"
        "h = pickle.loads(pickle.dumps(_ipc.share_block(p, 1, None, None, 4096)))\n"
        "b = _ipc.ImportedBlock(h, None); assert b.ptr == p; b.close()\n"
        "assert _ipc.ipc_collect() == 1\n"
        "s = streampool.memory_stats(1)\n"
        "assert s['ipc_used_bytes'] == s['pool_used_bytes'] > 0\n"
        "print('OK')\n"
    )
    proc = run_python(code, env={"STREAMPOOL_IPC": "1", "STREAMPOOL_LIBRARY": str(_lib.library_path())})
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)
    bad = run_python("import streampool; streampool.memory_stats(0)", env={"STREAMPOOL_IPC": "sometimes"})
    assert bad.returncode != 0 and "STREAMPOOL_IPC" in bad.stderr and "sometimes" in bad.stderr, describe(bad)


def test_share_needs_a_cuda_tensor():
    with pytest.raises((TypeError, ImportError)):
        streampool.share([1, 2, 3])


CROSS_PROCESS = r"""
import multiprocessing as mp, os, sys, time
import streampool
from streampool import _ipc, _lib

def receiver(inbox, outbox):
    handle = inbox.get(timeout=60)   # the pool's descriptor arrives through multiprocessing
    ok = os.fstat(handle.fd).st_size == 0
    os.close(handle.fd)
    _ipc._mark_released(handle.slot)  # what closing an import does, minus the mapping
    outbox.put(("received", ok, handle.nbytes))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receiver, args=(inbox, outbox), daemon=True)
    child.start()
    with streampool.shareable():
        ptr = _lib.malloc(4096, 0)
    inbox.put(_ipc.share_block(ptr, 0, None, None, 4096))
    print(outbox.get(timeout=60))
    assert _ipc.shared_block_count() == 1
    deadline = time.monotonic() + 30
    while _ipc.ipc_collect() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ipc.shared_block_count() == 0
    child.join(30)
    print("collected, child exit", child.exitcode)
"""


def test_handles_cross_processes_and_the_release_comes_back(tmp_path):
    """The plumbing across real processes: a spawn child gets the handle through a queue, with a
    working descriptor, and its release lets the exporter collect the block."""
    script = tmp_path / "cross.py"
    script.write_text(CROSS_PROCESS)
    proc = run_python(args=[str(script)], env={"STREAMPOOL_LIBRARY": str(_lib.library_path())}, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert "('received', True, 4096)" in proc.stdout and "collected, child exit 0" in proc.stdout, describe(proc)


SPAWN_ARGS = r"""
import multiprocessing as mp, os
import streampool
from streampool import _ipc, _lib

def child(first, second, outbox):
    fds = (first.fd, second.fd)
    ok = all(os.fstat(fd).st_size == 0 for fd in fds)
    outbox.put((ok, fds[0] != fds[1]))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    with streampool.shareable():
        a, b = _lib.malloc(4096, 0), _lib.malloc(8192, 0)
    first, second = (_ipc.share_block(p, 0, None, None, 4096) for p in (a, b))
    assert first.fd == second.fd, "one pool, one descriptor"
    outbox = ctx.Queue()
    p = ctx.Process(target=child, args=(first, second, outbox), daemon=True)
    p.start()
    print("CHILD", outbox.get(timeout=60))
    p.join(30)
"""


def test_handles_among_spawn_arguments_share_one_passed_descriptor(tmp_path):
    """Two handles of one pool as arguments of a spawned process (a model's parameters): the
    spawn passes the descriptor once (it refuses duplicates) and each handle gets its own copy."""
    script = tmp_path / "spawn_args.py"
    script.write_text(SPAWN_ARGS)
    proc = run_python(args=[str(script)], env={"STREAMPOOL_LIBRARY": str(_lib.library_path())}, timeout=120)
    assert proc.returncode == 0 and "CHILD (True, True)" in proc.stdout, describe(proc)


def test_one_handle_pickled_twice_is_two_receivers():
    """Each pickling is a receiver with its own release byte: the block is kept until both let go."""
    ptr = _shareable_block()
    handle = _ipc.share_block(ptr, 0, None, None, MiB)
    first, second = (_ipc.ImportedBlock(pickle.loads(pickle.dumps(handle)), None) for _ in range(2))
    first.close()
    assert _ipc.ipc_collect() == 0, "the second receiver still has it"
    second.close()
    assert _ipc.ipc_collect() == 1
    with pytest.raises(RuntimeError, match="already released"):
        pickle.dumps(handle)
    _lib.free(ptr, 3 * MiB, 0)


def test_the_exporters_own_descriptor_is_never_closed_and_unpickled_handles_are_refused():
    ptr = _shareable_block()
    handle = _ipc.share_block(ptr, 0, None, None, MiB)
    with pytest.raises(ValueError, match="pickle it there"):
        _ipc.ImportedBlock(handle, None)
    import os

    os.fstat(handle.fd)  # still open
    received = pickle.loads(pickle.dumps(handle))
    with pytest.raises(RuntimeError, match="cannot be sent on"):
        pickle.dumps(received)
    block = _ipc.ImportedBlock(received, None)
    assert received.fd == -1, "a received descriptor is closed once its pool is imported"
    block.close()
    os.fstat(handle.fd)
    assert _ipc.ipc_collect() == 1
    _lib.free(ptr, 3 * MiB, 0)


class _SharesOnPickling:
    """Stands for a CUDA tensor: pickling it shares its block, as streampool's reducer does."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __reduce__(self):
        return (_ipc.ImportedBlock, (_ipc.share_block(self.ptr, 0, None, None, MiB), None))


@pytest.fixture
def queue_puts_pickle(monkeypatch):
    """Queues as install() leaves them in a process with CUDA initialised."""
    monkeypatch.setattr(_ipc_torch, "_caller_pickles", lambda: True)
    _ipc_torch.pickle_at_put()
    yield
    _ipc_torch.restore_queue_puts()


@pool_backend_only  # on the vmm backend every block can be shared (test_an_ordinary_vmm_block_...)
@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_a_block_that_cannot_be_shared_is_refused_by_put_itself(queue_puts_pickle, kind):
    """The refusal is raised in the thread that puts, not lost in the queue's feeder thread
    (where the receiver would wait for ever)."""
    import multiprocessing

    queue = getattr(multiprocessing, kind)()
    plain = _lib.malloc(MiB, 0)
    try:
        with pytest.raises(streampool.InvalidArgumentError, match=r"not in a shareable pool.*streampool\.shareable\(\)"):
            queue.put(_SharesOnPickling(plain))
        queue.put({"step": 3, "payload": list(range(5))})  # what can be sent still goes through
        assert queue.get(timeout=30) == {"step": 3, "payload": list(range(5))}
        if kind == "JoinableQueue":
            queue.task_done()
            queue.join()  # only the object that was sent counts as a task
    finally:
        queue.close()
        queue.join_thread()
        _lib.free(plain, MiB, 0)


def test_a_shareable_block_put_on_a_queue_arrives(queue_puts_pickle):
    import multiprocessing

    ptr = _shareable_block(MiB)
    queue = multiprocessing.Queue()
    try:
        queue.put(_SharesOnPickling(ptr))
        block = queue.get(timeout=30)
        assert block.ptr == ptr
        block.close()
        assert _ipc.ipc_collect() == 1
    finally:
        queue.close()
        queue.join_thread()
        _lib.free(ptr, MiB, 0)


def test_queues_pickle_in_the_feeder_without_cuda():
    """A process without CUDA (DataLoader workers) keeps the feeder thread's pickling."""
    from multiprocessing import queues

    _ipc_torch.pickle_at_put()
    try:
        assert _ipc_torch._caller_pickles() is False, "the test process has no CUDA"
        assert queues.Queue.put.__wrapped__ is _ipc_torch._original_puts[queues.Queue]
    finally:
        _ipc_torch.restore_queue_puts()
    assert not hasattr(queues.Queue.put, "__wrapped__")


vmm_backend_only = pytest.mark.skipif(
    BACKEND != "vmm", reason="vmm backend behaviour (scripts/test runs the suite on vmm, the default)"
)


@vmm_backend_only
def test_an_ordinary_vmm_block_is_shared_page_by_page():
    """On the vmm backend a block from no shareable pool is shared through its pages: one
    descriptor per page travels with the handle, the receiver maps them at addresses of its own,
    and the exporter closes its descriptors once every receiver has released the block."""
    import os

    ptr = _lib.malloc(5 * MiB, 0, 0)
    handle = _ipc.share_block(ptr, 0, None, keep=None, nbytes=5 * MiB)
    assert handle.page_fds is not None and len(handle.page_fds) >= 3
    kept = list(handle.page_fds)
    received = pickle.loads(pickle.dumps(handle))
    opened = {fd for fd in received.page_fds if fd >= 0}
    assert opened.isdisjoint(kept), "new descriptors, passed by multiprocessing"
    block = _ipc.ImportedBlock(received, None)
    assert block.ptr not in (None, ptr), "mapped at addresses of the receiver's own"
    assert received.page_fds == [], "the receiver's descriptors are closed once mapped"
    assert block.__cuda_array_interface__["shape"] == (5 * MiB,)
    assert _ipc.ipc_collect() == 0, "not released yet"
    block.close()
    assert _ipc.ipc_collect() == 1
    for fd in kept:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with the export
    _lib.free(ptr, 5 * MiB, 0)


def test_a_block_on_a_large_span_is_shared_whole_asking_for_room_again():
    """A block inside a span (one physical handle for many pages) is shared with the whole span:
    one descriptor, -1 for its other pages. More entries than the first guess of room: the
    export says how many, and share_block asks again."""
    code = (
        "import pickle\n"
        "from streampool import _ipc, _lib\n"
        "M = 1 << 20\n"
        "whole = _lib.malloc(400 * M, 0, 0)\n"  # one span of 200 pages
        "_lib.free(whole, 400 * M, 0)\n"
        "ptr = _lib.malloc(2 * M, 0, 0)\n"
        "h = _ipc.share_block(ptr, 0, None, keep=None, nbytes=2 * M)\n"
        "assert len(h.page_fds) == 200 and h.page_fds[0] >= 0, h.page_fds[:3]\n"
        "assert set(h.page_fds[1:]) == {-1}\n"
        "got = pickle.loads(pickle.dumps(h))\n"
        "assert got.page_fds[0] >= 0 and set(got.page_fds[1:]) == {-1}\n"
        "block = _ipc.ImportedBlock(got, None)\n"
        "assert block.ptr not in (None, ptr)\n"
        "block.close()\n"
        "assert _ipc.ipc_collect() == 1\n"
        "_lib.free(ptr, 2 * M, 0)\n"
        "print('shared')\n"
    )
    env = {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_VMM_SPAN_SIZE": "512MiB", "STREAMPOOL_DRIVER": "sim"}
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and "shared" in proc.stdout, describe(proc)


@vmm_backend_only
def test_an_ordinary_vmm_block_put_on_a_queue_arrives(queue_puts_pickle):
    import multiprocessing

    ptr = _lib.malloc(MiB, 0, 0)
    queue = multiprocessing.Queue()
    try:
        queue.put(_SharesOnPickling(ptr))
        block = queue.get(timeout=30)
        assert block.ptr not in (None, ptr)
        block.close()
        assert _ipc.ipc_collect() == 1
    finally:
        queue.close()
        queue.join_thread()
        _lib.free(ptr, MiB, 0)


@vmm_backend_only
def test_a_stale_handle_is_refused_once_its_export_was_let_go_of():
    """A handle whose receivers all released it is refused even when the same address is shared
    again (found by review: it duplicated descriptor numbers of the new export)."""
    ptr = _lib.malloc(5 * MiB, 0, 0)
    old = _ipc.share_block(ptr, 0, None, keep=None, nbytes=5 * MiB)
    _ipc.ImportedBlock(pickle.loads(pickle.dumps(old)), None).close()
    assert _ipc.ipc_collect() == 1
    _lib.free(ptr, 5 * MiB, 0)
    again = _lib.malloc(5 * MiB, 0, 0)
    assert again == ptr
    new = _ipc.share_block(again, 0, None, keep=None, nbytes=5 * MiB)
    with pytest.raises(RuntimeError, match="already released"):
        pickle.dumps(old)
    _ipc.ImportedBlock(pickle.loads(pickle.dumps(new)), None).close()
    assert _ipc.ipc_collect() == 1
    _lib.free(again, 5 * MiB, 0)


def test_a_fresh_export_is_kept_until_its_receivers_release_it():
    """An export added to a block whose earlier receivers all released is not let go of before
    it is sent (it has no receiver yet)."""
    ptr = _shareable_block() if BACKEND == "pool" else _lib.malloc(3 * MiB, 0, 0)
    first = _ipc.share_block(ptr, 0, None, None, MiB)
    _ipc.ImportedBlock(pickle.loads(pickle.dumps(first)), None).close()
    second = _ipc.share_block(ptr, 0, None, None, MiB)  # collects the first export
    assert _ipc.ipc_collect() == 0 and _ipc.shared_block_count() == 1, "the second is kept"
    _ipc.ImportedBlock(pickle.loads(pickle.dumps(second)), None).close()
    assert _ipc.ipc_collect() == 1
    _lib.free(ptr, 3 * MiB, 0)

"""GPU cases: PyTorch features that depend on the allocator, under install() (``case_<name>(ctx)``).

Each case asserts what it can alone and prints ``RESULT <name> <json>``: figures test_gpu_parity.py
compares with the same case under PyTorch's native allocator (losses, outputs).
"""

import json
import os
import pickle
import tempfile

import torch

MiB = 1 << 20


def _result(name: str, value) -> None:
    print(f"RESULT {name} {json.dumps(value)}", flush=True)


def _streampool_pool_blocks(ctx, pool_id) -> set:
    """Addresses of the live blocks of PyTorch memory pool ``pool_id`` by streampool's books."""
    from streampool import _parity

    return {b.address for b in _parity.live_blocks(torch.cuda.current_device(), pool_id)}


def _conv_net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).cuda()


def case_cudnn_benchmark(ctx) -> None:
    """``cudnn.benchmark = True`` (cuDNN sizes its workspace by the allocator's cacheInfo, then
    tries algorithms, halving the workspace on torch.OutOfMemoryError): training steps with two
    image sizes run, and their losses are printed for comparison with native."""
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = _conv_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(6):
        size = 32 if step % 2 == 0 else 48
        x = torch.randn(16, 3, size, size, device="cuda", generator=None)
        y = torch.randint(0, 10, (16,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(l == l for l in losses), losses  # no NaN
    _result("cudnn_benchmark", losses)


def case_typed_out_of_memory(ctx) -> None:
    """A request the device cannot hold raises torch.OutOfMemoryError (what `except
    torch.cuda.OutOfMemoryError` in training scripts catches), after the observers PyTorch
    attached heard of it; the process goes on allocating."""
    heard = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: heard.append(args))
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as exc:
        assert str(exc).startswith("CUDA out of memory."), str(exc)
    else:
        raise AssertionError("a request of twice the device's memory succeeded")
    assert heard, "the out-of-memory observer was not called"
    device, requested = heard[0][0], heard[0][1]
    # The size the allocator tried to get: PyTorch's rounds a large request up to its 2 MiB
    # segment granule (twice an H200's memory is not a multiple of it), streampool's tries it as
    # asked.
    assert device == torch.cuda.current_device(), heard[0]
    assert 2 * total <= requested < 2 * total + 2 * MiB, heard[0]
    x = torch.ones(MiB, device="cuda")
    assert x.sum().item() == MiB
    _result("typed_out_of_memory", {"caught": True, "observer_calls": len(heard)})


def case_memory_fraction_round_trip(ctx) -> None:
    """``get_per_process_memory_fraction`` returns what ``set_per_process_memory_fraction`` set."""
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
    torch.cuda.set_per_process_memory_fraction(0.5)
    assert torch.cuda.get_per_process_memory_fraction() == 0.5
    torch.cuda.set_per_process_memory_fraction(1.0)
    _result("memory_fraction_round_trip", True)


def case_accelerator_memory_stats(ctx) -> None:
    """``torch.accelerator``'s memory functions see the allocator in charge: allocated bytes
    follow a tensor, the peak resets, empty_cache runs."""
    import torch.accelerator as acc

    before = acc.memory_allocated()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    assert acc.memory_allocated() >= before + 8 * MiB, (before, acc.memory_allocated())
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    del x
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == acc.memory_allocated()
    acc.empty_cache()
    _result("accelerator_memory_stats", True)


def case_memory_history_snapshot(ctx) -> None:
    """``_record_memory_history`` then ``_snapshot`` / ``_dump_snapshot``: a snapshot in PyTorch's
    format with the allocations made while recording; history off again stops it."""
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    assert torch._C._cuda_isHistoryEnabled()
    kept = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (1, 3, 7)]
    gone = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    address = gone.data_ptr()
    del gone
    snapshot = torch.cuda.memory._snapshot()
    actions = [e["action"] for e in snapshot["device_traces"][torch.cuda.current_device()]]
    assert "alloc" in actions and "free_completed" in actions, actions[:20]
    frees = [e for t in snapshot["device_traces"] for e in t if e["action"] == "free_completed"]
    assert any(e["addr"] == address for e in frees), "the freed block is not in the trace"
    live = {b["address"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    assert all(t.data_ptr() in live for t in kept), "a live tensor is missing from the snapshot's segments"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        from torch.cuda import _memory_viz

        html = _memory_viz.trace_plot(loaded)
        assert "<html" in html.lower() or len(html) > 1000, "memory_viz produced no page"
    torch.cuda.memory._record_memory_history(enabled=None)
    assert not torch._C._cuda_isHistoryEnabled()
    _result("memory_history_snapshot", True)


def case_mempool(ctx) -> None:
    """``torch.cuda.MemPool`` with ``use_mem_pool``: the region's tensors come from the pool (its
    freed memory serves only the pool), the use count follows PyTorch's, the pool's snapshot
    lists its segments, and its memory goes back once the pool is gone."""
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1, pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2, pool.use_count()
        a = torch.ones(2 * MiB, device="cuda")
        b = torch.ones(256, device="cuda")
    assert pool.use_count() == 1, pool.use_count()
    inside = _streampool_pool_blocks(ctx, pool.id) if ctx.streampool_is_global else None
    if inside is not None:
        assert {a.data_ptr(), b.data_ptr()} <= inside, (hex(a.data_ptr()), inside)
    outside = torch.ones(256, device="cuda")
    if inside is not None:
        assert outside.data_ptr() not in inside
    address = b.data_ptr()
    del b
    again = torch.ones(256, device="cuda")
    assert again.data_ptr() != address, "a block freed into the pool served an allocation outside it"
    segments = pool.snapshot()
    assert segments and all(s["total_size"] > 0 for s in segments), segments
    value = a.sum().item()
    del a, again, outside
    for flags in ({"use_on_oom": True}, {"no_split": True}):
        extra = torch.cuda.MemPool(**flags)
        with torch.cuda.use_mem_pool(extra):
            t = torch.full((1000,), 2.0, device="cuda")
        assert t.sum().item() == 2000.0
        del t, extra
    del pool
    torch.cuda.empty_cache()
    _result("mempool", value)


def _mlp(d: int = 256) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d), torch.nn.LayerNorm(d)
    ).cuda()


def case_graph_shared_pool(ctx) -> None:
    """Two graphs captured into one pool (``graph_pool_handle``), replayed in capture order, give
    eager's results; the capture's memory belongs to that pool."""
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(32, 256, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        with torch.cuda.graph(first, pool=pool):
            y = model(x)
        with torch.cuda.graph(second, pool=pool):
            z = model(y)
    if ctx.streampool_is_global:
        inside = _streampool_pool_blocks(ctx, pool)
        assert y.data_ptr() in inside and z.data_ptr() in inside, "the captured outputs are not pool blocks"
    results = []
    for step in range(4):
        x.copy_(torch.randn(32, 256, device="cuda"))
        first.replay()
        second.replay()
        with torch.no_grad():
            expected = model(model(x))
        torch.testing.assert_close(z, expected, rtol=1e-4, atol=1e-4)
        results.append(z.float().square().mean().item())
    del first, second, y, z
    torch.cuda.empty_cache()
    _result("graph_shared_pool", results)


def case_make_graphed_callables(ctx) -> None:
    """``make_graphed_callables`` on a module: training steps give eager's losses."""
    torch.manual_seed(0)
    model = _mlp(128)
    reference = _mlp(128)
    reference.load_state_dict(model.state_dict())
    sample = torch.randn(16, 128, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    losses = []
    for step in range(5):
        x = torch.randn(16, 128, device="cuda", requires_grad=True)
        for net, o in ((graphed, opt), (reference, ref_opt)):
            o.zero_grad(set_to_none=True)
            loss = net(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.item())
    graph_losses, eager_losses = losses[0::2], losses[1::2]
    for g, e in zip(graph_losses, eager_losses):
        assert abs(g - e) <= 1e-4 * max(1.0, abs(e)), (graph_losses, eager_losses)
    _result("make_graphed_callables", graph_losses)


def _compiled_outputs(mode: str, training: bool, shapes) -> list:
    torch.manual_seed(0)
    model = _mlp()
    compiled = torch.compile(model, mode=mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if training else None
    figures = []
    for step, batch in enumerate(shapes):
        x = torch.randn(batch, 256, device="cuda")
        if training:
            torch.compiler.cudagraph_mark_step_begin()
            loss = compiled(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            figures.append(loss.item())
        else:
            with torch.no_grad():
                out = compiled(x)
                expected = model(x)
            torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)
            figures.append(out.float().square().mean().item())
    return figures


def case_compile_reduce_overhead_inference(ctx) -> None:
    """torch.compile(mode="reduce-overhead") inference (CUDA graph trees: several graphs, shape
    changes back and forth, pool checks on): outputs equal eager's."""
    figures = _compiled_outputs("reduce-overhead", False, [8, 8, 8, 16, 16, 8, 32, 8, 16, 32])
    _result("compile_reduce_overhead_inference", figures)


def case_compile_reduce_overhead_training(ctx) -> None:
    """torch.compile(mode="reduce-overhead") training, forward and backward, with two input
    shapes taking turns (graph trees record, replay and move between paths)."""
    figures = _compiled_outputs("reduce-overhead", True, [8, 8, 8, 16, 16, 8, 16, 8, 8, 16, 16, 8])
    _result("compile_reduce_overhead_training", figures)


def case_compile_max_autotune(ctx) -> None:
    """torch.compile(mode="max-autotune") (autotuned kernels and CUDA graphs) inference."""
    figures = _compiled_outputs("max-autotune", False, [16, 16, 16, 32])
    _result("compile_max_autotune", figures)


# --- second round (issue 40) -------------------------------------------------------------------


def _queue_child(inbox, outbox) -> None:
    """Adds 1 to the tensor it receives and reports its sum (None: nothing was sent)."""
    t = inbox.get(timeout=120)
    if t is None:
        outbox.put(None)
        return
    t.add_(1)
    outbox.put(float(t.sum().item()))


def case_multiprocessing_queue(ctx) -> None:
    """A CUDA tensor put on a spawn-context ``torch.multiprocessing`` queue under a plain
    install(): the child adds 1 and reports the sum. Where the allocator cannot share the tensor,
    ``put`` itself must raise, at once, in this thread (never a receiver waiting for ever)."""
    import queue as queues
    import time

    import torch.multiprocessing as tmp

    spawn = tmp.get_context("spawn")
    inbox, outbox = spawn.Queue(), spawn.Queue()
    # A daemon: where nothing arrives (PyTorch's plain pluggable allocator), the case fails
    # without waiting at exit for the child's own timeout.
    child = spawn.Process(target=_queue_child, args=(inbox, outbox), daemon=True)
    child.start()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        inbox.put(x)
    except Exception as exc:  # noqa: BLE001  (the refusal, whatever its type, is the result)
        seconds = time.perf_counter() - start
        assert seconds < 10, f"the refusal took {seconds:.1f} s"
        inbox.put(None)
        assert outbox.get(timeout=120) is None
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result = {"delivered": False, "refused_at_put": f"{type(exc).__name__}: {first_line}"[:160]}
    else:
        try:
            total = outbox.get(timeout=60)
        except queues.Empty:
            raise AssertionError("the child never received the tensor (put returned, nothing arrived)") from None
        result = {"delivered": True, "sum": total}
    child.join(timeout=60)
    assert child.exitcode == 0, f"the child exited with {child.exitcode}"
    if result["delivered"]:
        assert result["sum"] == float(1 << 20), result
    _result("multiprocessing_queue", result)


def case_alloc_conf_environment(ctx) -> None:
    """``PYTORCH_CUDA_ALLOC_CONF`` and ``PYTORCH_ALLOC_CONF`` set when the process starts
    (test_gpu_parity.py sets them): allocation works; under install() each key of PyTorch's
    caching allocator that streampool cannot honour was warned about once."""
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") and os.environ.get("PYTORCH_ALLOC_CONF"), "set by the test"
    x = torch.ones(3 * MiB, device="cuda")
    y = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
    total = x.sum().item()
    del x, y
    torch.cuda.empty_cache()
    if ctx.streampool_is_global:
        from streampool import _torch

        warned = _torch._installation.ignored_settings
        assert sorted(warned) == ["expandable_segments", "garbage_collection_threshold", "max_split_size_mb"], warned
    _result("alloc_conf_environment", total)


def case_allocator_backend(ctx) -> None:
    """``torch.cuda.get_allocator_backend()``: what PyTorch names the allocator in charge."""
    _result("allocator_backend", {"backend": torch.cuda.get_allocator_backend()})


def case_set_allocator_settings(ctx) -> None:
    """``torch.cuda.memory._set_allocator_settings`` at run time: accepted, malformed settings
    refused as PyTorch refuses them, and allocation goes on."""
    torch.cuda.memory._set_allocator_settings("expandable_segments:False,max_split_size_mb:256")
    try:
        torch.cuda.memory._set_allocator_settings("no_such_key:1")
    except (RuntimeError, ValueError):  # torch 2.11 raises ValueError
        refused = True
    else:
        refused = False
    x = torch.full((MiB,), 2.0, device="cuda")
    _result("set_allocator_settings", {"malformed_refused": refused, "sum": x.sum().item()})


_COUNTING_ALLOCATOR_C = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
typedef int (*mem_alloc_t)(unsigned long long *, size_t);
typedef int (*mem_free_t)(unsigned long long);
static mem_alloc_t mem_alloc;
static mem_free_t mem_free;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
#define SLOTS 4096
static unsigned long long out_ptr[SLOTS];
static size_t out_size[SLOTS];
static long long mallocs, frees, bad_frees, bytes_out;
static int fail;
static int load(void) {
  if (mem_alloc) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return 0;
  mem_alloc = (mem_alloc_t)dlsym(h, "cuMemAlloc_v2");
  mem_free = (mem_free_t)dlsym(h, "cuMemFree_v2");
  return mem_alloc && mem_free;
}
void *counting_malloc(size_t size, int device, void *stream) {
  (void)device; (void)stream;
  unsigned long long p = 0;
  if (fail || !load() || mem_alloc(&p, size) != 0) return NULL;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < SLOTS; i++) if (!out_ptr[i]) { out_ptr[i] = p; out_size[i] = size; break; }
  mallocs++; bytes_out += (long long)size;
  pthread_mutex_unlock(&lock);
  return (void *)p;
}
void counting_free(void *ptr, size_t size, int device, void *stream) {
  (void)device; (void)stream;
  if (!ptr) return;
  int found = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < SLOTS; i++)
    if (out_ptr[i] == (unsigned long long)ptr) { found = out_size[i] == size; out_ptr[i] = 0; break; }
  frees++; bytes_out -= (long long)size;
  if (!found) bad_frees++;
  pthread_mutex_unlock(&lock);
  mem_free((unsigned long long)ptr);
}
int counting_owns(unsigned long long p) {
  int owns = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < SLOTS; i++)
    if (out_ptr[i] && p >= out_ptr[i] && p < out_ptr[i] + out_size[i]) owns = 1;
  pthread_mutex_unlock(&lock);
  return owns;
}
long long counting_mallocs(void) { return mallocs; }
long long counting_frees(void) { return frees; }
long long counting_bad_frees(void) { return bad_frees; }
long long counting_bytes_out(void) { return bytes_out; }
void counting_fail(int on) { fail = on; }
"""


def _counting_allocator(folder: str):
    """(library path, ctypes handle) of the counting allocator, compiled into ``folder``."""
    import ctypes
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiler, "the case needs a C compiler (cc) to build its counting allocator"
    source, library = os.path.join(folder, "counting.c"), os.path.join(folder, "libcounting.so")
    with open(source, "w") as f:
        f.write(_COUNTING_ALLOCATOR_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", library, source, "-ldl", "-lpthread"], check=True)
    lib = ctypes.CDLL(library)
    for name in ("counting_mallocs", "counting_frees", "counting_bad_frees", "counting_bytes_out"):
        getattr(lib, name).restype = ctypes.c_longlong
    lib.counting_owns.argtypes = [ctypes.c_ulonglong]
    return library, lib


def case_mempool_own_allocator(ctx) -> None:
    """``torch.cuda.MemPool(allocator)`` (vLLM's sleep mode): the region's tensors come from the
    pool's own allocator's malloc, the statistics count them, the memory goes back through its
    free once the pool is gone; a malloc that returns NULL gives torch.OutOfMemoryError, nothing
    leaks and the process goes on."""
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        library, lib = _counting_allocator(folder)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "counting_malloc", "counting_free")
        pool = torch.cuda.MemPool(allocator.allocator())
        allocated_before = torch.cuda.memory_allocated()
        with torch.cuda.use_mem_pool(pool):
            a = torch.ones(3 * MiB // 4, device="cuda")  # 3 MiB
            b = torch.ones(256, device="cuda")
        outside = torch.ones(256, device="cuda")
        figures["blocks_from_its_malloc"] = lib.counting_mallocs() >= 1 and all(
            lib.counting_owns(t.data_ptr()) for t in (a, b)
        )
        figures["outside_not_from_it"] = not lib.counting_owns(outside.data_ptr())
        figures["allocated_counts_them"] = torch.cuda.memory_allocated() - allocated_before >= 3 * MiB + 1024
        figures["reserved_counts_them"] = torch.cuda.memory_reserved() >= lib.counting_bytes_out() > 0
        figures["sum"] = a.sum().item() + b.sum().item()
        del a, b, outside
        torch.cuda.empty_cache()
        figures["kept_while_the_pool_lives"] = lib.counting_frees() == 0
        del pool
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        figures["all_back_through_its_free"] = (
            lib.counting_frees() == lib.counting_mallocs() and lib.counting_bytes_out() == 0 and lib.counting_bad_frees() == 0
        )

        lib.counting_fail(1)
        failing = torch.cuda.MemPool(allocator.allocator())
        try:
            with torch.cuda.use_mem_pool(failing):
                torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            figures["null_malloc_is_out_of_memory"] = True
        else:
            figures["null_malloc_is_out_of_memory"] = False
        lib.counting_fail(0)
        del failing
        torch.cuda.empty_cache()
        x = torch.ones(MiB, device="cuda")
        figures["goes_on"] = x.sum().item() == MiB
        figures["nothing_leaked"] = lib.counting_frees() == lib.counting_mallocs() and lib.counting_bytes_out() == 0
    assert all(v for k, v in figures.items() if k != "sum"), figures
    _result("mempool_own_allocator", figures)

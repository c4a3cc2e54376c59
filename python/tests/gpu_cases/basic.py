"""GPU cases: tensor sizes, streams, hooks, limits, out of memory, threads, scoped pools.

Each ``case_<name>(ctx)`` asserts inside; ``ctx`` is run.Context. Sizes are in bytes.
"""

import os
import threading
import warnings

import torch

import streampool

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _expect_oom(nbytes: int) -> str:
    """Allocates ``nbytes`` expecting PyTorch to raise; returns the message."""
    try:
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    except RuntimeError as exc:
        return str(exc)
    raise AssertionError(f"allocating {nbytes} bytes succeeded; expected out of memory")


def case_tensor_sizes(ctx) -> None:
    """Tensors of many sizes hold their values together; freeing them returns to the baseline."""
    sizes = [0, 1, 511, 1 * KiB, 1 * MiB, 100 * MiB]
    if not ctx.quick:
        sizes += [2 * GiB, 4 * GiB]
    baseline = ctx.baseline()
    expected = baseline.allocated
    tensors = []
    for value, size in enumerate(sizes, start=1):
        tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
        ctx.check_aligned(tensor)
        expected += size
        assert ctx.allocated() == expected, f"{size} B tensor: allocated {ctx.allocated()}, expected {expected}"
        tensor.fill_(value)
        tensors.append(tensor)
    for value, tensor in enumerate(tensors, start=1):
        if tensor.numel():
            assert bool((tensor == value).all()), f"{tensor.numel()} B tensor lost its values"
            assert int(tensor[0]) == value and int(tensor[-1]) == value
    del tensor, tensors
    ctx.assert_back_to(baseline, "after del")
    print(streampool.memory_summary())


def case_record_stream(ctx) -> None:
    """A tensor freed while a side stream still reads it: with the record_stream hook the reader
    sees correct data in every trial. Without the hook (mode streampool-no-record-stream-hook)
    the freed memory is reused at once and at least one trial reads corrupted data: that is
    the hazard the hook exists for, and this shows the test can see it."""
    count = 16 * MiB // 4  # float32 elements
    side = torch.cuda.Stream()
    trials, corrupted = 20, 0
    for _ in range(trials):
        produced = torch.full((count,), 1.0, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # the reader starts tens of milliseconds later
            consumed = produced * 2
        produced.record_stream(side)
        del produced
        reuser = torch.full((count,), 7.0, device="cuda")  # main stream; may take the freed memory
        torch.cuda.synchronize()
        corrupted += not bool((consumed == 2.0).all())
        del consumed, reuser
    print(f"RECORD_STREAM mode={ctx.mode} corrupted={corrupted}/{trials}")
    if ctx.mode == "streampool":
        assert corrupted == 0, f"{corrupted}/{trials} trials read memory reused too early"
    else:
        assert corrupted > 0, "without the hook the hazard should show in some trial"


def case_empty_cache(ctx) -> None:
    """torch.cuda.empty_cache() reaches streampool and lowers its reserved memory."""
    tensors = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del tensors
    ctx.settle()
    before = streampool.memory_stats()
    if os.environ.get("STREAMPOOL_RELEASE_THRESHOLD") == "0":
        # A release threshold of 0 gave it back at the synchronisation already.
        assert before["reserved_bytes.all.current"] < 256 * MiB, before
        return
    assert before["reserved_bytes.all.current"] >= 1 * GiB, before
    torch.cuda.empty_cache()
    after = streampool.memory_stats()
    print(f"reserved before {before['reserved_bytes.all.current']} B, after {after['reserved_bytes.all.current']} B")
    assert after["reserved_bytes.all.current"] < before["reserved_bytes.all.current"]
    assert after["cached_bytes"] == 0


def case_idle_release(ctx) -> None:
    """Memory freed after the program's last synchronisation goes back to the device once it has
    been idle for STREAMPOOL_IDLE_RELEASE (2 s), with no call from the program."""
    import time

    torch.cuda.synchronize()
    x = torch.ones(256 * MiB, dtype=torch.uint8, device="cuda")
    del x  # freed after the last synchronisation, and nothing synchronises afterwards
    held = streampool.memory_reserved() - streampool.memory_allocated()
    assert held >= 256 * MiB, held
    deadline = time.time() + 8.0
    while time.time() < deadline and held >= 256 * MiB:
        time.sleep(0.1)
        held = streampool.memory_reserved() - streampool.memory_allocated()
    print(f"IDLE held beyond live after {8.0 - max(0.0, deadline - time.time()):.1f} s: {held} B")
    assert held < 256 * MiB, f"{held} B beyond live after 8 s idle"


def case_memory_fraction(ctx) -> None:
    """set_per_process_memory_fraction(0.1) reaches streampool: 20% of the device is refused."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.1)
    limit = streampool.memory_stats()["memory_limit_bytes"]
    assert 0.09 * total <= limit <= 0.11 * total, f"limit {limit} B of {total} B"
    message = _expect_oom(int(0.2 * total))
    assert message.startswith("CUDA out of memory."), message
    small = torch.ones(1 * MiB, device="cuda")
    assert float(small.sum()) == 1 * MiB
    torch.cuda.set_per_process_memory_fraction(1.0)
    large = torch.ones(int(0.2 * total), dtype=torch.uint8, device="cuda")
    assert int(large[-1]) == 1


def case_out_of_memory(ctx) -> None:
    """A 10 TiB request raises PyTorch's out-of-memory message, and so do 2^48 bytes, a byte more
    and 1 PiB (above streampool's maximum: the message says so); tensors work afterwards."""
    try:
        torch.empty(10 * 2**40, dtype=torch.uint8, device="cuda")
    except RuntimeError as exc:
        error = exc
    else:
        raise AssertionError("a 10 TiB tensor was allocated; expected out of memory")
    message = str(error)
    print(f"out-of-memory error ({type(error).__name__}): {message}")
    assert message.startswith("CUDA out of memory."), message
    if ctx.streampool_is_global:
        assert isinstance(error, torch.cuda.OutOfMemoryError), f"{type(error).__name__}, not PyTorch's typed error"
    assert streampool.is_out_of_memory(error), "the README's pattern would not recognise it"
    assert streampool.memory_stats()["num_ooms"] >= 1
    # The largest size streampool accepts (2^48 bytes) reaches cuMemAllocFromPoolAsync,
    # which must say out of memory; one byte more is refused before any driver call.
    message = _expect_oom(2**48)
    print(f"2^48 bytes: {message}")
    assert message.startswith("CUDA out of memory."), message
    ooms = streampool.memory_stats()["num_ooms"]
    for size in (2**48 + 1, 2**50):
        message = _expect_oom(size)
        print(f"{size} bytes: {message}")
        assert message.startswith("CUDA out of memory. Tried to allocate"), message
        assert "larger than streampool's maximum" in message, message
    assert streampool.memory_stats()["num_ooms"] == ooms + 2
    numbers = torch.arange(1024, device="cuda")
    assert int(numbers.sum()) == 1024 * 1023 // 2


def case_peak_workload(ctx) -> None:
    """Prints the peak of live bytes for a fixed workload of 512-byte multiples, to compare the
    native allocator's max_memory_allocated with streampool's (test_gpu compares the two runs)."""
    sizes = [512 * k for k in (1, 3, 8, 1000, 4096, 20000, 3 * 2**15, 2**17)]
    ctx.settle()
    baseline = ctx.allocated()
    ctx.reset_peak()
    live = []
    for _ in range(3):
        for size in sizes:
            live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            if len(live) > 5:
                live.pop(0)
    del live
    ctx.settle()
    print(f"PEAK_BYTES {ctx.max_allocated() - baseline}")


def case_scoped_mempool(ctx) -> None:
    """Without install(): inside use_mem_pool(streampool.mempool()) tensors come from streampool,
    outside they do not."""
    assert not streampool.is_installed()
    warm = torch.ones(1, device="cuda")  # CUDA is initialised: scoped mode still works
    pool = streampool.mempool()
    assert streampool.mempool(torch.device("cuda", 0)) is not None
    try:
        streampool.mempool(torch.cuda.device_count())
        raise AssertionError("mempool() accepted a device that does not exist")
    except ValueError as exc:
        assert "does not exist" in str(exc), exc
    before = streampool.memory_stats()["allocation.all.allocated"]
    with torch.cuda.use_mem_pool(pool):
        inside = torch.full((4 * MiB,), 3, dtype=torch.uint8, device="cuda")
    during = streampool.memory_stats()["allocation.all.allocated"]
    assert during > before, "no allocation reached streampool inside the pool region"
    outside = torch.full((4 * MiB,), 5, dtype=torch.uint8, device="cuda")
    assert streampool.memory_stats()["allocation.all.allocated"] == during, "allocation outside the region"
    assert bool((inside == 3).all()) and bool((outside == 5).all()) and int(warm) == 1
    assert streampool.memory_allocated() >= 4 * MiB
    assert torch.cuda.memory_allocated() >= 8 * MiB  # PyTorch's own statistics keep working
    del inside
    torch.cuda.synchronize()


def case_scoped_mempool_out_of_memory(ctx) -> None:
    """Inside use_mem_pool(streampool.mempool()), a 10 TiB request raises the typed
    torch.cuda.OutOfMemoryError (PyTorch's allocator above streampool raises it when streampool
    returns no memory), and the region keeps working afterwards."""
    assert not streampool.is_installed()
    pool = streampool.mempool()
    with torch.cuda.use_mem_pool(pool):
        try:
            torch.empty(10 * 2**40, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as exc:
            error = exc
        else:
            raise AssertionError("a 10 TiB tensor was allocated inside the pool region")
        message = str(error)
        assert streampool.is_out_of_memory(error), message
        after = torch.full((4 * MiB,), 7, dtype=torch.uint8, device="cuda")
    assert streampool.memory_stats()["num_ooms"] >= 1
    assert int(after[-1]) == 7
    print(f"typed out-of-memory error in the pool region: {message.splitlines()[0]}")


def _churn(ctx, seed: int, use_side_stream: bool, errors: list) -> None:
    """Allocates, checks (every element) and frees tensors of varying sizes, keeping a few alive
    at a time."""
    try:
        stream = torch.cuda.Stream() if use_side_stream else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            alive = []
            for i in range(200):
                size = 1 + (seed * 7919 + i * 104729) % (4 * MiB)
                value = (seed * 31 + i) % 251
                made = torch.full((size,), value, dtype=torch.uint8, device="cuda")
                ctx.check_aligned(made)
                alive.append((made, value))
                del made
                if len(alive) > 4:
                    tensor, expected = alive.pop(0)
                    assert bool((tensor == expected).all()), f"a {size}-byte tensor lost its value {expected}"
            alive.clear()
        stream.synchronize()
    except BaseException as exc:  # reported by the main thread
        errors.append(f"thread {seed}: {exc!r}")


def case_threads(ctx) -> None:
    """Four Python threads allocate and free at once, two on side streams."""
    baseline = ctx.baseline()
    errors = []
    threads = [threading.Thread(target=_churn, args=(ctx, seed, seed % 2 == 1, errors)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    ctx.assert_back_to(baseline, "after the threads")


def case_backward(ctx) -> None:
    """Autograd's backward thread allocates through streampool: gradients are right."""
    baseline = ctx.baseline()
    torch.manual_seed(0)
    x = torch.randn(4096, device="cuda", requires_grad=True)
    (x**3).sum().backward()
    assert torch.allclose(x.grad, 3 * x.detach() ** 2, rtol=1e-5, atol=1e-6)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1)).cuda()
    inputs = torch.randn(64, 256, device="cuda")
    for _ in range(5):
        model.zero_grad(set_to_none=True)
        model(inputs).sum().backward()
    assert all(bool(p.grad.isfinite().all()) and p.grad.abs().sum() > 0 for p in model.parameters())
    ctx.check_aligned(x.grad, *(p.grad for p in model.parameters()))
    del x, model, inputs
    ctx.assert_back_to(baseline, "after backward")


def case_install_after_cuda_init(ctx) -> None:
    """install() once CUDA is initialised (mode native) explains what to do instead."""
    assert torch.ones(1, device="cuda").item() == 1.0
    try:
        streampool.install()
    except RuntimeError as exc:
        message = str(exc)
    else:
        raise AssertionError("install() after CUDA initialisation succeeded")
    assert "CUDA is already initialised" in message and "streampool.mempool()" in message, message
    assert not streampool.is_installed()


def case_install_twice(ctx) -> None:
    """A second install() returns the same allocator; different options only warn."""
    first = streampool.install()
    assert streampool.install() is first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert streampool.install(cache_limit="1GiB") is first
    assert any(issubclass(w.category, RuntimeWarning) and "ignored" in str(w.message) for w in caught), caught

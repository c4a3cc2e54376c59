"""GPU cases for the virtual-memory backend (``case_<name>(ctx)``; run with STREAMPOOL_BACKEND=vmm,
which test_gpu.py and scripts/gpu-check set for them, and with STREAMPOOL_VMM_GROWTH_SLACK=0% and
STREAMPOOL_VMM_COLD_AFTER=1ms so that idle pages move as often as they can): data stays right
while pages are moved out of holes and released under four streams with record_stream, and while
blocks go from one stream to another after GPU-side waits."""

import os
import random

import torch

import streampool

MiB = 1 << 20


def _require_vmm(ctx) -> None:
    assert ctx.streampool_is_global, "needs streampool installed"
    assert os.environ.get("STREAMPOOL_BACKEND", "").strip().lower() == "vmm", (
        "run with STREAMPOOL_BACKEND=vmm"
    )


def case_vmm_remap_four_streams(ctx) -> None:
    """Four streams allocate blocks of 1-24 MiB, fill them with a value of their own, hand some to
    another stream (record_stream) that adds to them, and free them in random order; every few
    rounds the release threshold drops to 0 and holes are made, so pages are unmapped and moved.
    Every element of every block is checked before it is freed; no byte stays allocated."""
    _require_vmm(ctx)
    baseline = ctx.baseline()
    rng = random.Random(1234)
    streams = [torch.cuda.Stream() for _ in range(4)]
    live = []  # (tensor, expected value, stream)
    rounds = 120 if ctx.quick else 600
    streampool.record_history(True, max_entries=1_000_000)
    for i in range(rounds):
        if len(live) < 24 and rng.random() < 0.6:
            stream = rng.choice(streams)
            elements = rng.randint(1 * MiB, 24 * MiB) // 4
            value = float(rng.randint(1, 1000))
            with torch.cuda.stream(stream):
                block = torch.full((elements,), value, dtype=torch.float32, device="cuda")
            if rng.random() < 0.4:
                other = rng.choice(streams)
                other.wait_stream(stream)
                with torch.cuda.stream(other):
                    block.record_stream(other)
                    block.add_(1.0)
                value += 1.0
                stream = other
            live.append((block, value, stream))
        elif live:
            block, value, stream = live.pop(rng.randrange(len(live)))
            with torch.cuda.stream(stream):
                wrong = int((block != value).sum())
            stream.synchronize()
            assert wrong == 0, f"round {i}: {wrong} of {block.numel()} elements changed (expected {value})"
            del block
        if i % 50 == 25:
            # Holes: free every other live block, then ask for less memory to be kept.
            for block, value, stream in live[::2]:
                stream.synchronize()
                assert int((block != value).sum()) == 0, f"round {i}: block changed"
            live = live[1::2]
            # A threshold applies at the device's synchronisation, as in PyTorch and CUDA (a
            # stream's does not): the holes' pages go back here.
            streampool.set_release_threshold(0)
            torch.cuda.synchronize()
        if i % 50 == 40:
            streampool.set_release_threshold("max")
    for block, value, stream in live:
        stream.synchronize()
        assert int((block != value).sum()) == 0, "a block changed before the end"
    del live, block
    torch.cuda.synchronize()
    kinds = {event["action"] for event in streampool.history()}
    streampool.record_history(False)
    assert {"map", "unmap"} <= kinds, f"pages were not mapped and unmapped: {sorted(kinds)}"
    ctx.settle()
    stats = streampool.memory_stats()
    # Live, used, mapped bytes and the device's free memory back to where they were (other
    # cases may have run in this process before: the start is measured, not assumed empty).
    ctx.assert_back_to(baseline, "after the remap rounds")
    after = streampool.memory_stats()
    print(
        f"vmm remap: {rounds} rounds on 4 streams, every element checked; "
        f"reserved {stats['reserved_bytes.all.current'] / MiB:.0f} MiB -> "
        f"{after['reserved_bytes.all.current'] / MiB:.0f} MiB after empty_cache"
    )


def case_vmm_sleep_and_wake(ctx) -> None:
    """streampool.sleep() / wake() with a model, its AdamW state, a captured CUDA graph and an
    inference buffer: after sleep(1) the device holds (nearly) none of the allocator's memory;
    after wake() every tensor keeps its address and its bytes, the graph replays to the same
    output, and a training step equals one of a twin that never slept. Level 2 then gives the
    memory back again (its contents discarded) and wake() maps it again. Prints the memory given
    back and the copy rates."""
    _require_vmm(ctx)
    import time

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 2048)
    ).cuda()
    twin = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 2048)
    ).cuda()
    twin.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    x = torch.randn(256, 2048, device="cuda")

    def step(m, o):
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        o.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(2):
        step(model, opt), step(twin, twin_opt)
    buffer = torch.randn(64 * MiB // 4, device="cuda")  # an inference buffer
    static_in = torch.randn(256, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(static_in)
    graph.replay()
    torch.cuda.synchronize()
    expected_out = static_out.clone()
    tensors = [p for p in model.parameters()] + [buffer] + [
        s for state in opt.state.values() for s in state.values() if torch.is_tensor(s) and s.is_cuda
    ]
    before = [(t.data_ptr(), t.detach().clone().cpu()) for t in tensors]
    reserved = streampool.memory_reserved()
    free_before = torch.cuda.mem_get_info()[0]
    began = time.perf_counter()
    given_back = streampool.sleep(level=1)
    slept_s = time.perf_counter() - began
    free_asleep = torch.cuda.mem_get_info()[0]
    returned = free_asleep - free_before
    assert given_back == reserved, (given_back, reserved)
    assert streampool.memory_reserved() == 0
    assert returned >= 0.99 * reserved, f"the device got {returned} B of {reserved} back"
    # The pages under live blocks sleep; the others went back as empty_cache() gives them back.
    asleep = streampool.sleeping_bytes()
    assert 0 < asleep <= reserved, (asleep, reserved)
    began = time.perf_counter()
    restored = streampool.wake()
    woke_s = time.perf_counter() - began
    assert restored == asleep, (restored, asleep)
    for (ptr, saved), t in zip(before, tensors):
        assert t.data_ptr() == ptr, "a tensor moved"
        assert torch.equal(t.detach().cpu(), saved), "contents changed across sleep and wake"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, expected_out), "the graph replays differently after wake"
    a, b = step(model, opt), step(twin, twin_opt)
    assert torch.equal(a, b), "a training step after wake differs from one that never slept"
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    # Level 2: the contents go; the memory under live tensors comes back all the same — but a
    # tensor freed while asleep: wake does not map its memory again.
    dropped = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    streampool.sleep(level=2)
    assert streampool.memory_reserved() == 0
    asleep = streampool.sleeping_bytes()
    del dropped
    assert streampool.wake() <= asleep - 64 * MiB, "the freed tensor's memory was mapped again"
    buffer.fill_(1.0)
    assert float(buffer.sum()) == buffer.numel()
    print(
        f"vmm sleep: {reserved / MiB:.0f} MiB reserved, {returned / MiB:.0f} MiB back to the device "
        f"({100 * returned / max(reserved, 1):.2f}%), sleep {slept_s * 1e3:.1f} ms "
        f"({reserved / max(slept_s, 1e-9) / 1e9:.1f} GB/s of pages), wake {woke_s * 1e3:.1f} ms "
        f"({restored / MiB:.0f} MiB under live blocks, {restored / max(woke_s, 1e-9) / 1e9:.1f} GB/s)"
    )
    del graph


def case_vmm_sleep_discarding_a_tag(ctx) -> None:
    """The RL and serving case: weights kept, a KV cache made under ``streampool.tag("kv_cache")``
    discarded. After ``sleep(1, discard=["kv_cache"])`` only the weights' pages wait in host
    memory; after wake() the weights are bit for bit as before and the cache keeps its address.
    The host buffer is kept after the wake and reused by a second cycle (no new pinning; the
    weights still exact), then released. Prints the bytes saved against the bytes asleep."""
    _require_vmm(ctx)
    torch.manual_seed(1)
    weights = [torch.randn(1024, 1024, device="cuda") for _ in range(8)]  # 4 MiB each
    with streampool.tag("kv_cache"):
        cache = torch.randn(64 * MiB // 4, device="cuda")
    torch.cuda.synchronize()
    saved_weights = [w.cpu() for w in weights]
    cache_at = cache.data_ptr()
    given_back = streampool.sleep(level=1, discard=["kv_cache"])
    asleep = streampool.sleeping_bytes()  # the pages under live blocks
    saved = streampool.sleep_saved_bytes()
    assert 0 < asleep <= given_back and saved < asleep, (saved, asleep, given_back)
    assert saved >= sum(w.numel() * 4 for w in weights)
    assert saved <= asleep - 60 * MiB, "the cache's pages were saved too"
    assert streampool.sleep_host_buffer_bytes() == saved
    streampool.wake()
    assert cache.data_ptr() == cache_at
    for w, before in zip(weights, saved_weights):
        assert torch.equal(w.cpu(), before), "a kept tensor changed across sleep and wake"
    assert streampool.sleep_host_buffer_bytes() == saved, "the host buffer was not kept"
    cache.fill_(2.0)  # the cache is usable memory again
    assert float(cache[:1024].sum()) == 2048.0
    for w in weights:
        w.mul_(2)
    streampool.sleep(level=1, discard=["kv_cache"])
    streampool.wake()
    for w, before in zip(weights, saved_weights):
        assert torch.equal(w.cpu(), before * 2), "the second cycle restored stale contents"
    assert streampool.release_sleep_buffer() == saved
    assert streampool.sleep_host_buffer_bytes() == 0
    print(f"vmm sleep discarding: {asleep / MiB:.0f} MiB asleep, {saved / MiB:.0f} MiB saved "
          "(weights), the cache discarded; the host buffer kept and reused")



def case_vmm_sleep_with_a_reserved_buffer(ctx) -> None:
    """streampool.reserve_sleep_buffer() pins the next sleep's host buffer ahead: the sleep uses
    it (a buffer larger than the sleep needs is still the one held: a sleep that pinned its own
    would hold what it saved), the tensors come back exact, and a smaller reservation keeps it.
    Prints the time to reserve against the sleep's."""
    import time

    _require_vmm(ctx)
    torch.manual_seed(2)
    weights = [torch.randn(1024, 1024, device="cuda") for _ in range(16)]  # 4 MiB each
    torch.cuda.synchronize()
    before = [w.cpu() for w in weights]
    needed = sum(w.numel() * 4 for w in weights)
    began = time.perf_counter()
    reserved = streampool.reserve_sleep_buffer(size=4 * needed)
    reserve_s = time.perf_counter() - began
    assert reserved == 4 * needed, reserved
    assert streampool.reserve_sleep_buffer(size=MiB) == reserved, "a larger buffer was not kept"
    began = time.perf_counter()
    streampool.sleep(level=1)
    sleep_s = time.perf_counter() - began
    assert streampool.sleep_saved_bytes() < reserved
    assert streampool.sleep_host_buffer_bytes() == reserved, "the sleep pinned a buffer of its own"
    streampool.wake()
    for w, b in zip(weights, before):
        assert torch.equal(w.cpu(), b), "a tensor changed across sleep and wake"
    assert streampool.release_sleep_buffer() == reserved
    print(f"vmm sleep with a reserved buffer: {reserved / MiB:.0f} MiB reserved in "
          f"{reserve_s * 1e3:.1f} ms, then slept in {sleep_s * 1e3:.1f} ms")

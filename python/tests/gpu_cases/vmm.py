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
            streampool.set_release_threshold(0)
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

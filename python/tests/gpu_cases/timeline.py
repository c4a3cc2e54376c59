"""GPU cases: the memory timeline on real training, read back by PyTorch's own tools."""

import os
import pickle
import tempfile

import torch

import streampool


def _train_a_little(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        x = torch.randn(64 * (1 + step % 4), 1024, device="cuda")
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    del model, optimizer, x, loss


def case_timeline(ctx) -> None:
    """record_history over a few training steps; the snapshot opens in torch.cuda._memory_viz
    (every reader it has), the gauges agree with the statistics, and plot_timeline draws it."""
    import torch.cuda._memory_viz as viz

    assert ctx.streampool_is_global
    streampool.record_history(True, max_entries=200_000)
    _train_a_little(3 if ctx.quick else 12)
    ctx.settle()
    events = streampool.history()
    actions = {e["action"] for e in events}
    assert {"alloc", "free", "pool_alloc"} <= actions, actions
    # Reserved memory grows as a pool's growth, or as pages mapped (the vmm backend).
    assert actions & {"pool_grow", "map"}, actions
    assert events[-1]["allocated_bytes"] == streampool.memory_allocated()
    allocs = [e for e in events if e["action"] == "alloc"]
    frees = [e for e in events if e["action"] == "free"]
    with tempfile.TemporaryDirectory() as tmp:
        path = streampool.dump_snapshot(os.path.join(tmp, "snapshot.pickle"))
        with open(path, "rb") as f:
            snap = pickle.load(f)
        plain = lambda text: text  # noqa: E731  (the default downloads flamegraph.pl: no network needed)
        viz.segments(snap, plain)
        viz.memory(snap, plain)
        summary = viz.segsum(snap)
        trace = viz.trace(snap)
        html = viz.trace_plot(snap)
        segment_html = viz.segment_plot(snap)
        assert "cudaMalloc(" in trace and "del " in trace, trace[:2000]
        assert len(html) > 1000 and len(segment_html) > 1000
        png = streampool.plot_timeline(path, os.path.join(tmp, "memory.png"))
        assert png.stat().st_size > 10_000
    streampool.record_history(False)
    print(f"TIMELINE {len(events)} events ({len(allocs)} allocs, {len(frees)} frees); "
          f"torch.cuda._memory_viz read it: segsum {len(summary)} chars, trace {len(trace)} chars, "
          f"trace_plot {len(html)} chars")

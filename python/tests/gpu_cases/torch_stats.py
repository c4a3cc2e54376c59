"""GPU cases: PyTorch's own memory functions under streampool.install(), used as training scripts
and trainers' memory loggers use them."""

import torch

import streampool

MiB = 1 << 20


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()


def case_torch_memory_functions(ctx) -> None:
    """A training loop that logs what PyTorch's functions say each step (as
    ``print(torch.cuda.max_memory_allocated())`` and Lightning's DeviceStatsMonitor do): every
    figure is streampool's, peaks reset per step, memory_summary() is streampool's table."""
    assert streampool.is_installed()
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(5):
        torch.cuda.reset_peak_memory_stats()
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        logged = {k: v for k, v in torch.cuda.memory_stats().items() if not k.startswith("streampool.")}
        ours = streampool.memory_stats()
        for key, value in logged.items():
            if key.startswith("requested_bytes"):
                key = key.replace("requested_bytes", "allocated_bytes")
            assert ours[key] == value, (key, ours[key], value)
        peak, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        assert peak == ours["allocated_bytes.all.peak"] and now == ours["allocated_bytes.all.current"]
        assert peak > now > 0, (peak, now)
        assert torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved() > 0
        print(f"TORCH_STATS step {step}: max_memory_allocated {peak} memory_allocated {now} "
              f"memory_reserved {torch.cuda.memory_reserved()} num_ooms {logged['num_ooms']}")
    before = torch.cuda.memory_allocated(0)
    block = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda:0")
    assert torch.cuda.memory_allocated(torch.device("cuda", 0)) - before == 8 * MiB
    del block
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    summary = torch.cuda.memory_summary()
    assert "streampool memory summary, device 0 (driver cuda)" in summary, summary
    print(summary)


def case_torch_memory_functions_opted_out(ctx) -> None:
    """install(torch_stats=False): PyTorch's functions stay as PyTorch has them for pluggable
    allocators (they raise), streampool's own still work."""
    assert streampool.is_installed()
    x = torch.ones(1024, device="cuda")
    try:
        torch.cuda.memory_allocated()
    except RuntimeError as exc:
        assert "getDeviceStats" in str(exc), exc
    else:
        raise AssertionError("torch.cuda.memory_allocated() worked with torch_stats=False")
    assert streampool.memory_allocated() >= x.numel() * 4

"""GPU scenarios for sharing CUDA tensors between processes: ``python ipc_procs.py SCENARIO``.

Each scenario is a producer (this process, streampool installed with ipc=True) and consumers
started with the spawn method; it asserts inside and prints one summary line starting with
``IPC <scenario>:``. Workers live in this file so that spawn can
import them.
"""

import os
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

import streampool

N = 1 << 20


TIMEOUT_S = 120


def _reporting(worker):
    """Runs ``worker(*args, outbox)``; an exception goes to the producer through ``outbox``."""

    def run(*args):
        outbox = args[-1]
        try:
            worker(*args)
        except BaseException:
            outbox.put(("error", traceback.format_exc()))
            raise

    return run


def _receive(outbox, count: int):
    """``count`` messages from the workers; a worker's exception is raised here."""
    messages = []
    for _ in range(count):
        message = outbox.get(timeout=TIMEOUT_S)
        if message[0] == "error":
            raise AssertionError(f"a worker failed:\n{message[1]}")
        messages.append(message)
    return sorted(messages)


def _start(ctx, target, *args):
    """A daemon worker: if the producer fails, exiting does not wait for it."""
    process = ctx.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def _wait_collected(timeout_s: float = 60.0) -> None:
    """The producer lets go of blocks as receivers release them."""
    deadline = time.monotonic() + timeout_s
    while streampool.shared_block_count() and time.monotonic() < deadline:
        streampool.ipc_collect()
        time.sleep(0.05)
    assert streampool.shared_block_count() == 0, f"{streampool.shared_block_count()} blocks never released"


def _consumer(index: int, inbox, outbox) -> None:
    x = inbox.get(timeout=TIMEOUT_S)
    assert x.device.index == 0 and x.shape == (N,)
    mine = index * N // 2 + 5  # in its own half: the other consumer may already have written
    assert float(x[mine]) == float(mine), "reads the producer's data"
    x[index * N // 2 : (index + 1) * N // 2] = -(index + 1)  # writes its half
    torch.cuda.synchronize()
    outbox.put(("written", index))
    assert inbox.get(timeout=TIMEOUT_S) == "release"
    del x  # releases the import: freed and waited for here, then the producer is told
    outbox.put(("released", index))


def consumer(index: int, inbox, outbox) -> None:
    _reporting(_consumer)(index, inbox, outbox)


def scenario_queue() -> str:
    """A producer and two consumers over torch.multiprocessing queues: both read and write the
    tensor, the producer sees the writes, and frees only after both have let go."""
    ctx = mp.get_context("spawn")
    inboxes, outbox = [ctx.Queue(), ctx.Queue()], ctx.Queue()
    workers = [_start(ctx, consumer, i, inboxes[i], outbox) for i in range(2)]
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    for box in inboxes:
        box.put(x)
    assert _receive(outbox, 2) == [("written", 0), ("written", 1)]
    torch.cuda.synchronize()
    assert bool((x[: N // 2] == -1).all()) and bool((x[N // 2 :] == -2).all()), "sees both writes"
    assert streampool.shared_block_count() == 1, "kept while the consumers hold it"
    for box in inboxes:
        box.put("release")
    assert _receive(outbox, 2) == [("released", 0), ("released", 1)]
    _wait_collected()
    for w in workers:
        w.join(timeout=TIMEOUT_S)
        assert w.exitcode == 0, f"consumer exit code {w.exitcode}"
    del x
    torch.cuda.synchronize()
    assert streampool.memory_allocated() == 0
    return "two consumers read and wrote one tensor, the producer saw both writes and freed after both released"


def _hogwild_worker(model, steps: int, seed: int, outbox) -> None:
    torch.manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.linspace(-1, 1, 64, device="cuda")
    for _ in range(steps):
        x = torch.randn(256, 64, device="cuda")
        loss = (model(x).squeeze(1) - x @ true_w).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # in place, on the shared parameters
    torch.cuda.synchronize()
    outbox.put(("trained", seed))


def hogwild_worker(model, steps: int, seed: int, outbox) -> None:
    _reporting(_hogwild_worker)(model, steps, seed, outbox)


def _regression_loss(model) -> float:
    torch.manual_seed(123)
    true_w = torch.linspace(-1, 1, 64, device="cuda")
    x = torch.randn(4096, 64, device="cuda")
    with torch.no_grad():
        return float((model(x).squeeze(1) - x @ true_w).square().mean())


def scenario_hogwild() -> str:
    """Two processes train one model whose parameters live in this process's shareable pool."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1).cuda()
    before = _regression_loss(model)
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    workers = [_start(ctx, hogwild_worker, model, 300, seed, outbox) for seed in (1, 2)]
    assert _receive(outbox, 2) == [("trained", 1), ("trained", 2)]
    for w in workers:
        w.join(timeout=TIMEOUT_S)
        assert w.exitcode == 0, f"worker exit code {w.exitcode}"
    after = _regression_loss(model)
    assert after < 0.05 * before, f"loss {before:.4f} -> {after:.4f}: the workers' updates did not land here"
    _wait_collected()  # the workers released the parameters when they exited
    return f"two processes trained one shared model: loss {before:.3f} -> {after:.5f}"


def _many_consumer(inbox, count: int, outbox) -> None:
    for _ in range(count):
        t = inbox.get(timeout=TIMEOUT_S)
        assert float(t[-1]) == float(t.numel()), "reads the producer's data"
        del t
    outbox.put(("done",))


def many_consumer(inbox, count: int, outbox) -> None:
    _reporting(_many_consumer)(inbox, count, outbox)


def scenario_many() -> str:
    """1,000 tensors shared and released one by one; the pool's used bytes end where they began."""
    count = 1000
    streampool.empty_cache()
    start = streampool.memory_stats()["ipc_used_bytes"]
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = _start(ctx, many_consumer, inbox, count, outbox)
    for i in range(count):
        n = 1 + (i * 7919) % (1 << 18)
        inbox.put(torch.arange(1, n + 1, dtype=torch.float32, device="cuda"))
    assert _receive(outbox, 1) == [("done",)]
    _wait_collected()
    worker.join(timeout=TIMEOUT_S)
    assert worker.exitcode == 0
    torch.cuda.synchronize()
    streampool.empty_cache()
    end = streampool.memory_stats()["ipc_used_bytes"]
    assert end == start, f"pool used bytes {start} -> {end}"
    return f"{count} tensors shared and released; shareable pool used bytes {start} -> {end}"


def scenario_errors() -> str:
    """On the pool backend only shareable memory can be sent, and the error says how to make it
    shareable; on the vmm backend any tensor is sent, page by page."""
    from multiprocessing.reduction import ForkingPickler

    plain = torch.ones(10, device="cuda")
    if os.environ.get("STREAMPOOL_BACKEND", "").strip().lower() == "vmm":
        ForkingPickler.dumps(plain)  # every vmm page is exportable: no error
        outcome = "ordinary tensor sent page by page"
    else:
        try:
            ForkingPickler.dumps(plain)
            raise AssertionError("a tensor from the ordinary pool was sent")
        except streampool.StreampoolError as e:
            message = str(e)
        assert "not in a shareable pool" in message and "streampool.shareable()" in message, message
        outcome = f"ordinary-pool tensor refused: {message.split(':')[0]}"
    with streampool.shareable():
        shared = torch.ones(10, device="cuda")
    ForkingPickler.dumps(shared)
    cpu = ForkingPickler.dumps(torch.ones(3))  # CPU tensors keep PyTorch's own way
    assert torch.equal(ForkingPickler.loads(cpu), torch.ones(3))
    return outcome


if __name__ == "__main__":
    name = sys.argv[1]
    streampool.install(ipc=name != "errors")
    print(f"IPC {name}: {globals()['scenario_' + name]()}", flush=True)

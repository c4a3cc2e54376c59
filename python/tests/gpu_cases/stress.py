"""GPU cases for reliability (``case_<name>(ctx)``): many threads and streams at once, a long
soak of training steps with shapes that change every step, and a device near full."""

import os
import queue
import threading

import torch

MiB = 1 << 20


def _producer_consumer(ctx, seed: int, handoff: "queue.Queue", errors: list, rounds: int) -> None:
    """Makes tensors on a side stream, uses them on this thread's stream (record_stream), checks
    every element, and hands every other one to the next thread, which frees it: frees cross
    threads."""
    try:
        side, main = torch.cuda.Stream(), torch.cuda.Stream()
        for i in range(rounds):
            size = 1 + (seed * 7919 + i * 104729) % (3 * MiB)
            value = (seed * 31 + i) % 251
            with torch.cuda.stream(side):
                made = torch.full((size,), value, dtype=torch.uint8, device="cuda")
            ctx.check_aligned(made)
            main.wait_stream(side)
            with torch.cuda.stream(main):
                made.record_stream(main)
                doubled = made.to(torch.int16) * 2
            ctx.check_aligned(doubled)
            if i % 2:
                handoff.put((made, doubled, value))
            else:
                main.synchronize()
                assert bool((doubled == 2 * value).all()) and bool((made == value).all()), (i, value)
            del made, doubled
            try:
                theirs, their_doubled, their_value = handoff.get_nowait()
                torch.cuda.current_stream().wait_stream(main)
                torch.cuda.synchronize()
                assert bool((their_doubled == 2 * their_value).all()), their_value
                assert bool((theirs == their_value).all()), their_value
                del theirs, their_doubled  # freed here, allocated on another thread
            except queue.Empty:
                pass
        side.synchronize()
        main.synchronize()
    except BaseException as exc:  # reported by the main thread
        errors.append(f"thread {seed}: {exc!r}")


def case_threads_stress(ctx) -> None:
    """Eight Python threads, two streams each, record_stream on every tensor, tensors freed on
    other threads than made them; values stay right and no byte is left allocated."""
    baseline = ctx.baseline()
    handoff: "queue.Queue" = queue.Queue()
    errors: list = []
    rounds = 40 if ctx.quick else 200
    threads = [
        threading.Thread(target=_producer_consumer, args=(ctx, seed, handoff, errors, rounds)) for seed in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    while not handoff.empty():
        handoff.get_nowait()
    ctx.assert_back_to(baseline, "after the threads")
    print(f"THREADS 8 threads x {rounds} rounds, live bytes back to {baseline.allocated}")


def case_soak(ctx) -> None:
    """1,000 training steps of a small GPT-2 whose batch and sequence length change every step,
    the largest shape first. Prints the reserved-bytes peak of each half (``SOAK first second``,
    bytes) for test_gpu to compare with the native allocator's on the same steps; at the end
    live bytes must be back to the baseline. With GPU_CASE_DEVICE_SHARED=1 (test_gpu runs it
    beside a native process, whose context and cache move the device's free memory) the device's
    free memory is not compared; the pools' bytes still are, exactly."""
    import transformers

    steps = 60 if ctx.quick else 1000
    torch.manual_seed(0)
    baseline = ctx.baseline()
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=512)
    model = transformers.GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(1)
    shapes = torch.Generator().manual_seed(2)
    first_half_peak = None
    for step in range(steps):
        batch = int(torch.randint(2, 17, (1,), generator=shapes))
        length = int(torch.randint(16, 513, (1,), generator=shapes))
        if step == 0:  # the largest shape first
            batch, length = 16, 512
        tokens = torch.randint(0, config.vocab_size, (batch, length), device="cuda", generator=generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == steps // 2 - 1:
            torch.cuda.synchronize()
            first_half_peak = ctx.max_reserved()
            ctx.reset_peak()
    torch.cuda.synchronize()
    print(f"SOAK {first_half_peak} {ctx.max_reserved()} steps={steps} loss={loss.item():.3f}")
    del model, optimizer, loss, tokens
    device_shared = os.environ.get("GPU_CASE_DEVICE_SHARED") == "1"
    ctx.assert_back_to(baseline, "after the soak", device_shared=device_shared)


def case_near_full_checkerboard(ctx) -> None:
    """88% of the free memory in 256 MiB tensors (a 1 MiB tensor after each with
    STREAMPOOL_TEST_CHECKER_SMALL=1), every other large one freed, then one tensor of 40% of the
    card, which only the freed memory can hold (bench/trace_capture.py's checkerboard). It is
    served; kernels still launch and run afterwards (a full device fails them outside the
    allocator); the device keeps free memory (under vmm, at least STREAMPOOL_VMM_HEADROOM)."""
    small = os.environ.get("STREAMPOOL_TEST_CHECKER_SMALL") == "1"
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    count = int(free_bytes * 0.88) // (256 * MiB)
    big_bytes = int(total_bytes * 0.40) // (2 * MiB) * (2 * MiB)
    tensors = []
    for _ in range(count):
        tensors.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
        if small:
            tensors.append(torch.empty(MiB, dtype=torch.uint8, device="cuda"))
    step = 4 if small else 2
    for i in range(0, len(tensors), step):
        tensors[i] = None
    big = torch.empty(big_bytes, dtype=torch.uint8, device="cuda")
    # Kernels the program has not run yet still load and run.
    big[:MiB].fill_(7)
    probe = torch.randn(512, 512, device="cuda")
    total = float((probe @ probe).sum()) + float(big[:MiB].sum())
    torch.cuda.synchronize()
    assert total == total, "a kernel failed"
    left_bytes = torch.cuda.mem_get_info()[0]
    print(f"near full: {count} tensors of 256 MiB, {big_bytes / 2**30:.1f} GiB served, "
          f"{left_bytes / 2**30:.2f} GiB free after")
    assert left_bytes > 0, "the device was left full"
    del big, probe
    tensors.clear()

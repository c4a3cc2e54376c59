"""Does the pool stop growing once training has seen its largest shapes? One allocator per run.

Run on the GPU (one process per configuration):
    STREAMPOOL_LIBRARY=... PYTHONPATH=python python3 bench/diag_growth.py ALLOCATOR WORKLOAD STEPS
ALLOCATOR: native | streampool (STREAMPOOL_* and PYTORCH_CUDA_ALLOC_CONF from the environment).
WORKLOAD: soak (the soak test's small GPT-2, batch 2..16 x length 16..512, largest first) or
gpt2 (GPT-2 124M, batch 8, length 128..1024 in steps of 128, as in the benchmark).
Prints one line: reserved-bytes peak in the first and second half, peak device memory used
(mem_get_info) / peak live bytes, median step time.
"""

import random
import statistics
import sys
import time

import streampool

ALLOCATOR, WORKLOAD, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
if ALLOCATOR == "streampool":
    streampool.install()
import torch  # noqa: E402
import transformers  # noqa: E402

MIB = 2**20


def stats():
    return streampool.memory_stats() if ALLOCATOR == "streampool" else torch.cuda.memory_stats()


def reset_peaks():
    (streampool.reset_peak_memory_stats if ALLOCATOR == "streampool" else torch.cuda.reset_peak_memory_stats)()


def main() -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    free_at_start, _ = torch.cuda.mem_get_info()
    if WORKLOAD == "soak":
        config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=512)
        shapes = [(16, 512)] + [(rng.randint(2, 16), rng.randint(16, 512)) for _ in range(STEPS - 1)]
    else:
        config = transformers.GPT2Config()
        shapes = [(8, 1024)] + [(8, rng.choice(range(128, 1025, 128))) for _ in range(STEPS - 1)]
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peak_device, peak_live, times_s, first_half = 0, 0, [], None
    for step, (batch, length) in enumerate(shapes):
        t0 = time.perf_counter()
        x = torch.randint(0, config.vocab_size, (batch, length), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x
        torch.cuda.synchronize()
        times_s.append(time.perf_counter() - t0)
        free_now, _ = torch.cuda.mem_get_info()
        peak_device = max(peak_device, free_at_start - free_now)
        s = stats()
        peak_live = max(peak_live, s["allocated_bytes.all.peak"])
        if step == STEPS // 2 - 1:
            first_half = s["reserved_bytes.all.peak"]
            reset_peaks()
    second_half = stats()["reserved_bytes.all.peak"]
    print(
        f"GROWTH {ALLOCATOR:10s} {WORKLOAD} {STEPS} steps: reserved peak {first_half / MIB:7.0f} MiB -> "
        f"{second_half / MIB:7.0f} MiB ({'grew' if second_half > first_half else 'flat'}); "
        f"device/live {peak_device / peak_live:.3f}; median step {statistics.median(times_s[STEPS // 4:]) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()

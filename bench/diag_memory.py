"""Per-step memory of GPT-2 training under streampool: where do reserved bytes go?

Run on the GPU: STREAMPOOL_LIBRARY=... PYTHONPATH=python python3 bench/diag_memory.py [steps] [native]
Prints, per step: sequence length, peak live bytes, pool reserved, pool used, cached bytes,
and device memory used since start (mem_get_info), all in MiB.
"""

import random
import statistics
import sys
import time

import streampool

NATIVE = "native" in sys.argv[2:]
if not NATIVE:
    streampool.install()
import torch  # noqa: E402
import transformers  # noqa: E402

MIB = 2**20


def main(steps: int) -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    free_at_start, _ = torch.cuda.mem_get_info()
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peak_device = 0
    step_times_s = []
    for step in range(steps):
        t0 = time.perf_counter()
        seq = rng.choice(range(128, 1025, 128))
        x = torch.randint(0, 50257, (8, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x
        torch.cuda.synchronize()
        if step >= steps // 3:
            step_times_s.append(time.perf_counter() - t0)
        s = torch.cuda.memory_stats() if NATIVE else streampool.memory_stats()
        free_now, _ = torch.cuda.mem_get_info()
        peak_device = max(peak_device, free_at_start - free_now)
        if NATIVE:
            continue
        print(
            f"step {step:3d} seq {seq:4d} live_peak {s['allocated_bytes.all.peak'] / MIB:8.0f} "
            f"reserved {s['reserved_bytes.all.current'] / MIB:8.0f} used {s['pool_used_bytes'] / MIB:8.0f} "
            f"cached {s['cached_bytes'] / MIB:8.0f} device_used {(free_at_start - free_now) / MIB:8.0f} "
            f"hits {s['cache_hits']} dev_allocs {s['num_device_alloc']} dev_frees {s['num_device_free']}"
        )
    s = torch.cuda.memory_stats() if NATIVE else streampool.memory_stats()
    print(
        f"RATIO peak_device/peak_live = {peak_device / s['allocated_bytes.all.peak']:.2f} "
        f"median step {statistics.median(step_times_s) * 1e3:.2f} ms "
        f"cache hits {s.get('cache_hits')} of {s['allocation.all.allocated']} allocations"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)

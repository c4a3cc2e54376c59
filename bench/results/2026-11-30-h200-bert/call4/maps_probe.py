"""BERT on vmm: pages mapped in 3 rounds of the timed steps after the warm-up, under one loop
variant (argv[1]): plain (as bench/diag_steps.py, without its per-round stats), history (the
timeline recording on), sentinel (a 1021-byte tensor made and freed after each step, as
bench/diag_vmm_trace.py marks steps), roundstats (torch.cuda.memory_stats() after each round,
as diag_steps reads its counts)."""
import os, sys, time
mode = sys.argv[1]
import streampool
streampool.install()
import torch
sys.path.insert(0, os.getcwd())
from bench import schedules as s, workloads
from bench.engine import warm_up_libraries
torch.cuda.init()
warm_up_libraries(torch)
if mode == "history":
    streampool.record_history(True, max_entries=4_000_000)
step = workloads.build(torch, "bert")
sched = s.build_schedule("bert")
for p in sched.steps[: sched.warmup]:
    step(p)
torch.cuda.synchronize()
m0 = streampool.memory_stats()
t0 = time.perf_counter()
timed = sched.steps[sched.warmup :]
for r in range(3):
    for p in timed:
        step(p)
        if mode == "sentinel":
            x = torch.empty(1021, dtype=torch.uint8, device="cuda")
            del x
    torch.cuda.synchronize()
    if mode == "roundstats":
        torch.cuda.memory_stats()
m1 = streampool.memory_stats()
n = 3 * len(timed)
print(f"MAPS {mode} {os.path.basename(os.environ['STREAMPOOL_LIBRARY'])}: timed maps "
      f"{m1['num_maps'] - m0['num_maps']} unmaps {m1['num_unmaps'] - m0['num_unmaps']} in {n} "
      f"steps, {(time.perf_counter() - t0) / n * 1e3:.2f} ms a step", flush=True)

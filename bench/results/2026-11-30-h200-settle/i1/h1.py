"""Where a step's wall time goes around torch.cuda.synchronize() under install(): per step, the
step's launch, PyTorch's synchronisation, and streampool's hook after it (streampool_synchronized),
medians in microseconds. Modes: native; hook (install()'s routing); nohook (the hook not called:
what the settling costs, its effect on the next steps included). One process a mode."""
import os, statistics, sys, time
sys.path.insert(0, os.getcwd())
from bench.engine import CudaEngine

mode, workload = sys.argv[1], sys.argv[2]
engine = CudaEngine("native" if mode == "native" else "streampool",
                    "native" if mode == "native" else "pluggable")
engine.set_up()
torch = engine.torch
sync = torch._C._cuda_synchronize
original = getattr(sync, "__wrapped__", sync)
hook = None
if mode == "hook":
    from streampool import _lib
    hook = _lib.library().streampool_synchronized
step, schedule = engine.build(workload)
timed = list(schedule.steps[schedule.warmup:])
steps = (timed * (1 + 400 // len(timed)))[:400]
for p in schedule.steps:
    step(p); original()
rows = []
for p in steps:
    a = time.perf_counter_ns(); step(p); b = time.perf_counter_ns(); original()
    c = time.perf_counter_ns()
    if hook is not None:
        hook(torch.cuda.current_device())
    d = time.perf_counter_ns()
    rows.append((b - a, c - b, d - c, d - a))
med = [statistics.median(r[i] for r in rows) / 1000 for i in range(4)]
tot = sum(r[3] for r in rows) / len(rows) / 1000
print(f"HOOK {workload} {mode}: launch {med[0]:.1f} us, sync {med[1]:.1f}, hook {med[2]:.1f}, "
      f"step median {med[3]:.1f}, mean {tot:.1f} ({len(rows)} steps)", flush=True)

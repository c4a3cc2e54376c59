"""Where a workload step's GPU time goes, per allocator (a GPU diagnostic: ``scripts/gpu-diag
profile``).

``python3 bench/diag_profile.py [WORKLOAD...]`` (default: vision_sizes) runs each configuration of
bench/diag_configs.py in a process of its own, pinned to the same CPUs, one after another. A
process runs the schedule's warm-up steps, times ROUNDS rounds of its timed steps (wall and CUDA
events, no profiler), then runs the timed steps once more under ``torch.profiler`` (CPU and CUDA
activities) and reads the trace:
- the GPU's busy time (the union of kernels, copies and sets), the kernels' sum and count;
- the GPU's idle time between them (gaps over GAP_FLOOR_US), split by the time each traced CUDA
  runtime or driver call covers of it (a runtime call and the driver call inside it both count),
  the rest under "(host code)": PyTorch's and the allocator's own code. The profiler traces the
  runtime's calls and the kernel launches, not the driver calls the allocator makes (its page
  calls and events are host code here);
- the host's time in each runtime and driver call;
- the host's time in each PyTorch operator (inclusive; the allocation is inside
  ``aten::empty_strided`` and its kind);
- the kernels by name, written to ``DIAG_PROFILE_OUT`` (a folder, default the current one) as
  ``profile-<workload>-<config>.json``, to compare which kernels each configuration ran.

Invariant: a configuration's figures come only from its own process; the profiled pass is apart
from the timed rounds, so the profiler's own cost is in no timed figure.
"""

import collections
import json
import os
import statistics
import sys
import tempfile

import diag_configs  # (run as a file: bench/ is on the path)
import diag_steps

ROUNDS = int(os.environ.get("DIAG_ROUNDS", "3"))
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
GAP_FLOOR_US = 5.0  # shorter gaps between GPU operations are not idle time here
HOST_CODE = "(host code)"  # a gap's time under no traced call


def union_us(intervals) -> float:
    """Length of the union of (start, end) intervals, sorted by start."""
    total, end = 0.0, float("-inf")
    for a, b in intervals:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def read_trace(path: str, steps: int) -> dict:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu, host = [], []
    kernels = collections.defaultdict(lambda: [0, 0.0])
    calls = collections.defaultdict(lambda: [0, 0.0])
    ops = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, ts, dur = e.get("cat"), float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat in GPU_CATEGORIES:
            gpu.append((ts, ts + dur))
            k = kernels[e.get("name", "?")]
            k[0] += 1
            k[1] += dur
        elif cat in HOST_CATEGORIES:
            host.append((ts, ts + dur, e.get("name", "?")))
            c = calls[e.get("name", "?")]
            c[0] += 1
            c[1] += dur
        elif cat == "cpu_op":
            o = ops[e.get("name", "?")]
            o[0] += 1
            o[1] += dur
    gpu.sort()
    host.sort()
    gaps_by_call = collections.defaultdict(float)
    gap_total, end, h = 0.0, None, 0
    for a, b in gpu:
        if end is not None and a - end > GAP_FLOOR_US:
            gap_total += a - end
            while h < len(host) and host[h][1] < end:
                h += 1
            covered = []
            for i in range(h, len(host)):
                s, t, name = host[i]
                if s > a:
                    break
                overlap = min(t, a) - max(s, end)
                if overlap > 0:
                    gaps_by_call[name] += overlap
                    covered.append((max(s, end), min(t, a)))
            gaps_by_call[HOST_CODE] += (a - end) - union_us(sorted(covered))
        end = b if end is None else max(end, b)
    per = 1e3 * steps  # microseconds in the trace -> milliseconds a step

    def by_time(table: dict) -> dict:
        ranked = sorted(table.items(), key=lambda kv: -kv[1][1])
        return {k: [v[0] / steps, v[1] / per] for k, v in ranked}

    return {
        "span_ms": (gpu[-1][1] - gpu[0][0]) / per if gpu else 0.0,
        "gpu_busy_ms": union_us(gpu) / per,
        "kernel_sum_ms": sum(b - a for a, b in gpu) / per,
        "gpu_ops": len(gpu) / steps,
        "gap_ms": gap_total / per,
        "gaps_by_call_ms": {
            k: v / per for k, v in sorted(gaps_by_call.items(), key=lambda kv: -kv[1])
        },
        "calls": by_time(calls),
        "kernels": by_time(kernels),
        "ops": by_time(ops),
    }


def child(config: str, workload: str) -> None:
    if diag_configs.uses_streampool(config):
        import streampool

        streampool.install()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench import schedules, workloads

    diag_steps.prepare(torch)
    schedule = schedules.build_schedule(workload)
    body = workloads.build(torch, workload)
    for params in schedule.steps[: schedule.warmup]:
        body(params)
    torch.cuda.synchronize()
    steps = schedule.steps[schedule.warmup :]
    walls, gpus = [], []
    for _ in range(ROUNDS):
        wall, _, gpu = diag_steps.timed_round(torch, body, steps)
        walls.append(wall)
        gpus.append(gpu)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for params in steps:
            body(params)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        found = read_trace(path, len(steps))
    found.update(config=config, workload=workload, wall_ms=statistics.median(walls),
                 event_ms=statistics.median(gpus), walls_ms=walls)
    out = os.environ.get("DIAG_PROFILE_OUT", ".")
    with open(os.path.join(out, f"profile-{workload}-{config}.json"), "w") as f:
        json.dump(found, f, indent=1)
    top_gaps = ", ".join(f"{k} {v:.3f}" for k, v in list(found["gaps_by_call_ms"].items())[:4])
    calls = list(found["calls"].items())[:5]
    top_calls = ", ".join(f"{k} {v[0]:.1f}x {v[1]:.3f}" for k, v in calls)
    print(f"PROFILE {workload} {config}: wall {found['wall_ms']:.3f} ms, events "
          f"{found['event_ms']:.3f} ms a step (unprofiled); profiled: GPU busy "
          f"{found['gpu_busy_ms']:.3f} ms, kernels {found['kernel_sum_ms']:.3f} ms in "
          f"{found['gpu_ops']:.0f} ops, idle {found['gap_ms']:.3f} ms, span "
          f"{found['span_ms']:.3f} ms a step; idle under: {top_gaps}; host calls (a step): "
          f"{top_calls}", flush=True)


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    for workload in sys.argv[1:] or ["vision_sizes"]:
        for config in diag_configs.chosen():
            diag_configs.run_child(__file__, config, [workload])
    return 0


if __name__ == "__main__":
    sys.exit(main())

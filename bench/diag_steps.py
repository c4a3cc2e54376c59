"""Where a workload step's time goes, per allocator (a GPU diagnostic: ``scripts/gpu-diag steps``).

``python3 bench/diag_steps.py [WORKLOAD...]`` (default: churn gpt2) runs the benchmark's workloads
(their schedules and steps, bench/schedules.py and bench/workloads.py) in a process per
configuration, pinned to the same CPUs, in ABBA order: native, streampool on the pool backend, on
the vmm backend. Each process times ROUNDS rounds (``DIAG_ROUNDS``, default 5) of the schedule's
timed steps and prints the median per step of: the wall time (the device synchronised at the end of
each round), the process's CPU time (every thread: autograd's backward runs on a thread of its
own), the GPU time between CUDA events, and the allocations PyTorch counted. For churn, the same
steps again with allocations only (``torch.empty`` without ``fill_``, the same window of live
tensors): what the allocator alone costs. ``STEPS_SYNC=1`` ends every step with
``torch.cuda.synchronize()``. A step whose wall time exceeds its GPU time waits on the CPU; the CPU
time counts the spin of a synchronisation too, so a CPU time equal to the wall does not by itself
say the step waits on the CPU. With the call-counting library (STREAMPOOL_LIBRARY pointing at a
build with ``--features call-counts``) the driver calls per process follow at exit, with the time
spent inside ``my_malloc`` and ``my_free`` (``CALLS my_malloc N total_us T``).

Invariant: a configuration's figures come only from its own process's timed rounds; nothing is
averaged across processes (the caller reads every line).
"""

import collections
import os
import statistics
import sys
import time

import diag_configs  # (run as a file: bench/ is on the path)

ROUNDS = int(os.environ.get("DIAG_ROUNDS", "5"))
# DIAG_WARM_LIBRARIES=1: cuBLAS's and cuDNN's handles are made before the workloads, as the
# benchmark does (their workspaces then lie below the workload's memory, not among it).
WARM_LIBRARIES = os.environ.get("DIAG_WARM_LIBRARIES") == "1"
if ROUNDS < 1:
    raise SystemExit(f"DIAG_ROUNDS={ROUNDS}: at least 1 round is timed")


def allocations(torch) -> float:
    """PyTorch's count of allocations so far (NaN where the statistics cannot be read)."""
    try:
        return float(torch.cuda.memory_stats().get("allocation.all.allocated", "nan"))
    except RuntimeError:
        return float("nan")


def timed_round(torch, body, steps) -> tuple:
    """One round of ``steps``, the device synchronised at its end: (wall, the process's CPU time,
    GPU time between CUDA events), milliseconds a step."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began, began_cpu = time.perf_counter(), time.process_time()
    start.record()
    for params in steps:
        body(params)
    end.record()
    torch.cuda.synchronize()
    per_step_ms = 1e3 / len(steps)
    return (
        (time.perf_counter() - began) * per_step_ms,
        (time.process_time() - began_cpu) * per_step_ms,
        start.elapsed_time(end) / len(steps),
    )


def prepare(torch) -> None:
    """What the process does before its workloads: the libraries' handles made first when
    DIAG_WARM_LIBRARIES=1, as the benchmark does; nothing otherwise."""
    if WARM_LIBRARIES:
        from bench import engine

        engine.warm_up_libraries(torch)


def measure(torch, config: str, workload: str, name: str, body, schedule) -> None:
    if os.environ.get("STEPS_SYNC") == "1":
        # Each step ends with torch.cuda.synchronize(), as the benchmark's timed steps do: where
        # a release threshold applies at a synchronisation, it applies every step.
        unsynced = body

        def body(params) -> None:
            unsynced(params)
            torch.cuda.synchronize()

    for params in schedule.steps[: schedule.warmup]:
        body(params)
    torch.cuda.synchronize()
    steps = schedule.steps[schedule.warmup :]
    walls, cpus, gpus, counts = [], [], [], []
    for _ in range(ROUNDS):
        allocated = allocations(torch)
        wall, cpu, gpu = timed_round(torch, body, steps)
        walls.append(wall)
        cpus.append(cpu)
        gpus.append(gpu)
        counts.append((allocations(torch) - allocated) / len(steps))
    print(f"STEPS {workload} {config} {name}: wall {statistics.median(walls):.3f} ms, cpu "
          f"{statistics.median(cpus):.3f} ms, gpu {statistics.median(gpus):.3f} ms a step, "
          f"{statistics.median(counts):.0f} allocations a step (rounds' wall "
          f"{min(walls):.3f}-{max(walls):.3f})", flush=True)


def child(config: str, workloads_named) -> None:
    if diag_configs.uses_streampool(config):
        import streampool

        streampool.install()
    import torch

    from bench import schedules, workloads

    prepare(torch)
    for workload in workloads_named:
        schedule = schedules.build_schedule(workload)
        measure(torch, config, workload, "step", workloads.build(torch, workload), schedule)
        if workload != "churn":
            continue
        window: collections.deque = collections.deque()

        def alloc_only(sizes) -> None:
            for size in sizes:
                window.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
                if len(window) > schedules.CHURN_WINDOW:
                    window.popleft()

        measure(torch, config, workload, "alloc_only", alloc_only, schedule)
        window.clear()


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:] or ["churn", "gpt2"])
        return 0
    named = sys.argv[1:] or ["churn", "gpt2"]
    configs = list(diag_configs.chosen())
    for config in configs + configs[::-1]:
        diag_configs.run_child(__file__, config, named)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How a workload's peak device memory divides: what the allocator reserves, and what the device
holds outside any allocator (kernel modules loaded on first use, library workspaces), per
allocator (a GPU diagnostic: ``scripts/gpu-diag floor``).

Each configuration runs in a process of its own, set up as the benchmark's workers are
(bench/engine.py: the libraries warmed up first), then runs the workload's memory pass as
bench/worker.py does (every step followed by a synchronisation and a reading of free memory) and
prints, at the step where device memory peaked: the drop of free memory since the start, the
allocator's reserved bytes, what of them it reserved since the start, the live peak, and the rest
(drop - reserved since the start): memory no allocator setting can move. The start is after the
set-up, whose library workspaces stay live (cuBLAS's, one per handle and stream, made through
the allocator: 32 MiB on Hopper): reserved before the start, they are in neither the drop nor
the live peak (counted from the start too), so they are left out of the reserved bytes compared.

Invariant: every figure of a line is read in the same process, at the same step; the drop, the
reserved bytes since the start and the live peak are all counted from one start.
"""

import os
import subprocess
import sys

MIB = 2**20
CONFIGS = {
    "native": ("native", "native", {}),
    "expandable": ("native", "native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "pool": ("streampool", "pluggable", {"STREAMPOOL_BACKEND": "pool"}),
    "vmm": ("streampool", "pluggable", {"STREAMPOOL_BACKEND": "vmm"}),
}


def child(config: str, workload: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.engine import CudaEngine

    base, backend, _ = CONFIGS[config]
    engine = CudaEngine(base, backend)
    engine.set_up()
    torch = engine.torch
    start = engine.memory()["free_bytes"]
    reserved_start = torch.cuda.memory_reserved()
    live = engine.track_live()
    step, schedule = engine.build(workload)
    engine.synchronize()
    best = (-1, 0, 0, 0)
    for index, params in enumerate(schedule.steps):
        step(params)
        engine.synchronize()
        drop = start - engine.memory()["free_bytes"]
        if drop > best[0]:
            best = (drop, torch.cuda.memory_reserved(), index, live() or 0)
    drop, reserved, index, live_bytes = best
    grown = reserved - reserved_start
    print(
        f"FLOOR {workload} {config}: peak drop {drop / MIB:.1f} MiB at step {index}, reserved "
        f"{reserved / MIB:.1f} ({reserved_start / MIB:.1f} before the start, "
        f"{grown / MIB:.1f} since), outside the allocator {(drop - grown) / MIB:.1f}, live peak "
        f"{live_bytes / MIB:.1f}",
        flush=True,
    )


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    workloads = sys.argv[1:] or ["multistream", "bert"]
    for workload in workloads:
        for config, (_, _, env) in CONFIGS.items():
            argv = [sys.executable, os.path.abspath(__file__), "--child", config, workload]
            subprocess.run(argv, env=dict(os.environ, **env), check=False, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())

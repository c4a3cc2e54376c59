"""What the vmm backend does to the driver during the benchmark's own sequence (a GPU
diagnostic: ``scripts/gpu-diag sequence``): one worker process, set up as the benchmark's
(bench/engine.py), runs a workload's memory pass (bench/worker.py's ``prepare``: every step, a
synchronisation after each, then ``empty_cache()``), then blocks of its timed steps with an idle
gap between them, as a paired run alternates with its reference; after each block it prints the
block's time and what streampool's counters moved in it (pages mapped and unmapped, handles
created and released, GPU-side waits, idle releases).

``python3 -m bench.diag_sequence WORKLOAD [--blocks N] [--steps-per-block K] [--gap-s S]``
(STREAMPOOL_BACKEND and the other variables as for any run; the library installed as the
benchmark's workers install it).

Invariant: every figure of a block line is read in the same process, around that block alone.
"""

import argparse
import sys
import time
from typing import Dict, List, Optional, Sequence

COUNTERS = (
    "num_maps",
    "num_unmaps",
    "num_mem_creates",
    "num_mem_releases",
    "num_stream_waits",
    "num_idle_releases",
)


def counters() -> Dict[str, int]:
    import streampool

    stats = streampool.memory_stats()
    return {k: stats[k] for k in COUNTERS}


def run(workload: str, blocks: int, per_block: int, gap_s: float) -> List[str]:
    from bench.engine import CudaEngine
    from bench.worker import Worker

    engine = CudaEngine("streampool", "pluggable")
    engine.set_up()
    worker = Worker(engine)
    lines = []
    before = counters()
    prepared = worker.prepare(workload)
    after = counters()
    lines.append(
        f"SEQUENCE {workload} memory pass: "
        + " ".join(f"{k}={after[k] - before[k]}" for k in COUNTERS)
        + f" peak_device_mib={(prepared['peak_device_bytes'] or 0) >> 20}"
    )
    for b in range(blocks):
        time.sleep(gap_s)
        before = counters()
        answer = worker.block(b * per_block, per_block)
        after = counters()
        lines.append(
            f"SEQUENCE {workload} block {b}: {answer['elapsed_s'] * 1e3:.1f} ms "
            + " ".join(f"{k}={after[k] - before[k]}" for k in COUNTERS)
        )
        print(lines[-1], flush=True)
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.diag_sequence", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("workload")
    parser.add_argument("--blocks", type=int, default=20, help="timed blocks (20)")
    parser.add_argument("--steps-per-block", type=int, default=7, help="steps a block (7)")
    parser.add_argument("--gap-s", type=float, default=0.15, help="idle before each block (0.15)")
    args = parser.parse_args(argv)
    if args.blocks < 1 or args.steps_per_block < 1 or args.gap_s < 0:
        parser.error("--blocks and --steps-per-block: at least 1; --gap-s: not negative")
    lines = run(args.workload, args.blocks, args.steps_per_block, args.gap_s)
    print(lines[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

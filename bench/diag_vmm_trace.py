"""A workload's allocation trace captured under streampool, with the pages the GPU run mapped
(a GPU diagnostic: ``scripts/gpu-diag vmmtrace``): whether the replay, given the very sequence a
run made, maps what that run mapped.

``python3 -m bench.diag_vmm_trace WORKLOAD --out DIR [--rounds N]`` (STREAMPOOL_BACKEND and the
other variables as for any run) runs the workload's schedule — its warm-up steps, then its
timed steps ``--rounds`` times (default 5), with no synchronisation between the warm-up and the
end of the last round (``--sync-each-step``: one after every step, as the benchmark's memory pass
makes them); cuBLAS's and cuDNN's handles made first, as the benchmark makes them,
unless ``--no-library-warm-up`` — with streampool's timeline recording (``streampool.record_history``), and
writes ``DIR/WORKLOAD-streampool.trace.gz`` in the replay's format 2 (bench/trace_capture.py:
the same sentinels mark step ends and synchronisations). Each step's maps and unmaps as the
timeline recorded them are written as headers (``gpu_maps_per_step``, ``gpu_unmaps_per_step``;
with ``--sync-each-step`` also ``gpu_reserved_mib_per_step``, the reserved bytes after each step's
synchronisation, and the peak of them on the printed line)
and summed on the printed line (``VMMTRACE ...``), the warm-up apart; the replay of the trace
(``cargo bench --bench replay -- --config vmm:STREAMPOOL_BACKEND=vmm DIR/...``) prints its own.

Invariant: the trace holds every sentinel made (else the timeline's ring overflowed: an error),
and the map counts come from the same timeline as the trace.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import schedules as s
from .trace_capture import WARMED_UP, Converter, Recorder, warm_up_libraries, write_trace

# The replay's header for a capture whose libraries allocated inside it (bench/replay/trace.rs).
IN_TRACE = "libraries not warmed up: their allocations are in the trace"

MAX_ENTRIES = 4_000_000


class CountingConverter(Converter):
    """A converter that also counts the timeline's maps and unmaps of each step."""

    def __init__(self, markers):
        super().__init__(markers)
        self.maps: List[int] = [0]
        self.unmaps: List[int] = [0]

    def entry(self, e: Dict[str, Any]) -> None:
        action = e["action"]
        if action == "segment_map":
            self.maps[-1] += 1
        elif action == "segment_unmap":
            self.unmaps[-1] += 1
        before = self.next_marker
        super().entry(e)
        if self.next_marker > before and self.markers[before][0] == "x":
            self.maps.append(0)
            self.unmaps.append(0)


def capture(
    workload: str, out_dir: Path, rounds: int, warm_up: bool = True, sync_each_step: bool = False
) -> Dict[str, Any]:
    import streampool

    streampool.install()
    import torch

    from . import workloads

    torch.cuda.init()
    if warm_up:
        warm_up_libraries(torch)
    recorder = Recorder(torch)
    streampool.record_history(True, max_entries=MAX_ENTRIES)
    recorder.install()
    recorder.mark("begin")
    step = workloads.build(torch, workload)
    schedule = s.build_schedule(workload)
    torch.cuda.synchronize()
    timed = list(schedule.steps[schedule.warmup :])
    reserved_mib: List[int] = []
    for params in list(schedule.steps[: schedule.warmup]) + timed * rounds:
        step(params)
        if sync_each_step:
            torch.cuda.synchronize()
            reserved_mib.append(torch.cuda.memory_reserved() >> 20)
        recorder.mark("x")
    torch.cuda.synchronize()
    snapshot = streampool.snapshot()
    streampool.record_history(False)
    converter = CountingConverter(recorder.markers)
    for e in snapshot["device_traces"][torch.cuda.current_device()]:
        converter.entry(e)
    converter.finish()
    warmup = schedule.warmup
    summary: Dict[str, Any] = {
        "workload": workload,
        "rounds": rounds,
        "warmup_maps": sum(converter.maps[:warmup]),
        "timed_maps": sum(converter.maps[warmup:]),
        "timed_unmaps": sum(converter.unmaps[warmup:]),
        "timed_steps": len(timed) * rounds,
    }
    if reserved_mib:
        summary["peak_reserved_mib"] = max(reserved_mib)
    reserved = ["gpu_reserved_mib_per_step " + " ".join(map(str, reserved_mib))] if reserved_mib else []
    skipped = [f"skipped {n} {what}" for what, n in sorted(converter.skipped.items())]
    headers = [
        f"workload {workload}",
        "source captured under streampool (python3 -m bench.diag_vmm_trace)",
        WARMED_UP if warm_up else IN_TRACE,
        f"STREAMPOOL_BACKEND {os.environ.get('STREAMPOOL_BACKEND', '')}",
        f"schedule_steps {warmup + len(timed) * rounds} (warm-up {warmup})",
        f"torch {torch.__version__}",
        f"device {torch.cuda.get_device_name()}",
        f"device_total_bytes {torch.cuda.mem_get_info()[1]}",
        "gpu_maps_per_step " + " ".join(map(str, converter.maps)),
        "gpu_unmaps_per_step " + " ".join(map(str, converter.unmaps)),
    ] + reserved + skipped
    cold = ("" if warm_up else "-cold-libraries") + ("-synced" if sync_each_step else "")
    path = out_dir / f"{workload}-streampool{cold}.trace.gz"
    times_us = converter.relative_times_us()
    summary.update(write_trace(path, headers, converter.events, times_us))
    summary["path"] = str(path)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.diag_vmm_trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=[w for w in s.TIMED_WORKLOADS if w not in s.EMPTY_SIZES_BYTES])
    parser.add_argument("--out", type=Path, required=True, help="folder for the trace")
    parser.add_argument("--rounds", type=int, default=5, help="times the timed steps run (5)")
    parser.add_argument(
        "--no-library-warm-up",
        action="store_true",
        help="do not make cuBLAS's and cuDNN's handles first (a program's first matmul does)",
    )
    parser.add_argument(
        "--sync-each-step",
        action="store_true",
        help="synchronise after every step, as the memory pass does; record reserved bytes",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    summary = capture(
        args.workload, args.out, args.rounds, not args.no_library_warm_up, args.sync_each_step
    )
    print("VMMTRACE " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

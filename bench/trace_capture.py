"""Allocation traces of the benchmark's workloads, for ``cargo bench --bench replay``
(bench/replay.rs; format and use in docs/replay.md).

On a machine with a GPU, each workload in a process of its own, under PyTorch's native
allocator::

    python3 -m bench.trace_capture --workloads vision_sizes,compiled,checkerboard \\
        --out bench/traces

runs the workload as the benchmark's memory pass does (bench/worker.py: the libraries' handles
created first, then every step followed by a synchronisation and a reading of device memory)
with ``torch.cuda.memory._record_memory_history`` on, and converts the snapshot's
``device_traces`` into the trace format, each event with the host's time (format 2: the
history's ``time_us``, microseconds since the first event). What the allocator's history does
not show — record_stream, wait_stream, synchronisations, step ends — is marked in it by a
*sentinel*: a SENTINEL_BYTES allocation made right after the call, whose address the wrappers
note beside the call's arguments; the converter turns each sentinel back into its event (a
synchronisation's time is when it returned) and drops it. ``checkerboard`` is defined here: fill
CHECKER_FILL of free memory with CHECKER_BYTES tensors, free every other one, then allocate one
tensor of CHECKER_BIG of the card. Without a GPU, ``--generate`` writes churn's trace straight
from its schedule, and checkerboard's for the H200 the others were captured on (format 1: no
times).

Invariant: a written trace is consistent (every ``f``/``r`` names a live allocation), holds
every sentinel the wrappers made, in order — a missing one (the history's ring buffer overflowed)
is an error, never a silently shortened trace — and has a time on every event or on none (if
the history has none). torch is imported only in the child.
"""

import argparse
import collections
import gzip
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from . import schedules as s
from .trace_generated import (  # noqa: F401 (the generated traces, used here and by the tests)
    CARD_FREE_BYTES,
    CARD_TOTAL_BYTES,
    CHECKER_BIG,
    CHECKER_BYTES,
    CHECKER_FILL,
    Event,
    checkerboard_events,
    checkerboard_headers,
    checkerboard_sizes,
    churn_events,
    churn_headers,
)

FORMAT = "streampool allocation trace, format 1 (cargo bench --bench replay)"
FORMAT_TIMED = "streampool allocation trace, format 2 (cargo bench --bench replay)"
# The replay reads this header as: cuBLAS's workspaces were made before recording (as the
# benchmark makes them before it measures), not by the workload (bench/replay/trace.rs).
WARMED_UP = "libraries warmed up before recording"
CAPTURABLE = (
    "churn",
    "multistream",
    "gpt2",
    "resnet50",
    "bert",
    "llama_decode",
    "vision_sizes",
    "compiled",
    "checkerboard",
)
# An odd size no workload allocates (uint8 tensors of exactly this many elements): a sentinel.
SENTINEL_BYTES = 1021
MAX_HISTORY_ENTRIES = 20_000_000
CHILD_MARKER = "TRACE "

# A sentinel the wrappers noted: (kind, sentinel address, first argument, second argument).
Marker = Tuple[str, int, Optional[int], Optional[int]]


def format_event(event: Event, time_us: Optional[int] = None) -> str:
    text = " ".join(str(field) for field in event)
    return text if time_us is None else f"{text} @{time_us}"


def summarize(events: Iterable[Event]) -> Dict[str, int]:
    """Event, allocation and step counts and the peak of live bytes (sum of live BYTES)."""
    live: Dict[int, int] = {}
    live_bytes = peak = allocations = steps = count = 0
    for event in events:
        count += 1
        if event[0] == "a":
            live[event[1]] = event[2]
            live_bytes += event[2]
            peak = max(peak, live_bytes)
            allocations += 1
        elif event[0] == "f":
            live_bytes -= live.pop(event[1])
        elif event[0] == "x":
            steps += 1
    return {"events": count, "allocations": allocations, "steps": steps, "peak_live_bytes": peak}


def write_trace(
    path: Path,
    headers: Sequence[str],
    events: Sequence[Event],
    times_us: Optional[Sequence[int]] = None,
) -> Dict[str, int]:
    """Writes ``events`` under ``headers`` (gzip, reproducible: no file timestamp), each with its
    time from ``times_us`` if given (format 2); returns the summary, also written as a header."""
    if times_us is not None and len(times_us) != len(events):
        raise ValueError(f"{len(times_us)} times for {len(events)} events")
    summary = summarize(events)
    lines = [f"# {FORMAT if times_us is None else FORMAT_TIMED}"] + [f"# {h}" for h in headers]
    lines += [f"# {key} {value}" for key, value in summary.items()]
    times: Sequence[Optional[int]] = [None] * len(events) if times_us is None else times_us
    lines += [format_event(e, t) for e, t in zip(events, times)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as out:
            out.write(("\n".join(lines) + "\n").encode())
    return summary



class Converter:
    """Snapshot trace entries -> events. Streams become small integers in order of first
    appearance, the legacy default stream (0) staying 0."""

    def __init__(self, markers: Sequence[Marker]):
        self.markers = list(markers)
        self.next_marker = 0
        self.events: List[Event] = []
        # The history's time of each event (microseconds), while every entry has one.
        self.times_us: Optional[List[int]] = []
        self.live: Dict[int, int] = {}  # address -> allocation ID
        self.sentinels: set = set()
        self.streams: Dict[int, int] = {0: 0}
        self.next_id = 1
        self.skipped = collections.Counter()

    def stream(self, raw: int) -> int:
        if raw not in self.streams:
            self.streams[raw] = max(self.streams.values()) + 1
        return self.streams[raw]

    def add(self, event: Event, e: Dict[str, Any]) -> None:
        """Appends ``event``, at the time of history entry ``e``."""
        self.events.append(event)
        time_us = e.get("time_us")
        if self.times_us is not None:
            if time_us is None:
                self.times_us = None  # a history without times: format 1
            else:
                self.times_us.append(int(time_us))

    def entry(self, e: Dict[str, Any]) -> None:
        action, addr = e["action"], e.get("addr")
        if action == "alloc":
            if self.is_next_marker(e):
                self.sentinels.add(addr)
                self.marker_event(self.markers[self.next_marker], e)
                self.next_marker += 1
                return
            if addr in self.live:
                raise ValueError(f"address {addr:#x} allocated twice without a free")
            self.live[addr] = self.next_id
            self.add(("a", self.next_id, int(e["size"]), self.stream(e["stream"])), e)
            self.next_id += 1
        elif action == "free_requested":
            if addr in self.sentinels:
                self.sentinels.discard(addr)
            elif addr in self.live:
                self.add(("f", self.live.pop(addr)), e)
            else:
                self.skipped["frees of allocations made before recording"] += 1
        # free_completed, segment_*, snapshot, oom: not the program's requests

    def is_next_marker(self, e: Dict[str, Any]) -> bool:
        if self.next_marker >= len(self.markers) or e["size"] != SENTINEL_BYTES:
            return False
        return self.markers[self.next_marker][1] == e["addr"]

    def marker_event(self, marker: Marker, e: Dict[str, Any]) -> None:
        kind, _, first, second = marker
        if kind == "r":
            if first in self.live:
                self.add(("r", self.live[first], self.stream(second)), e)
            else:
                self.skipped["record_stream of memory not allocated while recording"] += 1
        elif kind == "w":
            self.add(("w", self.stream(first), self.stream(second)), e)
        elif kind in ("s", "x"):
            self.add((kind,), e)
        elif kind != "begin":
            raise ValueError(f"unknown marker kind {kind!r}")

    def relative_times_us(self) -> Optional[List[int]]:
        """The events' times in microseconds since the first, never going back (None if the
        history had no times)."""
        if not self.times_us:
            return None
        start, last, out = self.times_us[0], 0, []
        for t in self.times_us:
            last = max(last, t - start)
            out.append(last)
        return out

    def finish(self) -> List[Event]:
        if self.next_marker != len(self.markers):
            raise ValueError(
                f"the allocator's history holds {self.next_marker} of the {len(self.markers)} "
                "markers: it lost entries (its ring buffer overflowed, or recording started "
                "late); raise the recording's max_entries (MAX_HISTORY_ENTRIES here, "
                "MAX_ENTRIES in bench/diag_vmm_trace.py)"
            )
        return self.events


def convert(snapshot: Dict[str, Any], markers: Sequence[Marker], device: int) -> Converter:
    """The events of ``snapshot["device_traces"][device]`` (torch.cuda.memory._snapshot())."""
    converter = Converter(markers)
    for e in snapshot["device_traces"][device]:
        converter.entry(e)
    converter.finish()
    return converter


class Recorder:
    """Wraps record_stream, wait_stream and synchronize so that each leaves a sentinel."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.markers: List[Marker] = []

    def mark(self, kind: str, first: Optional[int] = None, second: Optional[int] = None) -> None:
        torch = self.torch
        sentinel = torch.empty(SENTINEL_BYTES, dtype=torch.uint8, device="cuda")
        self.markers.append((kind, sentinel.data_ptr(), first, second))
        del sentinel

    def install(self) -> None:
        torch, mark = self.torch, self.mark
        record_stream, wait_stream = torch.Tensor.record_stream, torch.cuda.Stream.wait_stream
        synchronize = torch.cuda.synchronize

        def recorded_record_stream(tensor: Any, stream: Any) -> None:
            record_stream(tensor, stream)
            mark("r", tensor.untyped_storage().data_ptr(), stream.cuda_stream)

        def recorded_wait_stream(stream: Any, other: Any) -> None:
            wait_stream(stream, other)
            mark("w", stream.cuda_stream, other.cuda_stream)

        def recorded_synchronize(device: Any = None) -> None:
            synchronize(device)
            mark("s")

        torch.Tensor.record_stream = recorded_record_stream
        torch.cuda.Stream.wait_stream = recorded_wait_stream
        torch.cuda.synchronize = recorded_synchronize


def build_checkerboard(torch: Any) -> Tuple[Any, s.Schedule]:
    """checkerboard (module notes): one step, sized from the card's memory at the start."""
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    count, big_bytes = checkerboard_sizes(free_bytes, total_bytes)

    def step(_: Any) -> None:
        tensors: List[Any] = [
            torch.empty(CHECKER_BYTES, dtype=torch.uint8, device="cuda") for _ in range(count)
        ]
        for i in range(0, count, 2):
            tensors[i] = None
        big = torch.empty(big_bytes, dtype=torch.uint8, device="cuda")
        del big
        tensors.clear()

    return step, s.Schedule(steps=(None,), warmup=0, units=(1,), unit="step")


def warm_up_libraries(torch: Any) -> None:
    """The benchmark's warm-up before it measures (bench/engine.py): cuBLAS's and cuDNN's
    handles and workspaces exist before recording, as they do before a memory pass."""
    from .engine import warm_up_libraries as benchmark_warm_up

    benchmark_warm_up(torch)


class MemoryReads:
    """What the memory pass does after every step (bench/worker.py, CudaEngine.memory): free
    device memory, and this process's use from NVML where the driver lists it — so that the
    host's time between steps in a trace is the memory pass's."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.nvml: Any = None
        self.device: Any = None
        try:
            from . import nvml

            self.nvml = nvml.Nvml.open()
            if self.nvml is not None:
                uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
                self.device = self.nvml.handle(uuid)
        except (ImportError, OSError, AttributeError):
            self.nvml = None

    def read(self) -> None:
        if self.nvml is not None and self.device is not None:
            self.nvml.process_used_bytes(self.device)
        self.torch.cuda.mem_get_info()


def capture(workload: str, out_dir: Path) -> Dict[str, Any]:
    """Runs ``workload``'s schedule as the memory pass does, under the native allocator with
    its history recorded, and writes ``out_dir/<workload>.trace.gz`` (in this process: call it
    in a child)."""
    import torch

    from . import workloads

    started_s = time.perf_counter()
    torch.cuda.init()
    warm_up_libraries(torch)
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    reads = MemoryReads(torch)
    recorder = Recorder(torch)
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=MAX_HISTORY_ENTRIES
    )
    recorder.install()
    recorder.mark("begin")
    if workload == "checkerboard":
        step, schedule = build_checkerboard(torch)
    else:
        step = workloads.build(torch, workload)
        schedule = s.build_schedule(workload)
    torch.cuda.synchronize()
    for params in schedule.steps:
        step(params)
        torch.cuda.synchronize()
        reads.read()
        recorder.mark("x")
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    converter = convert(snapshot, recorder.markers, torch.cuda.current_device())
    headers = [
        f"workload {workload}",
        "source captured under PyTorch's native allocator (python3 -m bench.trace_capture)",
        WARMED_UP,
        f"schedule_steps {len(schedule.steps)} (warm-up {schedule.warmup})",
        f"torch {torch.__version__}",
        f"device {torch.cuda.get_device_name()}",
        f"device_total_bytes {total_bytes}",
        f"device_free_bytes_at_start {free_bytes}",
        f"PYTORCH_CUDA_ALLOC_CONF {os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}",
    ] + [f"skipped {n} {what}" for what, n in sorted(converter.skipped.items())]
    path = out_dir / f"{workload}.trace.gz"
    times_us = converter.relative_times_us()
    summary = write_trace(path, headers, converter.events, times_us)
    summary.update(
        workload=workload,
        path=str(path),
        streams=len(converter.streams),
        timed=times_us is not None,
        native_peak_allocated_bytes=torch.cuda.max_memory_allocated(),
        capture_s=round(time.perf_counter() - started_s, 1),
    )
    if workload == "churn":
        summary["matches_generated"] = converter.events == churn_events()
    return summary


def summary_line(summary: Dict[str, Any]) -> str:
    shown = ("workload", "events", "peak_live_bytes")
    extra = " ".join(f"{k}={v}" for k, v in summary.items() if k not in shown)
    mib = summary["peak_live_bytes"] / 2**20
    return (
        f"{summary['workload']}: {summary['events']} events, peak live {mib:.1f} MiB "
        f"({summary['peak_live_bytes']} B); {extra}"
    )


def run_children(names: Sequence[str], out_dir: Path, timeout_s: float, budget_s: float) -> int:
    """Each workload in a fresh process, within ``timeout_s`` each and ``budget_s`` in all; a
    failure costs only its own trace."""
    failed = 0
    deadline_s = time.monotonic() + budget_s
    for name in names:
        left_s = min(timeout_s, deadline_s - time.monotonic())
        if left_s < 5:
            print(f"{name}: FAILED: not started, the {budget_s:.0f} s budget is spent", flush=True)
            failed += 1
            continue
        command = [sys.executable, "-m", "bench.trace_capture", "--child", name]
        command += ["--out", str(out_dir)]
        started_s = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=left_s)
        except subprocess.TimeoutExpired:
            print(f"{name}: FAILED: no trace within {left_s:.0f} s", flush=True)
            failed += 1
            continue
        lines = [l for l in done.stdout.splitlines() if l.startswith(CHILD_MARKER)]
        if done.returncode != 0 or not lines:
            tail = "\n    ".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            print(f"{name}: FAILED (exit {done.returncode}):\n    {tail}", flush=True)
            failed += 1
            continue
        took_s = time.monotonic() - started_s
        print(f"{lines[-1][len(CHILD_MARKER) :]} process_s={took_s:.1f}", flush=True)
    print(f"traces: {len(names) - failed} of {len(names)} written to {out_dir}", flush=True)
    return 1 if failed else 0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.trace_capture", description=__doc__.split("\n\n")[0]
    )
    accepted = ", ".join(CAPTURABLE)
    parser.add_argument(
        "--workloads", default=",".join(CAPTURABLE), help=f"comma-separated, of: {accepted}"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/traces"), help="trace directory")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per workload (120)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="for all workloads (270)")
    parser.add_argument(
        "--generate",
        action="store_true",
        help="write churn's trace from its schedule, and checkerboard's for an H200 (no GPU)",
    )
    parser.add_argument("--child", choices=CAPTURABLE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in CAPTURABLE]
    if unknown or not names:
        parser.error(f"--workloads {args.workloads!r}: unknown {unknown}; accepted: {accepted}")
    for flag, value in (("--timeout-s", args.timeout_s), ("--budget-s", args.budget_s)):
        if not value > 0:
            parser.error(f"{flag} {value}: not a positive number of seconds")
    args.names = names
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(CHILD_MARKER + summary_line(capture(args.child, args.out)), flush=True)
        return 0
    if args.generate:
        summary = write_trace(args.out / "churn.trace.gz", churn_headers(), churn_events())
        print(summary_line({"workload": "churn", **summary}))
        board = checkerboard_events(CARD_FREE_BYTES, CARD_TOTAL_BYTES)
        summary = write_trace(args.out / "checkerboard.trace.gz", checkerboard_headers(), board)
        print(summary_line({"workload": "checkerboard", **summary}))
        return 0
    return run_children(args.names, args.out, args.timeout_s, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())

"""Allocation traces of the benchmark's workloads, for ``cargo bench --bench replay``
(bench/replay.rs; format and use in docs/replay.md).

On a machine with a GPU, each workload in a process of its own, under PyTorch's native allocator::

    python3 -m bench.trace_capture --workloads churn,multistream,gpt2,resnet50,bert,llama_decode \\
        --out bench/traces

records every allocation and free with ``torch.cuda.memory._record_memory_history`` while the
workload runs its warm-up and timed steps (bench.schedules), and converts the snapshot's
``device_traces`` into the trace format. What the allocator's history does not show —
record_stream, wait_stream, synchronisations, step ends — is marked in it by a *sentinel*: a
SENTINEL_BYTES allocation made right after the call, whose address the wrappers note beside
the call's arguments; the converter turns each sentinel back into its event and drops it.
Without a GPU, ``--generate`` writes churn's trace straight from its schedule.

Invariant: a written trace is consistent (every ``f``/``r`` names a live allocation) and holds
every sentinel the wrappers made, in order — a missing one (the history's ring buffer overflowed)
is an error, never a silently shortened trace. torch is imported only in the child.
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

FORMAT = "streampool allocation trace, format 1 (cargo bench --bench replay)"
CAPTURABLE = ("churn", "multistream", "gpt2", "resnet50", "bert", "llama_decode")
# An odd size no workload allocates (uint8 tensors of exactly this many elements): a sentinel.
SENTINEL_BYTES = 1021
MAX_HISTORY_ENTRIES = 20_000_000
CHILD_MARKER = "TRACE "

# ("a", id, bytes, stream), ("f", id), ("r", id, stream), ("w", stream, other), ("s",), ("x",)
Event = Tuple[Any, ...]
# A sentinel the wrappers noted: (kind, sentinel address, first argument, second argument).
Marker = Tuple[str, int, Optional[int], Optional[int]]


def format_event(event: Event) -> str:
    return " ".join(str(field) for field in event)


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


def write_trace(path: Path, headers: Sequence[str], events: Sequence[Event]) -> Dict[str, int]:
    """Writes ``events`` under ``headers`` (gzip, reproducible: no timestamp); returns the
    summary, which is also written as a header."""
    summary = summarize(events)
    lines = [f"# {FORMAT}"] + [f"# {h}" for h in headers]
    lines += [f"# {key} {value}" for key, value in summary.items()]
    lines += [format_event(e) for e in events]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as out:
            out.write(("\n".join(lines) + "\n").encode())
    return summary


def churn_events() -> List[Event]:
    """churn's trace from its schedule alone, as a capture records it (bench.workloads.
    build_churn; the capture's loop: a synchronisation, then each step followed by one)."""
    schedule = s.build_schedule("churn")
    events: List[Event] = [("s",)]
    window: collections.deque = collections.deque()
    next_id = 1
    for sizes_bytes in schedule.steps:
        for size_bytes in sizes_bytes:
            events.append(("a", next_id, size_bytes, 0))
            window.append(next_id)
            next_id += 1
            if len(window) > s.CHURN_WINDOW:
                events.append(("f", window.popleft()))
        events += [("s",), ("x",)]
    return events


def churn_headers() -> List[str]:
    schedule = s.build_schedule("churn")
    return [
        "workload churn",
        "source generated from bench/schedules.py without a GPU "
        "(python3 -m bench.trace_capture --generate)",
        f"schedule_steps {len(schedule.steps)} (warm-up {schedule.warmup})",
    ]


class Converter:
    """Snapshot trace entries -> events. Streams become small integers in order of first
    appearance, the legacy default stream (0) staying 0."""

    def __init__(self, markers: Sequence[Marker]):
        self.markers = list(markers)
        self.next_marker = 0
        self.events: List[Event] = []
        self.live: Dict[int, int] = {}  # address -> allocation ID
        self.sentinels: set = set()
        self.streams: Dict[int, int] = {0: 0}
        self.next_id = 1
        self.skipped = collections.Counter()

    def stream(self, raw: int) -> int:
        if raw not in self.streams:
            self.streams[raw] = max(self.streams.values()) + 1
        return self.streams[raw]

    def entry(self, e: Dict[str, Any]) -> None:
        action, addr = e["action"], e.get("addr")
        if action == "alloc":
            if self.is_next_marker(e):
                self.sentinels.add(addr)
                self.marker_event(self.markers[self.next_marker])
                self.next_marker += 1
                return
            if addr in self.live:
                raise ValueError(f"address {addr:#x} allocated twice without a free")
            self.live[addr] = self.next_id
            self.events.append(("a", self.next_id, int(e["size"]), self.stream(e["stream"])))
            self.next_id += 1
        elif action == "free_requested":
            if addr in self.sentinels:
                self.sentinels.discard(addr)
            elif addr in self.live:
                self.events.append(("f", self.live.pop(addr)))
            else:
                self.skipped["frees of allocations made before recording"] += 1
        # free_completed, segment_*, snapshot, oom: not the program's requests

    def is_next_marker(self, e: Dict[str, Any]) -> bool:
        if self.next_marker >= len(self.markers) or e["size"] != SENTINEL_BYTES:
            return False
        return self.markers[self.next_marker][1] == e["addr"]

    def marker_event(self, marker: Marker) -> None:
        kind, _, first, second = marker
        if kind == "r":
            if first in self.live:
                self.events.append(("r", self.live[first], self.stream(second)))
            else:
                self.skipped["record_stream of memory not allocated while recording"] += 1
        elif kind == "w":
            self.events.append(("w", self.stream(first), self.stream(second)))
        elif kind in ("s", "x"):
            self.events.append((kind,))
        elif kind != "begin":
            raise ValueError(f"unknown marker kind {kind!r}")

    def finish(self) -> List[Event]:
        if self.next_marker != len(self.markers):
            raise ValueError(
                f"the allocator's history holds {self.next_marker} of the {len(self.markers)} "
                f"markers: it lost entries (its ring buffer of max_entries={MAX_HISTORY_ENTRIES} "
                "overflowed, or recording started late); raise MAX_HISTORY_ENTRIES"
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


def capture(workload: str, out_dir: Path) -> Dict[str, Any]:
    """Runs ``workload``'s schedule under the native allocator with its history recorded and
    writes ``out_dir/<workload>.trace.gz`` (in this process: call it in a child)."""
    import torch

    from . import workloads

    started_s = time.perf_counter()
    torch.cuda.init()
    recorder = Recorder(torch)
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=MAX_HISTORY_ENTRIES
    )
    recorder.install()
    recorder.mark("begin")
    # No library warm-up: cuBLAS's workspace, allocated at the first product, is in the trace.
    step = workloads.build(torch, workload)
    schedule = s.build_schedule(workload)
    torch.cuda.synchronize()
    for params in schedule.steps:
        step(params)
        torch.cuda.synchronize()
        recorder.mark("x")
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    converter = convert(snapshot, recorder.markers, torch.cuda.current_device())
    headers = [
        f"workload {workload}",
        "source captured under PyTorch's native allocator (python3 -m bench.trace_capture)",
        f"schedule_steps {len(schedule.steps)} (warm-up {schedule.warmup})",
        f"torch {torch.__version__}",
        f"device {torch.cuda.get_device_name()}",
        f"PYTORCH_CUDA_ALLOC_CONF {os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}",
    ] + [f"skipped {n} {what}" for what, n in sorted(converter.skipped.items())]
    path = out_dir / f"{workload}.trace.gz"
    summary = write_trace(path, headers, converter.events)
    summary.update(
        workload=workload,
        path=str(path),
        streams=len(converter.streams),
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
        "--generate", action="store_true", help="write churn's trace from its schedule (no GPU)"
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
        return 0
    return run_children(args.names, args.out, args.timeout_s, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())

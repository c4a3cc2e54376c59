"""A trace of the benchmark's own sequence, made from a workload's trace for the replay
(``cargo bench --bench replay``): the trace as captured (the memory pass where it was captured
as one — every step followed by a synchronisation: bench/trace_capture.py's, or
bench/diag_vmm_trace.py's with ``--sync-each-step``), then ``empty_cache()`` (the worker's
settle), then blocks of timed steps
as a paired run times them — ``--steps-per-block`` consecutive timed steps, cycling through
them, no synchronisation between the steps of a block, one at its end, and an idle gap before
each block (bench/runner.py, bench/worker.py). Used to see whether a setting makes the allocator
map or move pages in every block, which a replay of one pass through the steps cannot show
(the GPU did: bench/diag_sequence.py).

``python3 -m bench.trace_sequence IN OUT [--blocks N] [--steps-per-block K] [--gap-us G]``

The input must carry timestamps (format 2). Every step of the input counts as warm-up in the
output, so the replay's "timed" figures are those of the blocks, the memory mapped again after
``empty_cache()`` included. A copied step's allocations get new IDs; its frees and record_streams of an allocation made in
an earlier copy follow that copy's ID. What a block leaves allocated (a step keeping its output
until the next) is freed at the block's end, before its synchronisation, and counted in the
header ``sequence_block_end_frees``.

Invariant: the output is a valid trace (every ID allocated once while live, freed only while
live), its timestamps never decrease, and its first part is the input's events unchanged.
"""

import argparse
import gzip
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

Event = Tuple[str, List[str], int]  # (kind, fields, time in µs)


def read(path: Path) -> Tuple[List[str], List[Event]]:
    """The headers (without '#') and the events of a format-2 trace."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    headers, events = [], []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            headers.append(line[1:].strip())
        elif line:
            words = line.split()
            if not words[-1].startswith("@"):
                raise ValueError(f"{path}: an event without a timestamp: {line!r}")
            events.append((words[0], words[1:-1], int(words[-1][1:])))
    return headers, events


def steps_of(events: List[Event]) -> List[List[Event]]:
    """The events of each step, each ending with its ``x``; events after the last are left out."""
    steps, current = [], []
    for e in events:
        current.append(e)
        if e[0] == "x":
            steps.append(current)
            current = []
    return steps


def warmup_of(headers: List[str]) -> Tuple[int, int]:
    """(schedule steps, warm-up steps) from the ``schedule_steps N (warm-up W)`` header."""
    for h in headers:
        if h.startswith("schedule_steps "):
            n = int(h.split()[1])
            w = int(h.split("warm-up ")[1].rstrip(")")) if "warm-up " in h else 0
            return n, w
    raise ValueError("the trace has no schedule_steps header")


def build(
    headers: List[str], events: List[Event], blocks: int, per_block: int, gap_us: int
) -> Tuple[List[str], List[Event]]:
    steps = steps_of(events)
    _, warmup = warmup_of(headers)
    timed = steps[warmup:]
    if not timed:
        raise ValueError("the trace has no timed steps")
    out = list(events)
    now = out[-1][2] if out else 0
    for kind in ("s", "e", "s"):
        out.append((kind, [], now))
    next_id = 1 + max((int(f[0]) for k, f, _ in events if k == "a"), default=0)
    current: Dict[str, str] = {}  # original ID -> the ID of its latest copy
    live: Dict[str, None] = {}  # IDs of copies still allocated, in order
    forced = 0
    for b in range(blocks):
        now += gap_us
        for i in range(per_block):
            step = timed[(b * per_block + i) % len(timed)]
            base = step[0][2]
            began = now
            for kind, fields, t in step:
                at = began + (t - base)
                if kind == "s":
                    continue
                if kind == "a":
                    new = str(next_id)
                    next_id += 1
                    current[fields[0]] = new
                    live[new] = None
                    out.append(("a", [new] + fields[1:], at))
                elif kind in ("f", "r"):
                    mine = current.get(fields[0])
                    if mine is None or mine not in live:
                        continue  # made before the blocks, or freed at a block's end
                    if kind == "f":
                        del live[mine]
                    out.append((kind, [mine] + fields[1:], at))
                else:
                    out.append((kind, fields, at))
                now = max(now, at)
        for left in list(live):
            out.append(("f", [left], now))
            forced += 1
        live.clear()
        out.append(("s", [], now))
    n, warm = len(steps), len(steps)
    new_headers = []
    for h in headers:
        if h.startswith("schedule_steps "):
            h = f"schedule_steps {n + blocks * per_block} (warm-up {warm})"
        elif h.split(" ")[0] in ("events", "allocations", "steps", "peak_live_bytes"):
            continue
        new_headers.append(h)
    new_headers += [
        f"sequence the trace, empty_cache(), then {blocks} blocks of {per_block} timed steps "
        f"{gap_us} us apart (python3 -m bench.trace_sequence)",
        f"sequence_block_end_frees {forced}",
    ]
    return new_headers, out


def write(path: Path, headers: List[str], events: List[Event]) -> None:
    lines = ["# " + h for h in headers]
    lines += [" ".join([k] + f + [f"@{t}"]) for k, f, t in events]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.trace_sequence", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("trace", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--blocks", type=int, default=20, help="blocks after the pass (20)")
    parser.add_argument("--steps-per-block", type=int, default=7, help="steps a block (7)")
    parser.add_argument("--gap-us", type=int, default=150_000, help="idle before a block (150000)")
    args = parser.parse_args(argv)
    if args.blocks < 1 or args.steps_per_block < 1 or args.gap_us < 0:
        parser.error("--blocks and --steps-per-block: at least 1; --gap-us: not negative")
    headers, events = read(args.trace)
    headers, events = build(headers, events, args.blocks, args.steps_per_block, args.gap_us)
    write(args.out, headers, events)
    print(f"{args.out}: {len(events)} events, {headers[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

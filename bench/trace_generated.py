"""The traces written without a GPU (``python3 -m bench.trace_capture --generate``): churn's
from its schedule (bench/schedules.py), as a capture under the native allocator records it, and
the near-full checkerboard's for the H200 the other traces were captured on.

Invariant: each is a function of the schedule or the card's figures alone; a committed trace
equals what these write (bench/tests/test_trace_capture.py).
"""

import collections
from typing import Any, List, Tuple

from . import schedules as s

# ("a", id, bytes, stream), ("f", id), ("r", id, stream), ("w", stream, other), ("s",), ("x",)
Event = Tuple[Any, ...]
# checkerboard: near-full memory with holes that no request of the last size fits.
CHECKER_BYTES = 256 * 1024**2
CHECKER_FILL = 0.88  # of the free memory at the start
CHECKER_BIG = 0.40  # of the card


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


# The H200 the other traces were captured on: its memory, and what was free when a capture began
# (the libraries' handles and workspaces made first; bench/traces/bert.trace.gz's headers).
CARD_TOTAL_BYTES = 150_109_880_320
CARD_FREE_BYTES = 149_347_762_176


def checkerboard_sizes(free_bytes: int, total_bytes: int) -> Tuple[int, int]:
    """checkerboard's (number of CHECKER_BYTES tensors, bytes of the large one) on a card of
    ``total_bytes`` with ``free_bytes`` free at the start (build_checkerboard)."""
    count = int(free_bytes * CHECKER_FILL) // CHECKER_BYTES
    return count, int(total_bytes * CHECKER_BIG) // 2**21 * 2**21


def checkerboard_events(free_bytes: int, total_bytes: int) -> List[Event]:
    """checkerboard's trace (build_checkerboard's step, as a capture records it: a
    synchronisation, the step, a synchronisation) on a card of ``total_bytes`` with
    ``free_bytes`` free at the start: the tensors, every other one freed, the large one
    allocated and freed, the rest freed as the list's clear() drops them, last first."""
    count, big_bytes = checkerboard_sizes(free_bytes, total_bytes)
    events: List[Event] = [("s",)]
    events += [("a", i, CHECKER_BYTES, 0) for i in range(1, count + 1)]
    events += [("f", i) for i in range(1, count + 1, 2)]
    big = count + 1
    events += [("a", big, big_bytes, 0), ("f", big)]
    # list.clear() drops a list's items from its end.
    events += [("f", i) for i in reversed(range(2, count + 1, 2))]
    return events + [("s",), ("x",)]


def checkerboard_headers() -> List[str]:
    return [
        "workload checkerboard",
        "source generated from bench/trace_capture.py without a GPU "
        "(python3 -m bench.trace_capture --generate), for an NVIDIA H200",
        f"device_total_bytes {CARD_TOTAL_BYTES}",
        f"device_free_bytes_at_start {CARD_FREE_BYTES}",
        "schedule_steps 1 (warm-up 0)",
    ]


def churn_headers() -> List[str]:
    schedule = s.build_schedule("churn")
    return [
        "workload churn",
        "source generated from bench/schedules.py without a GPU "
        "(python3 -m bench.trace_capture --generate)",
        f"schedule_steps {len(schedule.steps)} (warm-up {schedule.warmup})",
    ]

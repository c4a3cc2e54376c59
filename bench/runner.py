"""The parent's repeats: one fresh child process per configuration per repeat, order rotated.

Invariant: within a repeat every configuration runs once, in its own process, one after the
other (never two children at once), in the order ``stats.rotated(configs, repeat)``; a
configuration that was skipped or failed to set up is not started again (its first result stands
for every repeat); a new repeat starts only if the time budget leaves room for one as long as the
last one took. This file runs processes and reads their messages; it computes no statistics.
"""

import collections
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from . import protocol
from .stats import rotated


class ChildOutcome(NamedTuple):
    """What a child process left: stdout, the tail of stderr, why it failed (or None), and how
    long it ran (seconds)."""

    stdout: str
    stderr_tail: str
    failure: Optional[str]
    wall_s: float = 0.0


def run_process(
    command: List[str], env: Dict[str, str], timeout_s: float, label: str
) -> ChildOutcome:
    """Run ``command``, echoing its stderr (prefixed with ``label``) to ours as it comes."""
    tail: collections.deque = collections.deque(maxlen=30)
    started_s = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+", errors="replace") as stdout_file:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout_file,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )

        def pump() -> None:
            for line in process.stderr:
                tail.append(line)
                sys.stderr.write(f"    {label}| {line}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            returncode = process.wait(timeout=timeout_s)
            failure = None if returncode == 0 else f"child exited with status {returncode}"
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            failure = f"child timed out after {timeout_s:g} s"
        reader.join()
        stdout_file.seek(0)
        wall_s = time.perf_counter() - started_s
        return ChildOutcome(stdout_file.read(), "".join(tail), failure, wall_s)


def parse_child_output(outcome: ChildOutcome, workloads: Sequence[str]) -> Dict[str, Any]:
    """``{"status", "info", "workloads": {name: record}, "wall_s"}`` from a child's messages;
    every workload without a record gets ``{"error": why}``."""
    info: Dict[str, Any] = {}
    records: Dict[str, Dict[str, Any]] = {}
    status, reason = "ok", None
    for message in protocol.messages(outcome.stdout):
        if message["kind"] == "info":
            info = message["info"]
        elif message["kind"] == "workload":
            records[message["workload"]] = message["record"]
        elif message["kind"] in ("skipped", "setup_error"):
            status, reason = message["kind"], message["reason"]
    if status == "skipped":
        reason = f"skipped: {reason}"
    if outcome.failure is not None and status == "ok":
        status, reason = "failed", protocol.tail(f"{outcome.failure}: {outcome.stderr_tail}")
    missing = {
        name: {"error": reason or "the child printed no result for it"}
        for name in workloads
        if name not in records
    }
    result = {
        "status": status,
        "info": info,
        "workloads": {**records, **missing},
        "wall_s": round(outcome.wall_s, 2),
    }
    if outcome.failure is not None:
        result["process_failure"] = outcome.failure
    return result


# (configuration, its workloads, progress label) -> the child's parsed result
ChildRunner = Callable[[str, List[str], str], Dict[str, Any]]
SETTLED_STATUSES = ("skipped", "setup_error")


class Repeats(NamedTuple):
    """``runs[r]``: ``{config: child result}`` of repeat r; ``orders[r]``: the order it ran them;
    ``stop_reason``: why fewer repeats ran than asked (None when all ran)."""

    runs: List[Dict[str, Dict[str, Any]]]
    orders: List[List[str]]
    stop_reason: Optional[str]


def run_repeats(
    configs: Sequence[str],
    workloads_by_config: Dict[str, List[str]],
    repeats: int,
    runner: ChildRunner,
    time_budget_s: float = 0.0,
    started_s: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
    on_repeat: Optional[Callable[[Repeats], None]] = None,
) -> Repeats:
    """Run ``repeats`` interleaved repeats of ``configs`` (see the module's invariant).
    ``time_budget_s`` (0: none) counts from ``started_s`` (default: now) on ``clock``;
    ``on_repeat`` sees the results so far after every repeat (to save them)."""
    started_s = clock() if started_s is None else started_s
    runs: List[Dict[str, Dict[str, Any]]] = []
    orders: List[List[str]] = []
    settled: Dict[str, Dict[str, Any]] = {}
    last_repeat_s = 0.0  # the last, not the longest: the first repeat pays for cold caches
    for repeat in range(repeats):
        elapsed_s = clock() - started_s
        if repeat > 0 and time_budget_s > 0 and elapsed_s + last_repeat_s > time_budget_s:
            reason = (
                f"time budget: {repeat} of {repeats} repeats ran in {elapsed_s:.0f} s; "
                f"another would take about {last_repeat_s:.0f} s of the {time_budget_s:.0f} s"
            )
            protocol.progress(f"stopping: {reason}")
            return Repeats(runs, orders, reason)
        repeat_started_s = clock()
        order = rotated(configs, repeat)
        run: Dict[str, Dict[str, Any]] = {}
        for config in order:
            if config in settled:
                run[config] = settled[config]
                continue
            label = f"[{repeat + 1}/{repeats}] {config}"
            protocol.progress(f"{label}: running {', '.join(workloads_by_config[config])}")
            run[config] = runner(config, workloads_by_config[config], label)
            protocol.progress(
                f"{label}: {run[config]['status']} in {run[config].get('wall_s', 0):.1f} s"
            )
            if run[config]["status"] in SETTLED_STATUSES:
                settled[config] = run[config]
        runs.append(run)
        orders.append(order)
        last_repeat_s = clock() - repeat_started_s
        if on_repeat is not None:
            on_repeat(Repeats(runs, orders, None))
    return Repeats(runs, orders, None)

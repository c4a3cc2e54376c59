"""A worker process: one configuration's allocator, set up once, driven by the parent over a pipe.

``python3 -m bench.worker --base streampool --backend pluggable [--engine MODULE:CLASS]``
(the parent starts it; the allocator's settings come in the environment). The engine does what
needs torch (engine.py: CudaEngine); the CPU tests give a stand-in (tests/standin.py).

Commands (one JSON line each on stdin, one ``reply`` each on stdout; EOF ends the worker):
- ``prepare {workload}``: build the workload and run its whole schedule once, synchronising and
  reading memory after every step (the memory pass; the parent runs it with every other worker
  idle), then settle (return cached memory) keeping the workload's model. Its peak device
  memory is the most the process's device memory grew above the start, plus what the allocator
  held idle at the start (reserved beyond its live bytes, where the engine can say:
  ``idle_reserved_bytes``): memory held through the workload that its growth does not show —
  expandable segments map cuBLAS's 32 MiB workspace, made before the start, in two 20 MiB
  granules and hold 8 MiB of them free;
- ``block {first, count, warm}``: run timed steps first .. first+count-1 (cycling through the
  schedule's timed steps), synchronising after each; the block's host time and the idle gap since
  this worker's previous block (not for warm-up blocks), and what may explain a difference
  between two processes (``DIAGNOSTICS``): the GPU time of its steps (CUDA events recorded
  around each step, where the engine has ``block_timer``; not in warm-up blocks), the CPU time
  of this (the launching) thread and the part of it in the kernel, its context switches, the
  CPU it was on at the block's end, and the time the hypervisor took from the CPUs it could run
  on (steal, /proc/stat). With BENCH_LAUNCH_CPU (isolation.py's ``launch``) the launching thread
  runs the block on that CPU and goes back to the worker's own after it, and with
  BENCH_LAUNCH_AUTOGRAD (``autograd``) PyTorch's autograd threads with it (``threads_moved``:
  how many);
- ``settle``: return cached memory; ``drop``: forget the workload, then settle.
Set-up (``main``): the worker pins itself to BENCH_CPUS (affinity.apply) before the engine
imports anything, so every thread started later runs there too; its ``ready`` facts say where
it runs and how it was set up (``setup_facts``), for the parent to check that every worker of a
run was set up alike.
Invariant: a command that raises answers with the end of its traceback and the worker goes on;
only the timed section of ``block`` is between the two clock readings it reports (the CUDA events
recorded around each step inside it, a microsecond or two each, are the same in every worker).
"""

import argparse
import hashlib
import importlib
import json
import os
import resource
import sys
import time
from typing import Any, Callable, Dict, Optional, Sequence, Set, Tuple

from . import affinity, protocol

# Variables that differ between workers on purpose (their configuration, their CPUs, their
# process set, the padding that evens their sizes: BENCH_PAD*) or that only name files: left out
# of the set-up fingerprint.
OWN_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "BENCH_CONFIG", "BENCH_CPUS",
                 "BENCH_PROCESS", "BENCH_STANDIN", "PYTHONPATH", "STREAMPOOL_LIBRARY")
OWN_PREFIXES = ("STREAMPOOL_", "BENCH_PAD")
# Personality flag of a process started without address-space randomisation (setarch -R).
ADDR_NO_RANDOMIZE = 0x0040000


def aslr_off() -> Optional[bool]:
    """Whether this process runs without address-space randomisation (None: unknown)."""
    try:
        return bool(int(open("/proc/self/personality").read(), 16) & ADDR_NO_RANDOMIZE)
    except (OSError, ValueError):
        return None


def setup_facts(environ: Dict[str, str], extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Where this worker runs and how it was set up: its CPUs, the hash seed, address-space
    randomisation, and ``fingerprint``, a digest of everything that should be the same in every
    worker (the environment but OWN_VARIABLES and OWN_PREFIXES, and ``extra``: the engine's
    settings)."""
    shared = {k: v for k, v in environ.items()
              if k not in OWN_VARIABLES and not k.startswith(OWN_PREFIXES)}
    text = json.dumps({"environment": shared, **(extra or {})}, sort_keys=True, default=str)
    return {
        "cpus": affinity.format_cpulist(os.sched_getaffinity(0)),
        "hash_seed": environ.get("PYTHONHASHSEED"),
        "aslr_off": aslr_off(),
        "fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16],
        **(extra or {}),
    }


# The fields of a block's answer that diagnose a difference between processes (None: unknown).
DIAGNOSTICS = ("gpu_s", "cpu_s", "system_s", "steal_s", "cpu", "nvcsw", "nivcsw",
               "threads_moved")
# Field 39 of /proc/<pid>/task/<tid>/stat: the CPU the thread last ran on.
STAT_PROCESSOR_FIELD = 39


def current_cpu(paths: Sequence[str] = ("/proc/thread-self/stat", "/proc/self/stat")
                ) -> Optional[int]:
    """The CPU this thread last ran on (field 39 of its stat line; None where unreadable)."""
    for path in paths:
        try:
            with open(path) as stat:
                text = stat.read()
        except OSError:
            continue
        # Field 2, the command name, may hold spaces and parentheses: count from the last ')'.
        fields = text.rpartition(")")[2].split()
        try:
            return int(fields[STAT_PROCESSOR_FIELD - 3])
        except (IndexError, ValueError):
            return None
    return None


def gpu_seconds(timer: Any) -> Optional[float]:
    """The block's GPU time from its timer (None without one, or where the events cannot say:
    a diagnostic never fails the measurement)."""
    if timer is None:
        return None
    try:
        return timer.seconds()
    except Exception:  # e.g. an event the driver could not time
        return None


def context_switches() -> Tuple[Optional[int], Optional[int], Optional[float]]:
    """(voluntary, involuntary) context switches of this thread so far, and its CPU time in the
    kernel (None: unknown)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return None, None, None
    usage = resource.getrusage(who)
    return usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_stime


# Field 9 of a ``cpuN`` line of /proc/stat (counting the name as 1): steal, in clock ticks.
STEAL_FIELD = 8


def steal_seconds(cpus, path: str = "/proc/stat") -> Optional[float]:
    """The time the hypervisor has taken from ``cpus`` so far (None: unreadable)."""
    wanted = {f"cpu{c}" for c in cpus}
    try:
        with open(path) as stat:
            ticks = sum(int(line.split()[STEAL_FIELD]) for line in stat
                        if line.split(maxsplit=1)[0] in wanted)
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Skipped(Exception):
    """The configuration cannot run on this machine (its package is not installed)."""


def _delta(start: Optional[int], now: Optional[int], sign: int) -> Optional[int]:
    return None if start is None or now is None else sign * (now - start)


class Worker:
    """The state between commands: the prepared workload and when the last block ended."""

    def __init__(self, engine: Any, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 launch_cpus: Optional[Sequence[int]] = None, move_autograd: bool = False
                 ) -> None:
        self.engine = engine
        self.launch_cpus = launch_cpus  # where this thread runs its blocks (None: its own CPUs)
        self.move_autograd = move_autograd  # and PyTorch's autograd threads with it
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.workload: Optional[str] = None
        self.step: Any = None
        self.timed: tuple = ()
        self.units: tuple = ()
        self.last_end_s: Optional[float] = None

    def prepare(self, workload: str) -> Dict[str, Any]:
        """The memory pass (module docstring); peak figures are above the state at its start."""
        self.drop()
        engine = self.engine
        idle_reserved = getattr(engine, "idle_reserved_bytes", None)
        idle_at_start = idle_reserved() if idle_reserved is not None else None
        start = engine.memory()
        peak_live = engine.track_live()
        built_s = self.clock()
        step, schedule = engine.build(workload)
        self.workload, self.step = workload, step
        build_s = self.clock() - built_s
        self.timed = tuple(schedule.steps[schedule.warmup :])
        self.units = tuple(schedule.units[schedule.warmup :])
        peak_free_drop = peak_process = None
        timed_s = 0.0
        engine.synchronize()
        for index, params in enumerate(schedule.steps):
            began_s = self.clock()
            step(params)
            engine.synchronize()
            if index >= schedule.warmup:
                timed_s += self.clock() - began_s
            now = engine.memory()
            drop = _delta(start["free_bytes"], now["free_bytes"], -1)
            grown = _delta(start["process_bytes"], now["process_bytes"], 1)
            if drop is not None:
                peak_free_drop = max(drop, peak_free_drop or 0)
            if grown is not None:
                peak_process = max(grown, peak_process or 0)
        live_bytes = peak_live()
        engine.settle()
        settled = engine.memory()
        source = "nvml" if peak_process is not None else "mem_get_info"
        grown = peak_process if source == "nvml" else peak_free_drop
        return {
            "build_s": build_s,
            "step_s": timed_s / max(1, len(self.timed)),
            "timed_steps": len(self.timed),
            "units_per_cycle": sum(self.units),
            "unit": schedule.unit,
            "memory_source": source,
            "peak_device_bytes": None if grown is None else grown + max(0, idle_at_start or 0),
            "peak_grown_bytes": grown,
            "idle_reserved_at_start_bytes": idle_at_start,
            "peak_free_drop_bytes": peak_free_drop,
            "peak_process_bytes": peak_process,
            "peak_live_bytes": live_bytes,
            "settled_bytes": _delta(start["process_bytes"], settled["process_bytes"], 1)
            if source == "nvml"
            else _delta(start["free_bytes"], settled["free_bytes"], -1),
        }

    def block(self, first: int, count: int, warm: bool = False) -> Dict[str, Any]:
        if self.step is None:
            raise RuntimeError("block before prepare")
        if count < 1:
            raise ValueError(f"block of {count} steps")
        n = len(self.timed)
        indices = [(first + i) % n for i in range(count)]
        make_timer = None if warm else getattr(self.engine, "block_timer", None)
        timer = make_timer(count) if make_timer is not None else None
        moved: Dict[int, Set[int]] = {}
        try:
            if self.launch_cpus:  # this thread, and autograd's if asked (module docstring)
                tids = [0] + (affinity.autograd_threads() if self.move_autograd else [])
                moved = affinity.move_threads(tids, self.launch_cpus)
            on = os.sched_getaffinity(0)
            self.engine.synchronize()
            stolen = steal_seconds(on)
            switches = context_switches()
            cpu_began_s = self.cpu_clock()
            began_s = self.clock()
            for k, i in enumerate(indices):
                if timer is not None:
                    timer.start(k)
                self.step(self.timed[i])
                if timer is not None:
                    timer.stop(k)
                self.engine.synchronize()
            ended_s = self.clock()
            cpu_s = self.cpu_clock() - cpu_began_s
            now = context_switches()
            stolen_now = steal_seconds(on)
            cpu = current_cpu()
        finally:
            affinity.restore_threads(moved)
        idle_s = None if warm or self.last_end_s is None else began_s - self.last_end_s
        self.last_end_s = ended_s
        return {
            "elapsed_s": ended_s - began_s,
            "idle_before_s": idle_s,
            "units": sum(self.units[i] for i in indices),
            "steps": [indices[0], count],
            "gpu_s": gpu_seconds(timer),
            "cpu_s": cpu_s,
            "system_s": None if now[2] is None else now[2] - switches[2],
            "steal_s": None if stolen is None or stolen_now is None else stolen_now - stolen,
            "cpu": cpu,
            "nvcsw": _delta(switches[0], now[0], 1),
            "nivcsw": _delta(switches[1], now[1], 1),
            "threads_moved": sum(tid != 0 for tid in moved),  # autograd's, besides this one
        }

    def settle(self) -> Dict[str, Any]:
        self.engine.settle()
        self.last_end_s = None
        return self.engine.memory()

    def drop(self) -> Dict[str, Any]:
        self.step, self.workload, self.timed, self.units = None, None, (), ()
        forget = getattr(self.engine, "forget", None)
        if forget is not None:  # what the engine keeps for a workload besides its step
            forget()
        return self.settle()

    def handle(self, request: Dict[str, Any]) -> Dict[str, Any]:
        command = request.get("command")
        if command == "prepare":
            return self.prepare(request["workload"])
        if command == "block":
            return self.block(request["first"], request["count"], bool(request.get("warm")))
        if command == "settle":
            return self.settle()
        if command == "drop":
            return self.drop()
        raise ValueError(f"unknown command {command!r}")


def serve(engine: Any, lines, emit=protocol.emit, preload: Sequence[str] = (),
          launch_cpus: Optional[Sequence[int]] = None, move_autograd: bool = False) -> int:
    """Set up (and import ``preload``), say ready, answer every command on ``lines`` until
    they end (each block launched from ``launch_cpus``: None, its own CPUs)."""
    try:
        info = engine.set_up()
        for module in preload:
            importlib.import_module(module)
        info = {**info, "setup": setup_facts(dict(os.environ), info.get("settings"))}
    except Skipped as exc:
        emit("skipped", reason=str(exc))
        return 0
    except Exception as exc:  # reported to the parent, which goes on with other configurations
        emit("setup_error", reason=protocol.error_text(exc))
        return 0
    emit("ready", info=info)
    worker = Worker(engine, launch_cpus=launch_cpus, move_autograd=move_autograd)
    for line in lines:
        if not line.strip():
            continue
        try:
            result = worker.handle(json.loads(line))
        except Exception as exc:  # the parent records it; this worker may serve other workloads
            sys.stderr.write(protocol.error_text(exc) + "\n")
            emit("reply", ok=False, error=protocol.error_text(exc))
            continue
        emit("reply", ok=True, result=result)
    return 0


def load_engine(spec: str, base: str, backend: str) -> Any:
    """``MODULE:CLASS`` -> CLASS(base, backend)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)(base, backend)


def command(
    base: str, backend: str, engine: Optional[str] = None, preload: Sequence[str] = ()
) -> list:
    """argv of a worker that installs ``base`` (expecting ``backend``) and imports ``preload``
    while it starts (the workers' imports overlap; the memory passes run one at a time)."""
    argv = [sys.executable, "-m", "bench.worker", "--base", base, "--backend", backend]
    argv += ["--engine", engine] if engine else []
    return argv + (["--preload", ",".join(preload)] if preload else [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.worker")
    parser.add_argument("--base", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--engine", default="bench.engine:CudaEngine")
    parser.add_argument("--preload", default="", help="modules to import after set-up")
    options = parser.parse_args(argv)
    affinity.apply(dict(os.environ))  # before the engine imports torch (module docstring)
    engine = load_engine(options.engine, options.base, options.backend)
    preload = [m for m in options.preload.split(",") if m]
    return serve(engine, sys.stdin, preload=preload,
                 launch_cpus=affinity.launch_cpus(dict(os.environ)),
                 move_autograd=affinity.moves_autograd(dict(os.environ)))


if __name__ == "__main__":
    sys.exit(main())

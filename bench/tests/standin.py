"""A worker engine without torch, for the CPU tests: real worker processes, real pipes, stand-in
steps. ``python3 -m bench.worker --engine bench.tests.standin:StandinEngine ...``.

A step sleeps ``params`` milliseconds times the configuration's slowdown; memory is a
counter: a workload's step holds STEP_BYTES × the configuration's memory factor until settle.
Behaviour per configuration (named by BENCH_CONFIG, which the parent sets) comes from
BENCH_STANDIN: ``config:slow=1.5``, ``config:process_slow=1.3/1.0/0.8`` (the slowdown of process
set 0, 1, 2, ..., in turn: BENCH_PROCESS), ``config:cold=12`` (the first 12 steps after a settle
take 3 times as long: a cold start), ``config:idle_cold=50`` (with ``cold``: so do the
``cold`` steps after an idle of over 50 ms since its last step, as memory given back by an idle
release is mapped again), ``config:memory=2``, ``config:fail=WORKLOAD`` (raise at
build), ``config:fail=setup``, ``config:crash=WORKLOAD`` (the process exits in the memory pass),
``config:exit=WORKLOAD`` (it exits in its first timed block), ``config:raise=WORKLOAD`` (a block
raises), separated by ``;``; ``*:slow=4`` applies to every configuration (a later item wins).
Invariant: the same inputs give the same memory figures on every run (only times vary); a
workload's live bytes go when the worker drops its step function.
"""

import os
import time
import weakref
from typing import Any, Dict

from bench import schedules as s

TOTAL_BYTES = 80 * 2**30
LIVE_BYTES = 100 * 2**20
STEP_BYTES = 20 * 2**20
STEPS_MS = (1.0, 2.0, 1.5, 1.0, 2.5, 1.0, 2.0, 1.5)  # two warm-up steps, six timed


def behaviour(config: str, environ: Dict[str, str]) -> Dict[str, str]:
    """The ``key=value`` settings of ``config`` in BENCH_STANDIN."""
    settings = {}
    for item in environ.get("BENCH_STANDIN", "").split(";"):
        name, _, setting = item.strip().partition(":")
        if name in (config, "*") and "=" in setting:
            key, _, value = setting.partition("=")
            settings[key] = value
    return settings


class StandinEngine:
    def __init__(self, base: str, backend: str) -> None:
        self.config = os.environ.get("BENCH_CONFIG", base)
        self.settings = behaviour(self.config, dict(os.environ))
        self.slow = float(self.settings.get("slow", "1"))
        by_process = self.settings.get("process_slow")
        if by_process:
            factors = [float(f) for f in by_process.split("/")]
            self.slow *= factors[int(os.environ.get("BENCH_PROCESS", "0")) % len(factors)]
        self.factor = float(self.settings.get("memory", "1"))
        self.cold = int(self.settings.get("cold", "0"))
        self.cold_left = 0
        idle_cold_ms = self.settings.get("idle_cold")
        self.idle_cold_s = float(idle_cold_ms) / 1000 if idle_cold_ms else None
        self.last_step_s = None
        self.live = 0
        self.held = 0
        self.peak_live = 0
        self.blocks = 0

    def set_up(self) -> Dict[str, Any]:
        if self.settings.get("fail") == "setup":
            raise RuntimeError(f"{self.config}: set-up failed on purpose")
        return {
            "device": "stand-in",
            "device_total_bytes": TOTAL_BYTES,
            "pid": os.getpid(),
            "baseline_process_bytes": None,
            "torch": "none",
            "config": self.config,
        }

    def build(self, workload: str):
        if self.settings.get("crash") == workload:
            os._exit(4)
        if self.settings.get("fail") == workload:
            raise RuntimeError(f"stand-in {self.config} cannot build {workload}\n"
                               "torch.OutOfMemoryError: CUDA out of memory (stand-in)")
        self.live = LIVE_BYTES
        self.held = max(self.held, LIVE_BYTES)
        steps = 0

        def step(milliseconds: float) -> None:
            nonlocal steps
            steps += 1
            if steps > len(STEPS_MS):  # a timed block, after the memory pass
                if self.settings.get("exit") == workload:
                    os._exit(3)
                if self.settings.get("raise") == workload:
                    raise RuntimeError(f"stand-in {self.config} step failed in {workload}")
            self.held = max(self.held, int(LIVE_BYTES + STEP_BYTES * self.factor))
            self.peak_live = max(self.peak_live, LIVE_BYTES + STEP_BYTES)
            now_s = time.monotonic()
            if self.idle_cold_s and self.last_step_s and now_s - self.last_step_s > self.idle_cold_s:
                self.cold_left = self.cold
            cold = 3.0 if self.cold_left > 0 else 1.0
            self.cold_left = max(0, self.cold_left - 1)
            time.sleep(milliseconds * self.slow * cold / 1000)  # a sleep: robust to a busy machine
            self.last_step_s = time.monotonic()

        weakref.finalize(step, self._forget)  # the worker dropped the workload: its model goes
        schedule = s.Schedule(STEPS_MS, 2, (1,) * len(STEPS_MS), "step")
        return step, schedule

    def _forget(self) -> None:
        self.live = 0

    def synchronize(self) -> None:
        pass

    def memory(self) -> Dict[str, Any]:
        return {"free_bytes": TOTAL_BYTES - self.held, "process_bytes": None}

    def track_live(self):
        self.peak_live = self.live
        start = self.live
        if self.config.startswith("native") and not self.settings.get("memory"):
            return lambda: self.peak_live - start
        return lambda: None

    def settle(self) -> None:
        self.held = self.live
        self.cold_left = self.cold

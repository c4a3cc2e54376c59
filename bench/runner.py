"""The parent's run of workloads over one set of long-lived workers (one process per
configuration), one workload at a time; a run makes several such sets (cli.py), one after the
other, so that the process is a random effect of the statistics (stats.py).

For each workload: every worker builds it and runs its memory pass *alone* (the others idle,
settled), native first; then the pairs (reference, config) are packed into stages that fit the
card and keep idle gaps short (plan.py); each stage warms its workers up and runs ``pairs``
rounds in ABBA order, both blocks of a pair on the same steps; then every worker drops the
workload.
Warm-up (``settle``, the rule): every worker active in a stage, the ones active in the stage
before too, runs the timed steps once untimed, then untimed blocks of the same steps until two
blocks in a row are each not faster than the one before by more than SETTLE_TOLERANCE (its time
has stopped falling: caches refilled, clocks up), at least 3 and at most SETTLE_MAX_BLOCKS; the
workers take their blocks in turn, and one that has settled goes on running blocks (uncounted)
until all have, so that none idles while another warms up. (A worker carried over from the
stage before idles while the new ones warm up: with an idle release it gives its memory back
and, warmed no more, paid for mapping it again in its first timed blocks.) Without ``settle``:
every active worker runs the timed steps once, every stage.
Every worker starts with arguments and environment of the same count and bytes
(isolation.even_environments).
Invariant: a configuration that fails (set-up, memory pass, a block, a worker that exits) is
recorded with the end of its error and never silently dropped; a pair is recorded only when both
of its blocks ran; nothing here computes statistics.
"""

import math
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import isolation, plan, protocol, worker
from .configs import NATIVE, resolve, worker_environment
from .workers import CommandFailed, Worker, WorkerGone, close_all

READY_TIMEOUT_S = 300.0
PREPARE_TIMEOUT_S = 300.0
BLOCK_TIMEOUT_S = 120.0
SETTLE_TOLERANCE = 0.02
SETTLE_MAX_BLOCKS = 8


class Options(NamedTuple):
    pairs: int  # rounds of a stage: pairs per configuration in this process set
    block_s: float
    idle_release_s: Optional[float]
    settle: bool = True


def settled(times_s: Sequence[float]) -> bool:
    """The warm-up rule (module docstring) on the times of the blocks of the same steps."""
    return len(times_s) >= 3 and all(times_s[i] >= times_s[i - 1] * (1 - SETTLE_TOLERANCE)
                                     for i in (-1, -2))


class Sampler:
    """GPU clocks, power, throttle reasons and per-process memory after each block (NVML, in
    the parent); every reading None without NVML."""

    def __init__(self, nvml: Any = None, device: Any = None) -> None:
        self.nvml, self.device = nvml, device

    def after_block(self, pid: int) -> Tuple[Optional[Dict[str, Any]], Optional[int]]:
        if self.nvml is None or self.device is None:
            return None, None
        used = self.nvml.process_used_bytes(self.device)
        return self.nvml.sample(self.device), None if used is None else used.get(pid)


class Runner:
    """Workers by configuration name, and the ones that can no longer run (with why)."""

    def __init__(
        self,
        names: Sequence[str],
        variants: Dict[str, Dict[str, str]],
        environ: Dict[str, str],
        options: Options,
        sampler: Optional[Sampler] = None,
        engine: Optional[str] = None,
        log: Callable[[str], None] = protocol.progress,
        preload: Sequence[str] = (),
        worker_env: Optional[Dict[str, Dict[str, str]]] = None,
        launcher: Sequence[str] = (),
    ) -> None:
        """Start a worker per name (``preload``: modules each imports while starting;
        ``worker_env``: variables added for each; ``launcher``: what each command runs under)."""
        self.options, self.log = options, log
        self.sampler = sampler or Sampler()
        self.workers: Dict[str, Worker] = {}
        self.dead: Dict[str, str] = {}
        argvs, envs = {}, {}
        for name in names:
            config = resolve(name, variants)
            argvs[name] = worker.command(config.base, config.backend, engine, preload)
            envs[name] = {**worker_environment(config, environ), "BENCH_CONFIG": name,
                          **(worker_env or {}).get(name, {})}
        envs = isolation.even_environments(argvs, envs)  # the same stack start in every worker
        for name in names:  # all start at once: their imports overlap
            self.workers[name] = Worker(name, [*launcher, *argvs[name]], envs[name])
        self.infos: Dict[str, Dict[str, Any]] = {}
        for name in names:
            try:
                self.infos[name] = self.workers[name].wait_ready(READY_TIMEOUT_S)
            except (CommandFailed, WorkerGone) as exc:
                self._bury(name, f"set-up failed: {exc}")
        self.setup_differs = differing_setups(self.infos)
        if self.setup_differs:
            self.log(f"set up unlike native: {', '.join(self.setup_differs)}")

    def close(self) -> None:
        close_all(list(self.workers.values()))

    def _bury(self, name: str, why: str) -> None:
        self.dead[name] = why
        gone = self.workers.pop(name, None)
        if gone is not None:
            gone.close(5.0)
        self.log(f"{name}: {why.splitlines()[0] if why else ''}")

    def _request(self, name: str, failed: Dict[str, str], command: str, timeout_s: float, **kw):
        """The worker's answer, or None after recording why in ``failed`` (a worker that exited
        is also buried for the workloads still to come)."""
        if name not in self.workers:
            failed.setdefault(name, f"worker could not run: {self.dead.get(name)}")
            return None
        try:
            return self.workers[name].request(command, timeout_s, **kw)
        except CommandFailed as exc:
            failed[name] = str(exc)
        except WorkerGone as exc:
            failed[name] = str(exc)
            self._bury(name, str(exc))
        return None

    def prepare(self, workload: str, names: Sequence[str]):
        """The memory pass of each worker in ``names``, one at a time, native first: returns
        ``(prepared records, failed: {name: why})``."""
        names = list(dict.fromkeys([NATIVE] + list(names)))
        failed = {n: f"worker could not run: {self.dead[n]}" for n in names if n in self.dead}
        prepared: Dict[str, Dict[str, Any]] = {}
        for name in [n for n in names if n in self.workers]:
            began_s = time.monotonic()
            record = self._request(name, failed, "prepare", PREPARE_TIMEOUT_S, workload=workload)
            if record is None:
                self._request(name, {}, "drop", PREPARE_TIMEOUT_S)  # give back what it holds
                continue
            prepared[name] = {**record, "wall_s": round(time.monotonic() - began_s, 3)}
            self.log(f"{workload}: {name} memory pass: {memory_text(record)}")
        return prepared, failed

    def drop_all(self) -> None:
        for name in list(self.workers):
            self._request(name, {}, "drop", PREPARE_TIMEOUT_S)

    def run_workload(self, workload: str, pairs: Sequence[plan.Pair],
                     options: Optional[Options] = None) -> Dict[str, Any]:
        """The raw record of ``workload`` (see the module's docstring), at ``options`` (else the
        runner's)."""
        if options is not None:
            self.options = options
        prepared, failed = self.prepare(workload, [n for pair in pairs for n in pair])
        result: Dict[str, Any] = {"workload": workload, "prepare": prepared, "failed": failed}
        result["baseline_process_bytes"] = {  # NVML, right after each worker's CUDA started
            n: self.infos[n].get("baseline_process_bytes") for n in prepared if n in self.infos
        }
        result.update(self.time(workload, pairs, prepared, failed, self.options.block_s))
        self.drop_all()
        return result

    def time(self, workload, pairs, prepared, failed, block_s: float) -> Dict[str, Any]:
        """The timed pairs of ``workload`` at blocks of about ``block_s`` (stages, warm-up,
        rounds); records failures in ``failed``."""
        result: Dict[str, Any] = {"pairs": [], "stages": [], "process_peak_bytes": {},
                                  "warm_up_blocks": [], "warm_up_s": 0.0}
        runnable = [p for p in pairs if p[0] in prepared and p[1] in prepared]
        for ref, config in pairs:
            if (ref, config) not in runnable and config not in failed:
                failed[config] = f"its reference {ref} failed on this workload: {failed.get(ref)}"
        if NATIVE not in prepared or not runnable:
            return result
        step_s = prepared[NATIVE]["step_s"]
        per_block = plan.steps_per_block(block_s, step_s)
        slowest_s = max(prepared[n]["step_s"] for pair in runnable for n in pair)
        card_bytes = self.infos.get(NATIVE, {}).get("device_total_bytes") or 1 << 60

        def footprint(name: str, key: str) -> int:
            return (prepared[name].get(key) or 0) + plan.PROCESS_OVERHEAD_BYTES

        members = {n for pair in runnable for n in pair}
        staged, left_out = plan.stages(
            runnable,
            {n: footprint(n, "peak_device_bytes") for n in members},
            {n: footprint(n, "settled_bytes") for n in members},
            card_bytes,
            plan.max_pairs_for_gap(self.options.idle_release_s, per_block * slowest_s),
        )
        failed.update(left_out)
        result.update(steps_per_block=per_block, block_s=block_s, stages=staged)
        counter = 0
        for index, stage in enumerate(staged):
            active = list(dict.fromkeys(n for pair in stage for n in pair))
            self.log(
                f"{workload}: stage {index + 1}/{len(staged)}: {', '.join(active)}, "
                f"{per_block} step(s) a block"
            )
            for name in [n for n in self.workers if n not in active]:
                self._request(name, {}, "settle", PREPARE_TIMEOUT_S)
            began_s = time.monotonic()
            result["warm_up_blocks"].append(
                self._warm_up(active, prepared[NATIVE]["timed_steps"], per_block, failed))
            result["warm_up_s"] += time.monotonic() - began_s
            for r in range(self.options.pairs):
                for ref, config, ref_first in plan.round_order(stage, r):
                    if ref in failed or config in failed:
                        if ref in failed and config not in failed:
                            failed[config] = f"its reference {ref} failed: {failed[ref]}"
                        continue
                    first = counter * per_block
                    counter += 1
                    pair = self._pair(ref, config, ref_first, first, per_block, failed,
                                      result["process_peak_bytes"])
                    if pair is not None:
                        result["pairs"].append({**pair, "round": r, "stage": index})
        return result

    def _warm_up(self, active: List[str], cycle: int, per_block: int, failed) -> Dict[str, int]:
        """``active`` workers run the timed steps once, a block each in turn (untimed); with
        ``settle``, then blocks of the first steps, in turn, until every one has settled (module
        docstring). Returns the blocks each ran until it settled."""

        def alive() -> List[str]:
            return [n for n in active if n in self.workers and n not in failed]

        for k in range(math.ceil(cycle / per_block)):
            for name in alive():
                self._request(name, failed, "block", BLOCK_TIMEOUT_S, first=k * per_block,
                              count=per_block, warm=True)
        times: Dict[str, List[float]] = {n: [] for n in alive()}
        pending = list(times) if self.options.settle else []
        while [n for n in pending if n in alive()]:
            for name in alive():  # the settled too: none idles while another settles
                answer = self._request(name, failed, "block", BLOCK_TIMEOUT_S, first=0,
                                       count=per_block, warm=True)
                if name not in pending:
                    continue
                if answer is not None:
                    times[name].append(answer["elapsed_s"])
                if answer is None or settled(times[name]) or len(times[name]) >= SETTLE_MAX_BLOCKS:
                    pending.remove(name)
        return {n: len(t) for n, t in times.items()}

    def _pair(self, ref, config, ref_first, first, count, failed, peaks) -> Optional[Dict]:
        """Both blocks of one pair, in order; None if either failed (recorded in ``failed``)."""
        blocks: Dict[str, Dict[str, Any]] = {}
        samples = []
        for name in [ref, config] if ref_first else [config, ref]:
            answer = self._request(name, failed, "block", BLOCK_TIMEOUT_S, first=first,
                                   count=count, warm=False)
            if answer is None:
                return None
            gpu, process_bytes = self.sampler.after_block(self.workers[name].pid)
            samples.append(gpu)
            if process_bytes is not None:
                peaks[name] = max(peaks.get(name, 0), process_bytes)
            blocks[name] = {**answer, "sm_mhz": (gpu or {}).get("sm_mhz")}
        return {
            "config": config,
            "ref": ref,
            "ref_first": ref_first,
            "config_s": blocks[config]["elapsed_s"],
            "ref_s": blocks[ref]["elapsed_s"],
            "config_idle_s": blocks[config]["idle_before_s"],
            "ref_idle_s": blocks[ref]["idle_before_s"],
            "units": blocks[config]["units"],
            "steps": blocks[config]["steps"],
            "ref_steps": blocks[ref]["steps"],
            "gpu": samples,
            "throttled": any(s is not None and s.get("throttled") for s in samples),
            "config_block": block_diagnostics(blocks[config]),
            "ref_block": block_diagnostics(blocks[ref]),
        }


def block_diagnostics(answer: Dict[str, Any]) -> Dict[str, Any]:
    """What a block's answer says about where its time went (worker.DIAGNOSTICS), with the SM
    clock NVML read right after it (None without NVML)."""
    return {**{k: answer.get(k) for k in worker.DIAGNOSTICS}, "sm_mhz": answer.get("sm_mhz")}


def differing_setups(infos: Dict[str, Dict[str, Any]]) -> List[str]:
    """The workers whose set-up fingerprint (worker.setup_facts) differs from native's."""
    reference = (infos.get(NATIVE, {}).get("setup") or {}).get("fingerprint")
    return [n for n, info in infos.items()
            if reference and (info.get("setup") or {}).get("fingerprint") != reference]


def memory_text(record: Dict[str, Any]) -> str:
    peak = record.get("peak_device_bytes")
    text = "?" if peak is None else f"{peak / 2**30:.2f} GiB"
    return f"peak {text} ({record['memory_source']}), {record['step_s'] * 1e3:.2f} ms a step"


def run_group(
    runner: Runner,
    workloads: Sequence[str],
    pairs: Sequence[plan.Pair],
    on_workload: Optional[Callable[[Dict[str, Any]], None]] = None,
    clock: Callable[[], float] = time.monotonic,
    options: Optional[Dict[str, Options]] = None,
) -> List[Dict[str, Any]]:
    """``run_workload`` for each workload in order (at ``options[workload]`` where given);
    ``on_workload`` sees each record (to save)."""
    records = []
    for workload in workloads:
        started_s = clock()
        runner.log(f"== {workload}")
        record = runner.run_workload(workload, pairs, (options or {}).get(workload))
        record["wall_s"] = round(clock() - started_s, 1)
        records.append(record)
        if on_workload is not None:
            on_workload(record)
    return records

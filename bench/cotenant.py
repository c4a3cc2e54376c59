"""The parent's side of the co-tenant workload: what a second process gets while this one idles.

One prober B (native) lives through every trial. A trial of configuration A: A (already loaded:
its imports overlap the previous trial) is told to go; B reads free memory before A touches
CUDA; A trains GPT-2, then idles and says so; B probes at PROBE_TIMES_S after that (free memory,
confirmed by filling that much less headroom). Invariant: no two holders touch CUDA at once (the
next one is only loaded while the current one idles), every process a trial started has exited
when it returns, and held beyond live = A's free memory at its start - B's free memory at the
probe - A's live tensor bytes.
"""

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import protocol
from .configs import CONFIGS, COTENANT_CONFIGS, NATIVE, worker_environment
from .workers import CommandFailed, Worker, WorkerGone

PROBE_TIMES_S = (0.5, 3.0, 10.0)
LOAD_TIMEOUT_S = 180.0
TRAIN_TIMEOUT_S = 180.0
PROBE_TIMEOUT_S = 60.0


def holder_command(name: str) -> List[str]:
    cotenant = COTENANT_CONFIGS[name]
    command = [sys.executable, "-m", "bench.cotenant_child", "holder", "--base"]
    command += [cotenant.config.base, "--backend", cotenant.config.backend]
    return command + (["--empty-cache"] if cotenant.empty_cache else [])


def prober_command() -> List[str]:
    return [sys.executable, "-m", "bench.cotenant_child", "prober"]


def _expect(worker: Worker, kind: str, timeout_s: float) -> Dict[str, Any]:
    message = worker.receive(timeout_s)
    if message["kind"] == "skipped":
        raise CommandFailed(f"skipped: {message['reason']}")
    if message["kind"] != kind:
        raise CommandFailed(message.get("reason", f"said {message['kind']!r}, not {kind!r}"))
    return message


def trial(
    name: str,
    holder: Worker,
    prober: Worker,
    start_next: Callable[[], None],
    probe_times_s: Sequence[float] = PROBE_TIMES_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Dict[str, Any]:
    """One trial of A = ``name`` (module docstring); ``start_next`` starts loading the next
    holder once this one idles."""
    started_s = clock()
    try:
        _expect(holder, "loaded", LOAD_TIMEOUT_S)
        free_before_bytes = prober.request("free", PROBE_TIMEOUT_S)["free_bytes"]
        holder.send({"command": "go"})
        idle = _expect(holder, "idle", TRAIN_TIMEOUT_S)
        idle_s = clock()
        start_next()
        probes = []
        for at_s in probe_times_s:
            sleep(max(0.0, idle_s + at_s - clock()))
            answer = prober.request("probe", PROBE_TIMEOUT_S)
            held = idle["free_bytes_at_start"] - answer["free_bytes"] - idle["live_bytes"]
            probes.append(
                {**answer, "idle_s": round(clock() - idle_s, 2), "held_beyond_live_bytes": held}
            )
        result = {
            "probes": probes,
            "live_bytes": idle["live_bytes"],
            "free_before_bytes": free_before_bytes,
            "free_bytes_at_start": idle["free_bytes_at_start"],
            "empty_cache_called": idle["empty_cache_called"],
            "device": idle.get("device"),
        }
    except (CommandFailed, WorkerGone, OSError) as exc:
        start_next()
        result = {"error": protocol.tail(str(exc))}
    finally:
        holder.close(10.0)
    result["wall_s"] = round(clock() - started_s, 2)
    return result


def run_cotenant(
    names: Sequence[str],
    environ: Dict[str, str],
    repeats: int = 1,
    log: Callable[[str], None] = protocol.progress,
) -> List[Dict[str, Any]]:
    """``repeats`` rounds of one trial per configuration of A: ``[{"config", "round", ...}]``."""
    order = [(r, name) for r in range(repeats) for name in names]
    native_env = worker_environment(CONFIGS[NATIVE], environ)
    prober = Worker("cotenant B", prober_command(), native_env)
    try:
        prober.wait_ready(LOAD_TIMEOUT_S)
    except (CommandFailed, WorkerGone) as exc:
        prober.close(5.0)
        why = protocol.tail(f"the prober (B) could not start: {exc}")
        return [{"config": n, "round": r, "error": why} for r, n in order]
    holders: List[Optional[Worker]] = [None] * len(order)

    def start(index: int) -> None:
        if index < len(order) and holders[index] is None:
            name = order[index][1]
            env = worker_environment(COTENANT_CONFIGS[name].config, environ)
            holders[index] = Worker(f"cotenant A {name}", holder_command(name), env)

    results = []
    try:
        start(0)
        for index, (round_index, name) in enumerate(order):
            log(f"co-tenant {index + 1}/{len(order)}: A = {name} trains, then idles; B probes")
            result = trial(name, holders[index], prober, lambda: start(index + 1))
            results.append({"config": name, "round": round_index, **result})
            log(f"co-tenant {name}: {trial_text(result)}")
    finally:
        for holder in holders:
            if holder is not None:
                holder.close(5.0)
        prober.close(10.0)
    return results


def trial_text(result: Dict[str, Any]) -> str:
    if "error" in result:
        return f"failed: {result['error'].splitlines()[-1] if result['error'] else ''}"
    return ", ".join(
        f"{p['idle_s']:.1f} s: held {p['held_beyond_live_bytes'] / 2**30:.2f} GiB beyond live, "
        f"B {'could use' if p['confirmed'] else 'could NOT use'} {p['tried_bytes'] / 2**30:.1f} GiB"
        for p in result["probes"]
    )

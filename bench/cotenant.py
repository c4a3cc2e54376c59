"""The parent's side of the co-tenant workload: two processes on one GPU, and what B could get.

Invariant: in a trial, A (the configuration under test) and B (native, the newcomer) are started
together; B is told to search only after A has said ``ready`` (trained, synchronised, idle with
its model alive), and A is told to exit (its stdin closed) only after B has answered or failed;
no two trials overlap, and every process a trial started has exited when it returns.
``cotenant_fit_fraction`` = B's largest allocation ÷ the device's total memory.
"""

import queue
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from . import protocol
from .configs import CONFIGS, NATIVE, COTENANT_CONFIGS, child_environment


class Process:
    """A child with its stdin open; its messages arrive on a queue, its stderr is echoed."""

    def __init__(self, command: List[str], env: Dict[str, str], label: str) -> None:
        self.messages: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self.stderr_tail: List[str] = []
        self.popen = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(label,), daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.popen.stdout:
            for message in protocol.messages(line):
                self.messages.put(message)
        self.messages.put(None)  # end of output

    def _read_stderr(self, label: str) -> None:
        for line in self.popen.stderr:
            self.stderr_tail = (self.stderr_tail + [line])[-30:]
            sys.stderr.write(f"    {label}| {line}")

    def wait_for(self, kind: str, deadline_s: float) -> Dict[str, Any]:
        """The next message; raises RuntimeError if it is not of ``kind`` (a skip or set-up
        error says why), the process ended, or ``deadline_s`` (time.monotonic) passed."""
        try:
            message = self.messages.get(timeout=max(0.0, deadline_s - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"no {kind!r} before the trial's time-out") from None
        if message is None:
            self.popen.wait()
            raise RuntimeError(
                f"exited with status {self.popen.returncode} before {kind!r}: "
                + protocol.tail("".join(self.stderr_tail))
            )
        if message["kind"] == "skipped":
            raise RuntimeError(f"skipped: {message['reason']}")
        if message["kind"] != kind:
            raise RuntimeError(message.get("reason", f"said {message['kind']!r}, not {kind!r}"))
        return message

    def finish(self, timeout_s: float = 30.0) -> None:
        """Close stdin (the signal to exit) and wait up to ``timeout_s``; kill it if it does not
        go."""
        try:
            self.popen.stdin.close()
        except OSError:
            pass
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def holder_command(name: str) -> List[str]:
    cotenant = COTENANT_CONFIGS[name]
    command = [
        sys.executable,
        "-m",
        "bench.cotenant_child",
        "holder",
        "--base",
        cotenant.config.base,
        "--backend",
        cotenant.config.backend,
    ]
    return command + (["--empty-cache"] if cotenant.empty_cache else [])


def prober_command() -> List[str]:
    return [sys.executable, "-m", "bench.cotenant_child", "prober"]


def run_trial(name: str, environ: Dict[str, str], timeout_s: float, label: str) -> Dict[str, Any]:
    """One trial of A = ``name``: ``{"fit_bytes", "device_total_bytes", "free_bytes_before",
    "empty_cache_called", "a_free_bytes_when_idle", "wall_s"}`` or ``{"error", "wall_s"}``."""
    started_s = time.monotonic()
    deadline_s = started_s + timeout_s
    grace_s = 2.0
    holder = Process(
        holder_command(name),
        child_environment(COTENANT_CONFIGS[name].config, environ),
        f"{label} A",
    )
    prober = Process(prober_command(), child_environment(CONFIGS[NATIVE], environ), f"{label} B")
    try:
        ready = holder.wait_for("ready", deadline_s)
        prober.wait_for("ready", deadline_s)
        prober.popen.stdin.write("go\n")
        prober.popen.stdin.flush()
        fit = prober.wait_for("fit", deadline_s)
        result = {
            "fit_bytes": fit["fit_bytes"],
            "device_total_bytes": fit["device_total_bytes"],
            "free_bytes_before": fit["free_bytes_before"],
            "empty_cache_called": ready["empty_cache_called"],
            "a_free_bytes_when_idle": ready["free_bytes_when_idle"],
            "info": ready.get("info", {}),
        }
        grace_s = 30.0
    except (RuntimeError, OSError) as exc:
        result = {"error": protocol.tail(str(exc))}
        grace_s = 2.0  # something is wrong: do not wait long for either to go
    finally:
        prober.finish(grace_s)
        holder.finish(grace_s)
    result["wall_s"] = round(time.monotonic() - started_s, 2)
    return result


def run_cotenant(
    names: Sequence[str], repeats: int, environ: Dict[str, str], timeout_s: float, trial=run_trial
) -> List[Dict[str, Dict[str, Any]]]:
    """``repeats`` rounds of one trial per configuration of A (``{name: trial result}`` per round).
    A configuration skipped in a round is not tried again."""
    rounds: List[Dict[str, Dict[str, Any]]] = []
    settled: Dict[str, Dict[str, Any]] = {}
    for repeat in range(repeats):
        results: Dict[str, Dict[str, Any]] = {}
        for name in names:
            if name in settled:
                results[name] = settled[name]
                continue
            label = f"[cotenant {repeat + 1}/{repeats}] {name}"
            protocol.progress(f"{label}: A trains then idles; B probes")
            results[name] = trial(name, environ, timeout_s, label)
            outcome = results[name].get("error") or (
                f"B got {results[name]['fit_bytes'] / 2**30:.1f} GiB"
            )
            protocol.progress(f"{label}: {outcome} ({results[name]['wall_s']:.1f} s)")
            if results[name].get("error", "").startswith("skipped"):
                settled[name] = results[name]
        rounds.append(results)
    return rounds


def summarise(rounds: Sequence[Dict[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """``{name: cell}`` with ``cotenant_fit_fraction`` (median over rounds), its min and max,
    ``fit_bytes`` (median), ``device_total_bytes``, ``empty_cache_called``, or ``{"error"}``."""
    names = list(dict.fromkeys(name for results in rounds for name in results))
    cells: Dict[str, Dict[str, Any]] = {}
    for name in names:
        trials = [results[name] for results in rounds if name in results]
        measured = [t for t in trials if "error" not in t]
        if not measured:
            cells[name] = {"error": trials[0]["error"]}
            continue
        fractions = [t["fit_bytes"] / t["device_total_bytes"] for t in measured]
        cells[name] = {
            "cotenant_fit_fraction": statistics.median(fractions),
            "cotenant_fit_fraction_min": min(fractions),
            "cotenant_fit_fraction_max": max(fractions),
            "fit_bytes": int(statistics.median(t["fit_bytes"] for t in measured)),
            "device_total_bytes": measured[0]["device_total_bytes"],
            "empty_cache_called": measured[0]["empty_cache_called"],
            "repeats_measured": len(measured),
        }
        errors = [t["error"] for t in trials if "error" in t]
        if errors:
            cells[name]["repeat_errors"] = errors
    return cells

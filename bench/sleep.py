"""Sleep and wake: how much device memory a sleeping training process gives back,
how fast it sleeps and wakes against the host link, and whether everything comes back bit for
bit; streampool on the vmm backend against torch_memory_saver (a GPU benchmark).

``python3 -m bench.sleep [--configs a,b] [--out-dir DIR]`` runs each configuration in a child
process of its own (``python3 -m bench.sleep --child CONFIG --out FILE``), one after the other,
and writes DIR/sleep.json (every child's record, the table's figures), DIR/sleep.md and
DIR/child-CONFIG.log (each child's output); it prints one line per configuration last, and
exits 0 only if every child ran to the end (a mismatch is a result, not a failure).

The configurations (CONFIGS):

- ``native``: PyTorch's caching allocator, no sleep: the workload's footprint.
- ``streampool-vmm``: ``streampool.install(backend="vmm")`` before CUDA starts; sleep is
  ``streampool.sleep(level=1)`` (it synchronises and gives every page back, the cache's too,
  what live tensors hold waiting in page-locked host memory), wake is ``streampool.wake()``.
- ``tms``: torch_memory_saver in its default hook mode, ``preload`` (what SGLang and the RL
  frameworks built on it run: its .so in LD_PRELOAD, so it must be there when the process
  starts: the child re-executes itself with LD_PRELOAD set to the .so the package itself picks
  for torch's CUDA major, ``torch_memory_saver_hook_mode_preload_cu13`` for torch cu130, and
  the directory of the libcudart torch loads first in LD_LIBRARY_PATH, since that .so needs
  libcudart.so.13 before torch has loaded it); every allocation of the workload is made inside
  ``torch_memory_saver.region(tag=..., enable_cpu_backup=True)``; sleep is
  ``torch.cuda.empty_cache()`` then ``torch_memory_saver.pause()``, wake ``resume()``.
- ``tms-torch``: the same with ``torch_memory_saver.hook_mode = "torch"`` (its in-process
  CUDAPluggableAllocator inside a MemPool), for comparison.

Each child, in this order: deterministic settings (``CUBLAS_WORKSPACE_CONFIG``, cuDNN
deterministic, ``torch.use_deterministic_algorithms(True, warn_only=True)``); its allocator;
CUDA started with a tiny allocation freed and the cache emptied, then the **context** read (what
the process holds before the workload); the **host link** (a 1 GiB pinned host tensor to the
device and back, best of 3 each way; freed); the **workload**: GPT-2 124M (transformers
``GPT2LMHeadModel(GPT2Config())``, eager attention so that a step is deterministic; a stack of
``nn.Linear`` of about the same size without transformers), AdamW, TRAIN_STEPS steps on
seeded random tokens (batch BATCH, sequence SEQ, bf16 autocast), then a 4 GiB "inference
buffer"; CPU copies of every parameter, buffer, optimizer state tensor and the inference buffer
(the **snapshot**); the **reference step** twice (one step, its loss and parameters kept on the
host, the state restored from the snapshot each time: the two must agree, else the step is not
deterministic here and its comparison proves nothing), the restore checked bit for bit; then
**held before** read, **sleep** timed (wall, synchronised on both sides), **held asleep** read,
**wake** timed, **held woken** read; every tensor compared bit for bit with the snapshot; the
step taken again and compared with the reference; a second sleep/wake cycle timed.

Figures (``row``): given back = (held before - held asleep) / (held before - context); sleep
and wake GB/s = the workload's live tensor bytes (what must be kept: parameters, buffers,
optimizer state, the inference buffer; the same for every configuration) / seconds, 1 GB =
1e9 bytes, against the host link's device-to-host (sleep) and host-to-device (wake) rate read in
the same child. Held memory is this process's device memory from NVML where the driver lists
the process, else the device's used memory (total - free, from ``torch.cuda.mem_get_info``);
the record says which.

Invariant: the parent never imports torch (bench/sleep_child.py, the child's side, does); a
child writes its record to --out after every stage, so a child that dies or runs out of time
still leaves what it measured, and whatever goes wrong in it is caught and recorded with the
stage it happened in. The functions from ``finite`` to ``summary_lines`` are pure (no torch, no
GPU): the CPU tests (bench/tests/test_sleep_report.py) render fabricated records through them.
"""

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import protocol

COMMAND = "python3 -m bench.sleep"
ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
GB = 1e9

NATIVE = "native"
STREAMPOOL = "streampool-vmm"
TMS = "tms"
TMS_TORCH = "tms-torch"
CONFIGS = (NATIVE, STREAMPOOL, TMS, TMS_TORCH)
DESCRIPTIONS = {
    NATIVE: "PyTorch's caching allocator, no sleep (the footprint)",
    STREAMPOOL: 'streampool.install(backend="vmm"); streampool.sleep(level=1) / wake()',
    TMS: "torch_memory_saver, hook mode preload (LD_PRELOAD), region(enable_cpu_backup=True); "
    "empty_cache() + pause() / resume()",
    TMS_TORCH: 'torch_memory_saver, hook_mode = "torch" (pluggable allocator), otherwise as tms',
}

TARGET_GIVEN_BACK_PCT = 99.0
TARGET_LINK_PCT = 80.0
TMS_REPORTED_GIVEN_BACK_PCT = 97.7

CHILD_TIMEOUT_S = 150.0
CUBLAS_WORKSPACE = ":4096:8"
# Settings of PyTorch's allocator that would change the footprint (and that torch_memory_saver
# refuses with expandable segments): removed from the children's environment.
REMOVED_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
PRELOADED_VARIABLE = "BENCH_SLEEP_PRELOADED"  # set on the re-executed tms child
BUFFER_VARIABLE = "BENCH_SLEEP_BUFFER_GIB"  # --buffer-gib, for the children


# ---------------------------------------------------------------------------------------------
# Pure functions: a child's record -> the report's figures -> Markdown and summary lines.


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON without NaN)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def memory_source(record: Dict[str, Any]) -> str:
    """"nvml-process" when every reading of ``record`` has this process's NVML figure, else
    "device-used" (total - free of the whole device)."""
    readings = [record.get(k) for k in ("context", "before", "asleep", "woken") if record.get(k)]
    if readings and all(r.get("process_bytes") is not None for r in readings):
        return "nvml-process"
    return "device-used"


def held(reading: Optional[Dict[str, Any]], source: str) -> Optional[int]:
    """The bytes a reading says are held, by ``source``."""
    if not reading:
        return None
    if source == "nvml-process":
        return reading.get("process_bytes")
    return reading.get("device_used_bytes")


def given_back_pct(before: Optional[int], asleep: Optional[int],
                   context: Optional[int]) -> Optional[float]:
    """(before - asleep) / (before - context) in percent; None without the three or when the
    workload held nothing beyond the context."""
    if before is None or asleep is None or context is None or before - context <= 0:
        return None
    return 100.0 * (before - asleep) / (before - context)


def rate_gbps(nbytes: Optional[int], seconds: Optional[float]) -> Optional[float]:
    if not nbytes or not seconds or seconds <= 0:
        return None
    return nbytes / seconds / GB


def percent(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def verdict(value: Optional[float], target: float) -> Optional[str]:
    if value is None:
        return None
    return "met" if value >= target else "not met"


def row(record: Dict[str, Any]) -> Dict[str, Any]:
    """The figures of one child's record (None where it did not get that far)."""
    source = memory_source(record)
    context = held(record.get("context"), source)
    before = held(record.get("before"), source)
    asleep = held(record.get("asleep"), source)
    woken = held(record.get("woken"), source)
    link = record.get("link") or {}
    live = record.get("live_bytes")
    sleeps = record.get("config") != NATIVE
    out: Dict[str, Any] = {
        "config": record.get("config"),
        "ok": bool(record.get("ok")),
        "error": record.get("error"),
        "stage": record.get("stage"),
        "memory_source": source,
        "context_bytes": context,
        "held_before_bytes": before,
        "live_bytes": live,
        "buffer_bytes": record.get("buffer_bytes"),
        "reserved_before_bytes": (record.get("before") or {}).get("reserved_bytes"),
        "link_d2h_gbps": link.get("d2h_gbps"),
        "link_h2d_gbps": link.get("h2d_gbps"),
    }
    if not sleeps:
        return out
    sleep_gbps = rate_gbps(live, record.get("sleep_s"))
    wake_gbps = rate_gbps(live, record.get("wake_s"))
    gone = given_back_pct(before, asleep, context)
    sleep_link = percent(sleep_gbps, link.get("d2h_gbps"))
    wake_link = percent(wake_gbps, link.get("h2d_gbps"))
    second = record.get("second_cycle") or {}
    out.update({
        "held_asleep_bytes": asleep,
        "held_woken_bytes": woken,
        "given_back_pct": gone,
        "sleep_s": record.get("sleep_s"),
        "wake_s": record.get("wake_s"),
        "sleep_gbps": sleep_gbps,
        "wake_gbps": wake_gbps,
        "sleep_link_pct": sleep_link,
        "wake_link_pct": wake_link,
        "second_sleep_s": second.get("sleep_s"),
        "second_wake_s": second.get("wake_s"),
        "second_given_back_pct": given_back_pct(
            held(second.get("before"), source), held(second.get("asleep"), source), context),
        "bitwise_equal": record.get("bitwise_equal"),
        "mismatches": record.get("mismatches") or [],
        "restore_equal": record.get("restore_equal"),
        "addresses_kept": record.get("addresses_kept"),
        "reference_repeatable": record.get("reference_repeatable"),
        "step_equal": record.get("step_equal"),
        "targets": {
            "given_back": verdict(gone, TARGET_GIVEN_BACK_PCT),
            "sleep_link": verdict(sleep_link, TARGET_LINK_PCT),
            "wake_link": verdict(wake_link, TARGET_LINK_PCT),
        },
    })
    return out


def exit_status(records: Dict[str, Dict[str, Any]]) -> int:
    """0 when every child ran to the end, else 1."""
    return 0 if records and all(r.get("ok") for r in records.values()) else 1


def build_report(records: Dict[str, Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    """sleep.json: the run's facts, each configuration's figures, and the records themselves."""
    rows = [row(records[c]) for c in records]
    failed = [{"config": r["config"], "stage": r["stage"], "error": r["error"]}
              for r in rows if not r["ok"]]
    return {
        "meta": meta,
        "targets": {"given_back_pct": TARGET_GIVEN_BACK_PCT, "link_pct": TARGET_LINK_PCT,
                    "tms_reported_given_back_pct": TMS_REPORTED_GIVEN_BACK_PCT},
        "rows": rows,
        "failed": failed,
        "exit_status": exit_status(records),
        "records": records,
    }


def gib(value: Optional[float]) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def number(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def yes_no(value: Optional[bool]) -> str:
    return "—" if value is None else ("yes" if value else "no")


MARKS = {"met": " ✓", "not met": " ✗", None: ""}


def step_text(r: Dict[str, Any]) -> str:
    """Whether the step after wake equals the reference; "n/a" when the reference itself did not
    repeat (the step is not deterministic here)."""
    if r.get("reference_repeatable") is False:
        return "n/a (not repeatable)"
    return yes_no(r.get("step_equal"))


def _rate_cell(gbps: Optional[float], link_pct: Optional[float], status: Optional[str]) -> str:
    if gbps is None:
        return "—"
    return f"{gbps:.1f} ({number(link_pct, 0, '%')}){MARKS[status]}"


def _first(rows: List[Dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in rows if r.get(key) is not None), None)


def render_markdown(report: Dict[str, Any]) -> str:
    """sleep.md: the table, the link, the failures, and how it was measured."""
    meta, rows = report["meta"], report["rows"]
    targets = report["targets"]
    facts = meta.get("facts") or {}
    lines = ["# Sleep and wake: streampool (vmm) against torch_memory_saver", ""]
    described = ", ".join(f"{k} {facts[k]}" for k in ("device", "torch", "cuda", "transformers",
                                                        "torch_memory_saver", "model")
                          if facts.get(k))
    if described:
        lines += [f"{described}; {meta.get('date', '')}.", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += [
        "| configuration | context GiB | held before GiB | held asleep GiB | given back | "
        "sleep s | wake s | sleep GB/s (% of D2H) | wake GB/s (% of H2D) | state bitwise | "
        "step bitwise |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"`{r['config']}`"
        if not r["ok"] and r.get("held_before_bytes") is None:
            lines.append(f"| {name} | **failed** ({r.get('stage')}) |" + " |" * 9)
            continue
        failed = f" **failed** ({r.get('stage')})" if not r["ok"] else ""
        if "given_back_pct" not in r:  # native: the footprint only
            lines.append(f"| {name}{failed} | {gib(r['context_bytes'])} | "
                         f"{gib(r['held_before_bytes'])} | no sleep | | | | | | | |")
            continue
        t = r["targets"]
        lines.append(
            f"| {name}{failed} | {gib(r['context_bytes'])} | {gib(r['held_before_bytes'])} | "
            f"{gib(r['held_asleep_bytes'])} | "
            f"{number(r['given_back_pct'], 2, '%')}{MARKS[t['given_back']]} | "
            f"{number(r['sleep_s'], 3)} | {number(r['wake_s'], 3)} | "
            f"{_rate_cell(r['sleep_gbps'], r['sleep_link_pct'], t['sleep_link'])} | "
            f"{_rate_cell(r['wake_gbps'], r['wake_link_pct'], t['wake_link'])} | "
            f"{yes_no(r['bitwise_equal'])} | {step_text(r)} |"
        )
    live, buffer = _first(rows, "live_bytes"), _first(rows, "buffer_bytes")
    lines += [
        "",
        f"Targets: given back ≥ {targets['given_back_pct']:g}% (torch_memory_saver reported "
        f"{targets['tms_reported_given_back_pct']:g}%), sleep and wake ≥ "
        f"{targets['link_pct']:g}% of the host link (✓ met, ✗ not met).",
        "Given back = (held before − held asleep) ÷ (held before − context). "
        f"GB/s = the workload's live tensor bytes ({gib(live)} GiB: parameters, optimizer state, "
        f"the {gib(buffer)} GiB inference buffer; the same for every configuration) ÷ the wall "
        "time of the "
        "sleep (wake), synchronised on both sides; 1 GB = 1e9 bytes.",
        "",
        "| configuration | memory source | reserved before GiB | host link D2H / H2D GB/s | "
        "2nd cycle sleep / wake s | 2nd cycle given back | addresses kept | restore bitwise | "
        "reference repeatable |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        link = f"{number(r.get('link_d2h_gbps'), 1)} / {number(r.get('link_h2d_gbps'), 1)}"
        if "given_back_pct" not in r:
            lines.append(f"| `{r['config']}` | {r['memory_source']} | "
                         f"{gib(r.get('reserved_before_bytes'))} | {link} | | | | | |")
            continue
        lines.append(
            f"| `{r['config']}` | {r['memory_source']} | {gib(r.get('reserved_before_bytes'))} | "
            f"{link} | {number(r['second_sleep_s'], 3)} / {number(r['second_wake_s'], 3)} | "
            f"{number(r['second_given_back_pct'], 2, '%')} | {yes_no(r['addresses_kept'])} | "
            f"{yes_no(r['restore_equal'])} | "
            f"{yes_no(r['reference_repeatable'])} |"
        )
    mismatched = [r for r in rows if r.get("mismatches")]
    if mismatched:
        lines += ["", "Tensors that differ after wake:"]
        for r in mismatched:
            lines.append(f"- `{r['config']}`: {', '.join(r['mismatches'])}")
    if report["failed"]:
        lines += ["", "Failures:"]
        for f in report["failed"]:
            error = (f.get("error") or "no record").strip().replace("\n", "\n    ")
            lines.append(f"- `{f['config']}` at stage `{f['stage']}`:\n\n    {error}\n")
    lines += ["", "Configurations:"]
    lines += [f"- `{r['config']}`: {DESCRIPTIONS.get(r['config'], '')}" for r in rows]
    lines += [
        "",
        "Memory source: `nvml-process` is this process's device memory as NVML lists it; "
        "`device-used` (where NVML lists no process, as in many containers) is the whole "
        "device's total − free, so another process on the GPU would count too. The context is "
        "read after CUDA started, a tiny tensor was allocated and freed and the cache emptied. "
        "Library handles and kernels loaded during the workload stay in the process (no "
        "allocator can give them back). Method and code: `bench/sleep.py`.",
        "",
    ]
    return "\n".join(lines)


def summary_lines(report: Dict[str, Any]) -> List[str]:
    """One line per configuration, for the end of the run's output."""
    lines = []
    for r in report["rows"]:
        name = r["config"]
        if not r["ok"] and r.get("held_before_bytes") is None:
            lines.append(f"{name}: FAILED at {r.get('stage')}: "
                         f"{protocol.tail(r.get('error') or '', 1)}")
            continue
        mark = "" if r["ok"] else f" (FAILED at {r.get('stage')})"
        if "given_back_pct" not in r:
            lines.append(f"{name}: held {gib(r['held_before_bytes'])} GiB (context "
                         f"{gib(r['context_bytes'])} GiB), no sleep{mark}")
            continue
        lines.append(
            f"{name}: held {gib(r['held_before_bytes'])} -> {gib(r['held_asleep_bytes'])} GiB, "
            f"given back {number(r['given_back_pct'], 2, '%')}, sleep {number(r['sleep_s'], 3)} s, "
            f"wake {number(r['wake_s'], 3)} s, {number(r['sleep_gbps'], 1)} / "
            f"{number(r['wake_gbps'], 1)} GB/s ({number(r['sleep_link_pct'], 0, '%')} / "
            f"{number(r['wake_link_pct'], 0, '%')} of link), bitwise equal "
            f"{yes_no(r['bitwise_equal'])}, step equal {step_text(r)}{mark}"
        )
    return lines


# ---------------------------------------------------------------------------------------------
# The parent: one child per configuration, one after the other.


def child_environment(environ: Dict[str, str], cwd: Path) -> Dict[str, str]:
    """The children's environment: the repository root first on PYTHONPATH (entries made
    absolute), deterministic cuBLAS, unbuffered output, no allocator settings of PyTorch's, and
    no torch_memory_saver in LD_PRELOAD (the tms child puts it there itself)."""
    env = {k: v for k, v in environ.items() if k not in REMOVED_VARIABLES}
    paths = [str(ROOT)] + [str((cwd / p).resolve()) if p else p
                           for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(PRELOADED_VARIABLE, None)
    preload = [p for p in environ.get("LD_PRELOAD", "").split(":")
               if p and "torch_memory_saver" not in p]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def run_child(config: str, out_dir: Path, env: Dict[str, str], timeout_s: float,
              runner: Callable[..., Any] = subprocess.run) -> Dict[str, Any]:
    """Run one child; its record, or one saying why there is none. Its output goes to
    out_dir/child-CONFIG.log."""
    out = out_dir / f"child-{config}.json"
    log = out_dir / f"child-{config}.log"
    if out.exists():
        out.unlink()
    argv = [sys.executable, "-m", "bench.sleep", "--child", config, "--out", str(out)]
    began = time.monotonic()
    returncode: Optional[int] = None
    problem = None
    output = ""
    try:
        done = runner(argv, cwd=str(ROOT), env=env, capture_output=True, text=True,
                      timeout=timeout_s)
        returncode = done.returncode
        output = (done.stdout or "") + (done.stderr or "")
    except subprocess.TimeoutExpired as exc:
        problem = f"timed out after {timeout_s:g} s"
        output = _text(exc.stdout) + _text(exc.stderr)
    except OSError as exc:
        problem = f"could not start: {exc}"
    wall_s = time.monotonic() - began
    try:
        log.write_text(output)
    except OSError:
        pass
    record: Dict[str, Any] = {}
    try:
        record = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        record = {"config": config, "ok": False, "stage": "start",
                  "error": f"no record from the child ({exc})"}
    record.setdefault("config", config)
    record["returncode"] = returncode
    record["wall_s"] = round(wall_s, 2)
    if problem or returncode != 0 or not record.get("ok"):
        record["ok"] = False
        why = [problem or f"exit status {returncode}"]
        if record.get("error"):
            why.append(record["error"])
        elif output.strip():
            why.append(protocol.tail(output))
        record["error"] = "\n".join(why)
    return record


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _facts(records: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    facts: Dict[str, Any] = {}
    for record in records.values():
        for key, value in (record.get("facts") or {}).items():
            if value is not None and key not in facts:
                facts[key] = value
    return facts


def run_parent(options: argparse.Namespace, argv: Sequence[str]) -> int:
    out_dir = options.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = child_environment(dict(os.environ), Path.cwd())
    if options.buffer_gib is not None:
        env[BUFFER_VARIABLE] = str(options.buffer_gib)
    records: Dict[str, Dict[str, Any]] = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    for config in options.configs:
        protocol.progress(f"sleep: {config} ...")
        record = run_child(config, out_dir, env, options.timeout_s)
        records[config] = record
        state = "ok" if record.get("ok") else f"FAILED at {record.get('stage')}"
        protocol.progress(f"sleep: {config} {state} in {record['wall_s']:.1f} s")
    meta = {
        "command": " ".join([COMMAND] + [shlex.quote(a) for a in argv]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "configs": list(options.configs),
        "removed_variables": [k for k in REMOVED_VARIABLES if k in os.environ],
        "facts": _facts(records),
    }
    report = build_report(records, meta)
    (out_dir / "sleep.json").write_text(
        json.dumps(finite(report), indent=1, allow_nan=False, default=str) + "\n")
    (out_dir / "sleep.md").write_text(render_markdown(report))
    protocol.progress(f"wrote {out_dir / 'sleep.md'} and sleep.json")
    for failure in report["failed"]:
        print(f"FAILED {failure['config']} at stage {failure['stage']}: "
              f"{protocol.tail(failure['error'] or '', 1)} "
              f"(sleep.md; log: {out_dir / ('child-' + failure['config'] + '.log')})")
    for line in summary_lines(report):
        print(line)
    return report["exit_status"]


# ---------------------------------------------------------------------------------------------


def _configs(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown configuration {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(CONFIGS)}")
    return [c for c in CONFIGS if c in names]


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Sleep and wake of a GPT-2 training process: streampool (vmm) against "
        "torch_memory_saver (bench/sleep.py, BENCHMARKS.md).")
    parser.add_argument("--out-dir", type=Path, default=Path("bench-sleep"),
                        help="where sleep.json, sleep.md and the children's logs go "
                        "(default bench-sleep)")
    parser.add_argument("--configs", type=_configs, default=list(CONFIGS),
                        help=f"comma-separated, from {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--timeout-s", type=_positive, default=CHILD_TIMEOUT_S,
                        help=f"seconds a child may take (default {CHILD_TIMEOUT_S:g})")
    parser.add_argument("--buffer-gib", type=_positive, default=None,
                        help="the inference buffer in GiB (default 4)")
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(list(argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parse_args(argv)
    if options.child:
        if options.out is None:
            print(f"{COMMAND} --child needs --out FILE", file=sys.stderr)
            return 2
        from .sleep_child import child  # torch, in the child only

        return child(options.child, options.out)
    return run_parent(options, argv)


if __name__ == "__main__":
    sys.exit(main())

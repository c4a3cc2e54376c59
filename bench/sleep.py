"""Sleep and wake: how much device memory a sleeping training process gives back,
how fast it sleeps and wakes against the host link, and whether everything comes back bit for
bit; streampool on the vmm backend against torch_memory_saver (a GPU benchmark).

``python3 -m bench.sleep [--configs a,b] [--out-dir DIR]`` runs each configuration in a child
process of its own (``python3 -m bench.sleep --child CONFIG --out FILE``), one after the other,
and writes DIR/sleep.json (every child's record, the table's figures), DIR/sleep.md and
DIR/child-CONFIG.log (each child's output); it prints one line per configuration last, and
exits 0 only if every child ran to the end (a mismatch is a result, not a failure).
``python3 -m bench --group sleep`` runs the same (``run_configs``, plan.SLEEP_CONFIGS) into its
--out-dir's sleep/ and keeps the figures in its results.json and report.

The configurations (CONFIGS):

- ``native``: PyTorch's caching allocator, no sleep: the workload's footprint.
- ``streampool-vmm``: ``streampool.install(backend="vmm", idle_release="off")`` before CUDA
  starts (without the idle release, which would give back what the training step left unused
  2 s after its last free, the sleep gives back everything itself and its time counts all of
  it); sleep is ``streampool.sleep(level=1)`` (it synchronises and gives every page back, the
  cache's too, what live tensors hold waiting in page-locked host memory; its return, the bytes
  it gave back, is recorded for both cycles), wake is ``streampool.wake()``.
- ``streampool-vmm-reserved``: the same, with ``streampool.reserve_sleep_buffer()`` called
  before the first sleep and timed apart (``reserve_s``): the host buffer is pinned ahead, as a
  trainer would while training runs, so the first sleep's time is the copies and page calls.
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

Figures (``row``): given back = (held before - held asleep) / the allocator's reserved bytes
before (``torch.cuda.memory_reserved()``), the share of what the allocator held that left the
device (what the process holds outside the allocator, library handles and kernels the workload
loaded included, is in both readings; given back beyond the context, (held before - held
asleep) / (held before - context), is reported beside it); sleep
and wake GB/s = the workload's live tensor bytes (what must be kept: parameters, buffers,
optimizer state, the inference buffer; the same for every configuration) / seconds, 1 GB =
1e9 bytes, against the host link's device-to-host (sleep) and host-to-device (wake) rate read in
the same child. Held memory is this process's device memory from NVML where the driver lists
the process, else the device's used memory (total - free, from ``torch.cuda.mem_get_info``);
the record says which.

Invariant: the parent never imports torch (bench/sleep_child.py, the child's side, does); a
child writes its record to --out after every stage, so a child that dies or runs out of time
still leaves what it measured, and whatever goes wrong in it is caught and recorded with the
stage it happened in. The figures and the report are pure functions (bench/sleep_report.py):
the CPU tests (bench/tests/test_sleep_report.py) render fabricated records through them.
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
from .sleep_report import (  # noqa: F401  (re-exported for the child and the tests)
    CONFIGS, DESCRIPTIONS, GB, GIB, NATIVE, STREAMPOOL, STREAMPOOL_RESERVED, STREAMPOOLS,
    TARGET_GIVEN_BACK_PCT, TARGET_LINK_PCT, TMS,
    TMS_REPORTED_GIVEN_BACK_PCT, TMS_TORCH, build_report, exit_status, finite, given_back_pct,
    allocator_given_back_pct, memory_source, render_markdown, row, summary_lines)

COMMAND = "python3 -m bench.sleep"
ROOT = Path(__file__).resolve().parent.parent

CHILD_TIMEOUT_S = 150.0
CUBLAS_WORKSPACE = ":4096:8"
# Settings of PyTorch's allocator that would change the footprint (and that torch_memory_saver
# refuses with expandable segments): removed from the children's environment.
REMOVED_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
PRELOADED_VARIABLE = "BENCH_SLEEP_PRELOADED"  # set on the re-executed tms child
BUFFER_VARIABLE = "BENCH_SLEEP_BUFFER_GIB"  # --buffer-gib, for the children


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


def run_configs(configs: Sequence[str], out_dir: Path, environ: Dict[str, str],
                timeout_s: float, command: str, buffer_gib: Optional[float] = None,
                child: Optional[Callable[..., Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Runs ``configs``, a child each, one after the other; writes out_dir/sleep.json and
    sleep.md and returns the report (``build_report``). ``python3 -m bench --group sleep`` runs
    it too."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = child_environment(environ, Path.cwd())
    if buffer_gib is not None:
        env[BUFFER_VARIABLE] = str(buffer_gib)
    records: Dict[str, Dict[str, Any]] = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    for config in configs:
        protocol.progress(f"sleep: {config} ...")
        record = (child or run_child)(config, out_dir, env, timeout_s)
        records[config] = record
        state = "ok" if record.get("ok") else f"FAILED at {record.get('stage')}"
        protocol.progress(f"sleep: {config} {state} in {record['wall_s']:.1f} s")
    meta = {
        "command": command,
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "configs": list(configs),
        "removed_variables": [k for k in REMOVED_VARIABLES if k in environ],
        "facts": _facts(records),
    }
    report = build_report(records, meta)
    (out_dir / "sleep.json").write_text(
        json.dumps(finite(report), indent=1, allow_nan=False, default=str) + "\n")
    (out_dir / "sleep.md").write_text(render_markdown(report))
    protocol.progress(f"wrote {out_dir / 'sleep.md'} and sleep.json")
    return report


def run_parent(options: argparse.Namespace, argv: Sequence[str]) -> int:
    command = " ".join([COMMAND] + [shlex.quote(a) for a in argv])
    report = run_configs(options.configs, options.out_dir, dict(os.environ), options.timeout_s,
                         command, options.buffer_gib)
    out_dir = options.out_dir.resolve()
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

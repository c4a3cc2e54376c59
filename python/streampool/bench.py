"""GPU benchmark: streampool against PyTorch's allocators (and RMM's where installed).

``python -m streampool bench [--quick] [--markdown BENCHMARKS.md] ...``

Every configuration runs in its own child process (an allocator can be installed only once per
process; this parent never touches CUDA). One child runs all selected workloads for its
configuration, in a fixed order, releasing memory between them. Configurations are interleaved
(repeat 1: native, expandable, ..., repeat 2: native, ...) and every reported time is the median
over repeats of (configuration's time / native's time in the same repeat), with the spread.

Memory: ``peak_device_bytes`` is the largest (free device memory at workload start - free device
memory now) seen after each step (``torch.cuda.mem_get_info``); ``peak_live_bytes`` is native's
``torch.cuda.max_memory_allocated()`` during the workload, above what was live at its start;
``peak_memory_ratio`` is their quotient (same repeat), not reported for the ``empty_*`` workloads.
A configuration that still holds much more memory than native when a workload starts (a pool that
``torch.cuda.empty_cache()`` cannot shrink) gets ``peak_memory_lower_bound: true``: memory it
held before the start is not counted, so its real footprint is at least the ratio shown.

Outputs: ``<out-dir>/latest.json``, ``<out-dir>/latest.png``, optionally a markdown report, and a
compact summary as the last lines on stdout. Progress goes to stderr.
"""

import argparse
import collections
import datetime
import functools
import gc
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

# --- what is measured ------------------------------------------------------------------------

NATIVE = "native"
RMM_CONFIGS = ("rmm-pool", "rmm-async")
# Configuration -> PYTORCH_CUDA_ALLOC_CONF for its child (None: variable unset).
CONFIG_ALLOC_CONF: Dict[str, Optional[str]] = {
    NATIVE: None,
    "expandable": "expandable_segments:True",
    "torch-async": "backend:cudaMallocAsync",
    "streampool": None,
    "rmm-pool": None,
    "rmm-async": None,
}
CONFIGS = tuple(CONFIG_ALLOC_CONF)
# torch.cuda.get_allocator_backend() each configuration must show, so that a misconfigured child
# fails instead of measuring the wrong allocator.
EXPECTED_BACKEND = {
    NATIVE: "native",
    "expandable": "native",
    "torch-async": "cudaMallocAsync",
    "streampool": "pluggable",
    "rmm-pool": "pluggable",
    "rmm-async": "pluggable",
}

EMPTY_SIZES_BYTES = {"empty_1KiB": 1024, "empty_1MiB": 1024**2, "empty_64MiB": 64 * 1024**2}
# The order in which a child runs its workloads.
WORKLOADS = tuple(EMPTY_SIZES_BYTES) + ("churn", "multistream", "gpt2", "resnet50")


class StepCounts(NamedTuple):
    """Steps run before timing starts, and steps timed."""

    warmup: int
    timed: int


# Workload -> (full run, --quick). A step of an empty_* workload is a round of EMPTY_PAIRS pairs.
STEPS: Dict[str, Tuple[StepCounts, StepCounts]] = {
    **{name: (StepCounts(2, 15), StepCounts(1, 7)) for name in EMPTY_SIZES_BYTES},
    "churn": (StepCounts(20, 100), StepCounts(10, 40)),
    "multistream": (StepCounts(20, 100), StepCounts(10, 40)),
    "gpt2": (StepCounts(20, 60), StepCounts(15, 30)),
    "resnet50": (StepCounts(20, 60), StepCounts(15, 30)),
}
REPEATS_FULL = 3
REPEATS_QUICK = 2
CHILD_TIMEOUT_FULL_S = 900
CHILD_TIMEOUT_QUICK_S = 300

SEED = 1234
EMPTY_PAIRS = 20_000
CHURN_OPS_PER_STEP = 200
CHURN_WINDOW = 64
CHURN_MIN_BYTES = 512
CHURN_MAX_BYTES = 64 * 1024**2
# Shapes that change every step (see varying_schedule): few enough distinct values that the
# warm-up meets each once, so cuBLAS/cuDNN per-shape set-up is not timed.
MULTISTREAM_SIDES = (512, 1024, 1536, 2048, 3072)  # square bf16 matrices
MULTISTREAM_PRODUCTS = 4
GPT2_BATCH = 8
GPT2_SEQ_LENGTHS = tuple(range(128, 1025, 128))
RESNET_BATCHES = tuple(range(32, 129, 16))
RESNET_IMAGE_SIDE = 224

# A configuration holding more than this fraction of native's peak live bytes above what native
# holds at a workload's start has its memory ratio marked as a lower bound.
HELD_LOWER_BOUND_FRACTION = 0.05

# targets.md: (workload, metric, the most streampool may show).
TARGETS: Tuple[Tuple[str, str, float], ...] = (
    ("empty_1KiB", "time_ratio", 1.00),
    ("empty_1MiB", "time_ratio", 1.00),
    ("empty_64MiB", "time_ratio", 1.00),
    ("gpt2", "time_ratio", 0.99),
    ("resnet50", "time_ratio", 0.99),
    ("gpt2", "peak_memory_ratio", 1.03),
    ("resnet50", "peak_memory_ratio", 1.03),
)

RESULT_MARKER = "STREAMPOOL_BENCH "
ERROR_TEXT_CHARS = 600


def has_memory_ratio(workload: str) -> bool:
    """Whether peak_memory_ratio is reported for ``workload`` (not for the empty_* loops)."""
    return workload not in EMPTY_SIZES_BYTES


# --- command line ----------------------------------------------------------------------------


def _name_list(known: Sequence[str], what: str) -> Callable[[str], List[str]]:
    """An argparse type: comma-separated names from ``known``, returned in ``known``'s order."""

    def parse(text: str) -> List[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(known)}"
            )
        return [name for name in known if name in names]

    return parse


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Options of ``python -m streampool bench``; fills in defaults that depend on --quick and
    puts native first among the configurations (every ratio needs it)."""
    parser = argparse.ArgumentParser(
        prog="python -m streampool bench",
        description="Time and memory of streampool against PyTorch's allocators, on the GPU.",
    )
    parser.add_argument(
        "--configs",
        type=_name_list(CONFIGS, "configuration"),
        default=list(CONFIGS),
        help=f"comma-separated, from {','.join(CONFIGS)} (native is always run)",
    )
    parser.add_argument(
        "--workloads",
        type=_name_list(WORKLOADS, "workload"),
        default=list(WORKLOADS),
        help=f"comma-separated, from {','.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"interleaved repeats (default {REPEATS_FULL}, --quick {REPEATS_QUICK})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer steps and repeats (about 8 min)"
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench/results"),
        help="where latest.json and latest.png go (default bench/results)",
    )
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write (replace) this markdown report"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        dest="timeout_s",
        help=f"seconds per child process (default {CHILD_TIMEOUT_FULL_S}, "
        f"--quick {CHILD_TIMEOUT_QUICK_S})",
    )
    parser.add_argument(
        "--variant",
        type=_variant,
        action="append",
        default=[],
        metavar="LABEL:VAR=VALUE[,VAR=VALUE]",
        help="also run streampool with these STREAMPOOL_* settings, as configuration "
        "streampool:LABEL (repeatable), e.g. small:STREAMPOOL_SMALL_POOL_MAX=1MiB",
    )
    parser.add_argument("--child", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(list(argv))
    if options.repeats is None:
        options.repeats = REPEATS_QUICK if options.quick else REPEATS_FULL
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    if options.timeout_s is None:
        options.timeout_s = CHILD_TIMEOUT_QUICK_S if options.quick else CHILD_TIMEOUT_FULL_S
    if NATIVE not in options.configs:
        options.configs.insert(0, NATIVE)
    options.variants = dict(options.variant)
    if len(options.variants) != len(options.variant):
        parser.error("--variant labels must differ")
    options.configs += [VARIANT_PREFIX + label for label in options.variants]
    return options


VARIANT_PREFIX = "streampool:"


def _variant(text: str) -> Tuple[str, Dict[str, str]]:
    """``LABEL:VAR=VALUE[,VAR=VALUE]`` -> (label, {VAR: VALUE}); only STREAMPOOL_* variables."""
    label, sep, settings = text.partition(":")
    env = dict(item.partition("=")[::2] for item in settings.split(",") if item)
    bad = [v for v in env if not v.startswith("STREAMPOOL_") or not env[v]]
    if not sep or not label or not env or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected LABEL:STREAMPOOL_VAR=VALUE[,STREAMPOOL_VAR=VALUE...]"
        )
    return label, env


def command_line(argv: Sequence[str], environ: Dict[str, str]) -> str:
    """The command as a user would retype it, with the STREAMPOOL_* variables that shape the
    allocator's behaviour (not STREAMPOOL_LIBRARY, a machine's path; the version is reported)."""
    variables = [
        f"{name}={shlex.quote(value)}"
        for name, value in sorted(environ.items())
        if name.startswith("STREAMPOOL_") and name != "STREAMPOOL_LIBRARY"
    ]
    return " ".join(variables + ["python3 -m streampool bench"] + [shlex.quote(a) for a in argv])


# --- parent: running children ----------------------------------------------------------------


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def child_command(config: str, workloads: Sequence[str], quick: bool) -> List[str]:
    """argv of the child process that measures ``config`` on ``workloads``."""
    command = [
        sys.executable,
        "-m",
        "streampool.bench",
        "--child",
        config,
        "--workloads",
        ",".join(workloads),
    ]
    return command + (["--quick"] if quick else [])


def child_environment(config: str, environ: Dict[str, str]) -> Dict[str, str]:
    """``environ`` with the allocator settings of ``config`` and this package on PYTHONPATH."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    }
    if CONFIG_ALLOC_CONF[config] is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = CONFIG_ALLOC_CONF[config]
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, environ.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"  # models are built from configs; never reach for the network
    return env


class ChildOutcome(NamedTuple):
    """What a child process left: stdout, the tail of stderr, and why it failed (or None)."""

    stdout: str
    stderr_tail: str
    failure: Optional[str]


def run_process(
    command: List[str], env: Dict[str, str], timeout_s: float, label: str
) -> ChildOutcome:
    """Run ``command``, echoing its stderr (prefixed with ``label``) to ours as it comes."""
    tail: collections.deque = collections.deque(maxlen=30)
    with tempfile.TemporaryFile(mode="w+", errors="replace") as stdout_file:
        process = subprocess.Popen(
            command,
            env=env,
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
        return ChildOutcome(stdout_file.read(), "".join(tail), failure)


def _tail(text: str) -> str:
    """The last ERROR_TEXT_CHARS characters of ``text`` (a log: the end says most), stripped."""
    text = text.strip()
    return text if len(text) <= ERROR_TEXT_CHARS else "..." + text[-ERROR_TEXT_CHARS:]


def _exception_text(exc: BaseException) -> str:
    """``Type: message``, cut to ERROR_TEXT_CHARS (the start of a message says most)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= ERROR_TEXT_CHARS else text[:ERROR_TEXT_CHARS] + "..."


def parse_child_output(outcome: ChildOutcome, workloads: Sequence[str]) -> Dict[str, Any]:
    """``{"status", "info", "workloads": {name: record}}`` from a child's marker lines; every
    workload without a record gets ``{"error": why}``."""
    info: Dict[str, Any] = {}
    records: Dict[str, Dict[str, Any]] = {}
    status, reason = "ok", None
    for line in outcome.stdout.splitlines():
        if not line.startswith(RESULT_MARKER):
            continue
        message = json.loads(line[len(RESULT_MARKER) :])
        if message["kind"] == "info":
            info = message["info"]
        elif message["kind"] == "workload":
            records[message["workload"]] = message["record"]
        else:  # "skipped" or "setup_error"
            status, reason = message["kind"], message["reason"]
    if status == "skipped":
        reason = f"skipped: {reason}"
    if outcome.failure is not None and status == "ok":
        status, reason = "failed", _tail(f"{outcome.failure}: {outcome.stderr_tail}")
    missing = {
        name: {"error": reason or "the child printed no result for it"}
        for name in workloads
        if name not in records
    }
    result = {"status": status, "info": info, "workloads": {**records, **missing}}
    if outcome.failure is not None:
        result["process_failure"] = outcome.failure
    return result


def run_child(config: str, options: argparse.Namespace, label: str) -> Dict[str, Any]:
    """Measure ``config`` on the selected workloads in a fresh process (a ``streampool:LABEL``
    variant is streampool with its settings added to the environment)."""
    base, settings = config, {}
    if config.startswith(VARIANT_PREFIX):
        base, settings = "streampool", options.variants[config[len(VARIANT_PREFIX) :]]
    outcome = run_process(
        child_command(base, options.workloads, options.quick),
        child_environment(base, {**os.environ, **settings}),
        options.timeout_s,
        label,
    )
    return parse_child_output(outcome, options.workloads)


def run_all(
    options: argparse.Namespace,
    runner: Callable[[str, argparse.Namespace, str], Dict[str, Any]] = run_child,
) -> List[Dict[str, Dict[str, Any]]]:
    """One ``{config: child result}`` per repeat, configurations interleaved within each repeat.
    A configuration that was skipped or failed to set up is not started again."""
    runs: List[Dict[str, Dict[str, Any]]] = []
    settled: Dict[str, Dict[str, Any]] = {}
    for repeat in range(1, options.repeats + 1):
        run: Dict[str, Dict[str, Any]] = {}
        for config in options.configs:
            if config in settled:
                run[config] = settled[config]
                continue
            label = f"[{repeat}/{options.repeats}] {config}"
            _progress(f"{label}: running {', '.join(options.workloads)}")
            started_s = time.perf_counter()
            run[config] = runner(config, options, label)
            _progress(
                f"{label}: {run[config]['status']} in {time.perf_counter() - started_s:.1f} s"
            )
            if run[config]["status"] in ("skipped", "setup_error"):
                settled[config] = run[config]
        runs.append(run)
    return runs


# --- parent: aggregation ---------------------------------------------------------------------


def _median_int(values: Sequence[int]) -> int:
    return int(round(statistics.median(values)))


def _ratio_fields(name: str, ratios: Sequence[float]) -> Dict[str, float]:
    return {name: statistics.median(ratios), f"{name}_min": min(ratios), f"{name}_max": max(ratios)}


def _memory_fields(
    workload: str, pairs: Sequence[Tuple[Dict[str, Any], Dict[str, Any]]]
) -> Dict[str, Any]:
    """peak_device_bytes, peak_live_bytes (native's), peak_memory_ratio (+ spread, lower-bound flag)
    from (config record, native record) pairs of the same repeats."""
    device = _median_int([mine["peak_device_bytes"] for mine, _ in pairs])
    live = _median_int([native["peak_live_bytes"] for _, native in pairs])
    fields: Dict[str, Any] = {
        "peak_device_bytes": device,
        "peak_live_bytes": live,
        "held_at_start_bytes": _median_int([m["held_at_start_bytes"] for m, _ in pairs]),
        "peak_memory_ratio": None,
    }
    if not has_memory_ratio(workload) or live <= 0:
        return fields
    fields.update(
        _ratio_fields(
            "peak_memory_ratio", [m["peak_device_bytes"] / n["peak_live_bytes"] for m, n in pairs]
        )
    )
    excess_held_bytes = statistics.median(
        [m["held_at_start_bytes"] - n["held_at_start_bytes"] for m, n in pairs]
    )
    fields["peak_memory_lower_bound"] = excess_held_bytes > HELD_LOWER_BOUND_FRACTION * live
    return fields


def aggregate_cell(
    runs: Sequence[Dict[str, Dict[str, Any]]], config: str, workload: str
) -> Dict[str, Any]:
    """The result of ``config`` on ``workload`` over all repeats, as ratios to native's run of the
    same repeat. ``{"error": ...}`` when no repeat produced both numbers."""
    pairs, errors = [], []
    for run in runs:
        mine, native = run[config]["workloads"][workload], run[NATIVE]["workloads"][workload]
        if "error" in mine:
            errors.append(mine["error"])
        elif "error" in native:
            errors.append(f"native failed in the same repeat: {native['error']}")
        else:
            pairs.append((mine, native))
    if not pairs:
        return {"error": errors[0]}
    cell: Dict[str, Any] = _ratio_fields(
        "time_ratio", [mine["median_time_us"] / native["median_time_us"] for mine, native in pairs]
    )
    cell["median_time_us"] = statistics.median([mine["median_time_us"] for mine, _ in pairs])
    cell["repeats_measured"] = len(pairs)
    cell.update(_memory_fields(workload, pairs))
    if errors:
        cell["repeat_errors"] = errors
    return cell


def aggregate(
    runs: Sequence[Dict[str, Dict[str, Any]]], configs: Sequence[str], workloads: Sequence[str]
) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``{workload: {config: cell}}`` (see aggregate_cell)."""
    return {w: {c: aggregate_cell(runs, c, w) for c in configs} for w in workloads}


def run_facts(runs: Sequence[Dict[str, Dict[str, Any]]]) -> Dict[str, str]:
    """GPU name, torch and CUDA versions (from the first child that reported them) and the
    streampool version (from a streampool child)."""
    infos = [run[config]["info"] for run in runs for config in run if run[config]["info"]]
    first = infos[0] if infos else {}
    versions = [info["streampool_version"] for info in infos if "streampool_version" in info]
    return {
        "device": first.get("device", "unknown (no child started CUDA)"),
        "torch": first.get("torch", "unknown"),
        "cuda": first.get("cuda", "unknown"),
        "streampool": versions[0] if versions else "unknown (the streampool child did not start)",
    }


def driver_version() -> str:
    """The NVIDIA driver version from nvidia-smi, or why it is unknown."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__})"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def build_report(
    runs: Sequence[Dict[str, Dict[str, Any]]],
    options: argparse.Namespace,
    command: str,
    date: str,
    driver: str,
) -> Dict[str, Any]:
    """The latest.json document."""
    facts = run_facts(runs)
    return {
        "device": facts["device"],
        "driver": driver,
        "torch": facts["torch"],
        "cuda": facts["cuda"],
        "streampool": facts["streampool"],
        "date": date,
        "command": command,
        "quick": options.quick,
        "repeats": options.repeats,
        "configs": list(options.configs),
        "variants": dict(getattr(options, "variants", {})),
        "workloads": aggregate(runs, options.configs, options.workloads),
        "raw": list(runs),
    }


# --- parent: reports -------------------------------------------------------------------------


def _ratio_text(cell: Dict[str, Any], metric: str, digits: int = 2) -> str:
    """``0.97×`` with its spread over repeats, ``≥`` for a lower bound, ``—`` when absent."""
    value = cell.get(metric)
    if value is None:
        return "—"
    bound = "≥" if metric == "peak_memory_ratio" and cell.get("peak_memory_lower_bound") else ""
    low, high = cell[f"{metric}_min"], cell[f"{metric}_max"]
    spread = f" ({low:.{digits}f}–{high:.{digits}f})" if low != high else ""
    return f"{bound}{value:.{digits}f}×{spread}"


def failure_word(cell: Dict[str, Any]) -> str:
    """ "skipped" or "failed" for a cell with an error."""
    return "skipped" if cell["error"].startswith("skipped") else "failed"


def _time_text_us(workload: str, time_us: float) -> str:
    """``2.10 µs/pair`` for the empty_* loops, ``41.20 ms/step`` otherwise."""
    if workload in EMPTY_SIZES_BYTES:
        return f"{time_us:.2f} µs/pair"
    return f"{time_us / 1000:.2f} ms/step"


CellText = Callable[[str, Dict[str, Any]], str]  # (workload, cell) -> table cell


def _table(report: Dict[str, Any], workloads: Sequence[str], text: CellText) -> List[str]:
    """A markdown table, one row per workload, one column per configuration."""
    configs = report["configs"]
    lines = ["| workload | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for workload in workloads:
        cells = report["workloads"][workload]
        texts = [
            failure_word(cells[c]) if "error" in cells[c] else text(workload, cells[c])
            for c in configs
        ]
        lines.append(f"| `{workload}` | " + " | ".join(texts) + " |")
    return lines


def target_rows(report: Dict[str, Any]) -> List[Tuple[str, str, str, str, str]]:
    """(workload, metric, target, streampool's measurement, status) for each target of targets.md
    whose workload ran; status is "met", "not met" or why it cannot be judged."""
    rows = []
    for workload, metric, limit in TARGETS:
        if workload not in report["workloads"]:
            continue
        cell = report["workloads"][workload].get("streampool", {"error": "streampool not run"})
        target = f"≤ {limit:.2f}×"
        if "error" in cell:
            rows.append((workload, metric, target, "—", "not measured"))
            continue
        measured = _ratio_text(cell, metric, digits=3)  # as precise as the judgement
        if metric == "peak_memory_ratio" and cell.get("peak_memory_lower_bound"):
            status = "not judged (memory held before the workload)"
        else:
            status = "met" if cell[metric] <= limit else "not met"
        rows.append((workload, metric, target, measured, status))
    return rows


def _best_other(report: Dict[str, Any], workload: str, metric: str) -> str:
    """The best configuration other than streampool and native on ``metric``, from this run; a
    memory ratio that is only a lower bound (memory held before the workload) is no measure."""
    cells = {
        c: cell
        for c, cell in report["workloads"][workload].items()
        if c not in ("streampool", NATIVE)
        and cell.get(metric) is not None
        and not (metric == "peak_memory_ratio" and cell.get("peak_memory_lower_bound"))
    }
    if not cells:
        return "—"
    best = min(cells, key=lambda c: cells[c][metric])
    return f"{best} {_ratio_text(cells[best], metric, digits=3)}"


def _failure_lines(report: Dict[str, Any]) -> List[str]:
    """One item per (configuration, error): what failed or was skipped, in which workloads, and
    repeats that failed although others were measured."""
    failed: Dict[Tuple[str, str], List[str]] = collections.defaultdict(list)
    for workload, cells in report["workloads"].items():
        for config, cell in cells.items():
            if "error" in cell:
                failed[(config, " ".join(cell["error"].split()))].append(workload)
            for error in cell.get("repeat_errors", []):
                failed[(config, "in one repeat: " + " ".join(error.split()))].append(workload)
    lines = [
        f"- `{config}` ({', '.join(workloads)}): {error}"
        for (config, error), workloads in failed.items()
    ]
    return ["", "## Failed or skipped", ""] + lines if lines else []


def markdown(report: Dict[str, Any]) -> str:
    """The markdown report: machine, command, one table per metric, targets, failures."""
    workloads = list(report["workloads"])
    memory_workloads = [w for w in workloads if has_memory_ratio(w)]
    lines = [
        "# streampool benchmarks",
        "",
        f"- GPU: {report['device']}, driver {report['driver']}",
        f"- torch {report['torch']} (CUDA {report['cuda']}), streampool {report['streampool']}",
        f"- date: {report['date']}",
        f"- command: `{report['command']}`",
        f"- {report['repeats']} repeat(s); within a repeat the configurations run one after the "
        "other, each in its own process. A cell is the median over repeats of the ratio to "
        "native in the same repeat, with the spread (min–max) in parentheses.",
        "",
        "## Time ×native (lower is better)",
        "",
        *_table(report, workloads, lambda w, cell: _ratio_text(cell, "time_ratio")),
        "",
        "Median times on this machine (`empty_*`: host time of one `torch.empty` + `del` pair; "
        "others: one step, between synchronisations):",
        "",
        *_table(report, workloads, lambda w, cell: _time_text_us(w, cell["median_time_us"])),
    ]
    if memory_workloads:
        lines += [
            "",
            "## Peak device memory used ÷ native's peak live tensor bytes (lower is better)",
            "",
            "Peak device memory used: the largest drop of free device memory since the workload "
            "started, read after each step. `≥`: the configuration held memory from before the "
            "workload that `torch.cuda.empty_cache()` did not return, so the ratio is a lower "
            "bound.",
            "",
            *_table(
                report, memory_workloads, lambda w, cell: _ratio_text(cell, "peak_memory_ratio")
            ),
        ]
    lines += [
        "",
        "## Targets (targets.md), streampool in this run",
        "",
        "| workload | metric | target | streampool | best other in this run | status |",
        "|---|---|---|---|---|---|",
    ]
    for workload, metric, target, measured, status in target_rows(report):
        best = _best_other(report, workload, metric)
        lines.append(f"| `{workload}` | {metric} | {target} | {measured} | {best} | {status} |")
    lines += _failure_lines(report)
    return "\n".join(lines) + "\n"


def write_plot(report: Dict[str, Any], path: Path) -> None:
    """A PNG of time ratios (top) and memory ratios (bottom), one bar per configuration,
    whiskers spanning the repeats' min..max."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = list(report["workloads"])
    panels = [
        ("time_ratio", "time ×native", workloads),
        (
            "peak_memory_ratio",
            "peak device memory ÷ native peak live",
            [w for w in workloads if has_memory_ratio(w)],
        ),
    ]
    figure = Figure(figsize=(max(8.0, 1.5 * len(workloads)), 8.0), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, (metric, title, names) in zip(figure.subplots(2, 1), panels):
        _bar_panel(axes, report, metric, names)
        axes.set_title(f"{title} (median of {report['repeats']} repeat(s))")
    figure.suptitle(
        f"streampool {report['streampool']} on {report['device']}, torch {report['torch']}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _bar_panel(axes: Any, report: Dict[str, Any], metric: str, workloads: Sequence[str]) -> None:
    """Grouped bars of ``metric``: a group per workload, a bar per configuration that has a value
    (each configuration keeps its colour across panels), labelled with the value."""
    columns = [
        (colour, config, [(p, report["workloads"][w][config]) for p, w in enumerate(workloads)])
        for colour, config in enumerate(report["configs"])
    ]
    columns = [
        (colour, config, [(p, c) for p, c in cells if c.get(metric) is not None])
        for colour, config, cells in columns
    ]
    columns = [column for column in columns if column[2]]
    width = 0.8 / max(1, len(columns))
    for slot, (colour, config, cells) in enumerate(columns):
        xs = [p - 0.4 + width * (slot + 0.5) for p, _ in cells]
        values = [c[metric] for _, c in cells]
        whiskers = [
            [c[metric] - c[f"{metric}_min"] for _, c in cells],
            [c[f"{metric}_max"] - c[metric] for _, c in cells],
        ]
        bars = axes.bar(
            xs, values, width, yerr=whiskers, capsize=2, label=config, color=f"C{colour}"
        )
        axes.bar_label(bars, fmt="%.2f", fontsize=6, padding=2)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(workloads)), workloads)
    if columns:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def summary_lines(report: Dict[str, Any]) -> List[str]:
    """One line per workload: each configuration's time ratio and, where reported, memory ratio."""
    lines = [
        f"streampool bench on {report['device']}: time ×native [memory ÷ native peak live], "
        f"median of {report['repeats']} repeat(s)"
    ]
    width = max(len(w) for w in report["workloads"])
    for workload, cells in report["workloads"].items():
        parts = []
        for config, cell in cells.items():
            if "error" in cell:
                parts.append(f"{config} {failure_word(cell)}")
                continue
            memory = cell.get("peak_memory_ratio")
            bound = "≥" if cell.get("peak_memory_lower_bound") else ""
            memory_text = f" [{bound}{memory:.2f}]" if memory is not None else ""
            parts.append(f"{config} {cell['time_ratio']:.2f}{memory_text}")
        lines.append(f"{workload:<{width}}  " + "  ".join(parts))
    return lines


def write_outputs(report: Dict[str, Any], out_dir: Path, markdown_path: Optional[Path]) -> None:
    """latest.json, the markdown report if asked for, then latest.png; a plot that cannot be
    drawn (no matplotlib, an old one) is reported on stderr and loses nothing else."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    _progress(f"wrote {out_dir / 'latest.json'}")
    if markdown_path is not None:
        markdown_path.write_text(markdown(report))
        _progress(f"wrote {markdown_path}")
    try:
        write_plot(report, out_dir / "latest.png")
        _progress(f"wrote {out_dir / 'latest.png'}")
    except Exception as exc:  # the plot is optional; the numbers are already written
        _progress(f"no plot: {type(exc).__name__}: {exc}")


# --- child: allocator set-up -----------------------------------------------------------------


class Skipped(Exception):
    """The configuration cannot run on this machine (its package is not installed)."""


def _emit(kind: str, **fields: Any) -> None:
    """One marker line on stdout for the parent."""
    print(RESULT_MARKER + json.dumps({"kind": kind, **fields}, allow_nan=False), flush=True)


def _rmm_resource(rmm: Any, config: str) -> Any:
    if config == "rmm-pool":
        return rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())
    return rmm.mr.CudaAsyncMemoryResource()


def install_allocator(config: str) -> Callable[[], None]:
    """Make ``config``'s allocator PyTorch's, before CUDA starts. Returns what must run once the
    CUDA context exists (RMM's memory resource is created then, so that the memory it takes up
    front counts as held by it). Raises Skipped when RMM is not installed."""
    if config == "streampool":
        import streampool

        streampool.install()
    if config not in RMM_CONFIGS:
        return lambda: None
    try:
        import rmm
    except ImportError as exc:
        raise Skipped(f"rmm is not importable ({exc})") from exc
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    if rmm_torch_allocator is None:
        raise RuntimeError(
            "rmm.allocators.torch.rmm_torch_allocator is None (rmm sees no CUDA torch)"
        )
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    return lambda: rmm.mr.set_current_device_resource(_rmm_resource(rmm, config))


def _warm_up_libraries(torch: Any) -> None:
    """Create the cuBLAS and cuDNN handles (device memory outside any allocator) before the first
    workload, so that no workload's memory includes them."""
    matrix = torch.randn(256, 256, device="cuda")
    images = torch.randn(2, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    torch.mm(matrix, matrix)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.mm(matrix, matrix)
        torch.nn.functional.conv2d(images, torch.randn(8, 3, 3, 3, device="cuda"))
    torch.cuda.synchronize()


def _child_info(torch: Any, config: str) -> Dict[str, Any]:
    info = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if config == "streampool":
        import streampool

        info["streampool_version"] = streampool.__version__
        info["streampool_library"] = streampool.library_path()
    return info


def _set_up(config: str) -> Tuple[Any, int]:
    """Install the allocator, start CUDA, warm the libraries up and report the child's facts.
    Returns torch and the free device memory (bytes) before the allocator took any."""
    finish = install_allocator(config)
    import torch

    baseline_free_bytes = torch.cuda.mem_get_info()[0]
    finish()
    info = _child_info(torch, config)
    if info["allocator_backend"] != EXPECTED_BACKEND[config]:
        raise RuntimeError(
            f"allocator backend is {info['allocator_backend']!r}, "
            f"expected {EXPECTED_BACKEND[config]!r} for {config}"
        )
    _warm_up_libraries(torch)
    _release_memory(torch)
    _emit("info", info=info)
    return torch, baseline_free_bytes


def _release_memory(torch: Any) -> None:
    """Drop garbage and return cached memory, as between workloads."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# --- child: workloads ------------------------------------------------------------------------


class Plan(NamedTuple):
    """A workload ready to run: ``step(index)`` runs step ``index``; a step is ``ops_per_step``
    timed operations (pairs for empty_*, 1 otherwise)."""

    step: Callable[[int], None]
    ops_per_step: int


def varying_schedule(values: Sequence[int], count: int, seed: int) -> List[int]:
    """``count`` picks from ``values``, the same on every run: first each value once (shuffled),
    then random picks, never the same value twice in a row."""
    rng = random.Random(seed)
    schedule = list(values)
    rng.shuffle(schedule)
    while len(schedule) < count:
        schedule.append(rng.choice([v for v in values if v != schedule[-1]]))
    return schedule[:count]


def log_uniform_sizes_bytes(count: int, low_bytes: int, high_bytes: int, seed: int) -> List[int]:
    """``count`` sizes log-uniformly spread over [low_bytes, high_bytes], the same on every run."""
    rng = random.Random(seed)
    low, high = math.log(low_bytes), math.log(high_bytes)
    return [
        min(high_bytes, max(low_bytes, int(math.exp(rng.uniform(low, high))))) for _ in range(count)
    ]


def _build_empty(torch: Any, total_steps: int, size_bytes: int) -> Plan:
    def step(_index: int) -> None:
        for _ in range(EMPTY_PAIRS):
            x = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
            del x

    return Plan(step, EMPTY_PAIRS)


def _build_churn(torch: Any, total_steps: int) -> Plan:
    sizes_bytes = log_uniform_sizes_bytes(
        total_steps * CHURN_OPS_PER_STEP, CHURN_MIN_BYTES, CHURN_MAX_BYTES, SEED
    )
    live: collections.deque = collections.deque()

    def step(index: int) -> None:
        first = index * CHURN_OPS_PER_STEP
        for op, size_bytes in enumerate(sizes_bytes[first : first + CHURN_OPS_PER_STEP]):
            live.append(torch.empty(size_bytes, dtype=torch.uint8, device="cuda").fill_(op % 251))
            if len(live) > CHURN_WINDOW:
                live.popleft()

    return Plan(step, 1)


def _build_multistream(torch: Any, total_steps: int) -> Plan:
    """Products made on a side stream, consumed and freed on the main stream (record_stream)."""
    sides = varying_schedule(MULTISTREAM_SIDES, total_steps, SEED)
    side_stream, main_stream = torch.cuda.Stream(), torch.cuda.current_stream()
    torch.manual_seed(SEED)

    def step(index: int) -> None:
        matrix = torch.randn(sides[index], sides[index], device="cuda", dtype=torch.bfloat16)
        side_stream.wait_stream(main_stream)
        with torch.cuda.stream(side_stream):
            products = [matrix @ matrix for _ in range(MULTISTREAM_PRODUCTS)]
        matrix.record_stream(side_stream)
        main_stream.wait_stream(side_stream)
        total = torch.zeros_like(products[0])
        for product in products:
            product.record_stream(main_stream)
            total.add_(product)

    return Plan(step, 1)


def _build_gpt2(torch: Any, total_steps: int) -> Plan:
    """GPT-2 124M from its config (random weights), AdamW, bf16 autocast, varying length."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config()).to("cuda").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = varying_schedule(GPT2_SEQ_LENGTHS, total_steps, SEED)
    vocab = model.config.vocab_size

    def step(index: int) -> None:
        tokens = torch.randint(0, vocab, (GPT2_BATCH, lengths[index]), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Plan(step, 1)


def _build_resnet50(torch: Any, total_steps: int) -> Plan:
    """ResNet-50 (random weights), channels_last, bf16 autocast, SGD, varying batch."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.resnet50().to("cuda", memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = varying_schedule(RESNET_BATCHES, total_steps, SEED)
    side = RESNET_IMAGE_SIDE

    def step(index: int) -> None:
        images = torch.empty(
            (batches[index], 3, side, side), device="cuda", memory_format=torch.channels_last
        ).normal_()
        labels = torch.randint(0, 1000, (batches[index],), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Plan(step, 1)


BUILDERS: Dict[str, Callable[..., Plan]] = {
    **{
        name: functools.partial(_build_empty, size_bytes=size)
        for name, size in EMPTY_SIZES_BYTES.items()
    },
    "churn": _build_churn,
    "multistream": _build_multistream,
    "gpt2": _build_gpt2,
    "resnet50": _build_resnet50,
}


def _time_steps(
    torch: Any, plan: Plan, counts: StepCounts, start_free_bytes: int
) -> Tuple[List[float], int]:
    """Run warm-up and timed steps, each between two synchronisations. Returns the timed steps'
    host times (seconds) and the peak device memory used since the start (bytes), read after
    every step, warm-up included."""
    times_s: List[float] = []
    peak_device_bytes = 0
    torch.cuda.synchronize()
    for index in range(counts.warmup + counts.timed):
        started_s = time.perf_counter()
        plan.step(index)
        torch.cuda.synchronize()
        elapsed_s = time.perf_counter() - started_s
        if index >= counts.warmup:
            times_s.append(elapsed_s)
        peak_device_bytes = max(peak_device_bytes, start_free_bytes - torch.cuda.mem_get_info()[0])
    return times_s, peak_device_bytes


def _streampool_record(before: Dict[str, int]) -> Dict[str, int]:
    """streampool's own view of a workload since ``before`` (its memory_stats() at the start):
    peak live bytes above the start (a cross-check of native's), allocations, cache hits, device
    allocations, waits before growth, retries, OOMs, and what it held at the end."""
    import streampool

    after = streampool.memory_stats()
    counts = {
        key: after[key] - before[key]
        for key in (
            "allocation.all.allocated",
            "cache_hits",
            "num_device_alloc",
            "num_growth_syncs",
            "num_alloc_retries",
            "num_ooms",
        )
    }
    return {
        **counts,
        "peak_live_bytes": after["allocated_bytes.all.peak"]
        - before["allocated_bytes.all.current"],
        "reserved_bytes_at_end": after["reserved_bytes.all.current"],
        "cached_bytes_at_end": after["cached_bytes"],
    }


def _start_live_tracking(torch: Any, config: str) -> Callable[[], Dict[str, Any]]:
    """Reset the allocator's peak statistics where it keeps them (native, streampool); returns
    what gives the workload's record fields from them at its end."""
    if config == NATIVE:
        torch.cuda.reset_peak_memory_stats()
        live_at_start_bytes = torch.cuda.memory_allocated()
        return lambda: {"peak_live_bytes": torch.cuda.max_memory_allocated() - live_at_start_bytes}
    if config == "streampool":
        import streampool

        streampool.reset_peak_memory_stats()
        before = streampool.memory_stats()
        return lambda: {"streampool": _streampool_record(before)}
    return lambda: {}


def run_workload(
    torch: Any, config: str, workload: str, quick: bool, baseline_free_bytes: int
) -> Dict[str, Any]:
    """Measure one workload in this (already set up) child process."""
    counts = STEPS[workload][1 if quick else 0]
    start_free_bytes = torch.cuda.mem_get_info()[0]
    record: Dict[str, Any] = {"held_at_start_bytes": baseline_free_bytes - start_free_bytes}
    live_fields = _start_live_tracking(torch, config)
    plan = BUILDERS[workload](torch, counts.warmup + counts.timed)
    times_s, record["peak_device_bytes"] = _time_steps(torch, plan, counts, start_free_bytes)
    record["median_time_us"] = statistics.median(times_s) * 1e6 / plan.ops_per_step
    record["timed_steps"] = counts.timed
    record.update(live_fields())
    return record


def child_main(config: str, workloads: Sequence[str], quick: bool) -> int:
    """Measure ``config`` on ``workloads``; one marker line per workload on stdout."""
    try:
        torch, baseline_free_bytes = _set_up(config)
    except Skipped as exc:
        _emit("skipped", reason=str(exc))
        return 0
    except Exception as exc:  # reported to the parent, which goes on with other configurations
        traceback.print_exc()
        _emit("setup_error", reason=_exception_text(exc))
        return 0
    for workload in workloads:
        print(f"{workload}: running", file=sys.stderr, flush=True)
        try:
            record = run_workload(torch, config, workload, quick, baseline_free_bytes)
        except Exception as exc:  # one workload failing (OOM, ...) must not lose the others
            traceback.print_exc()
            record = {"error": _exception_text(exc)}
        print(f"{workload}: {_record_text(workload, record)}", file=sys.stderr, flush=True)
        _emit("workload", workload=workload, record=record)
        _release_memory(torch)  # raises if the CUDA context died: the parent blames the rest
    return 0


def _record_text(workload: str, record: Dict[str, Any]) -> str:
    if "error" in record:
        return f"failed: {record['error']}"
    return (
        f"{_time_text_us(workload, record['median_time_us'])}, "
        f"peak device used {record['peak_device_bytes'] / 2**20:.1f} MiB"
    )


# --- entry point -----------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m streampool bench``: run the configurations, write the reports, summarise."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parse_args(argv)
    if options.child is not None:
        return child_main(options.child, options.workloads, options.quick)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = run_all(options)
    report = build_report(
        runs, options, command_line(argv, dict(os.environ)), date, driver_version()
    )
    write_outputs(report, options.out_dir, options.markdown)
    print("\n".join(summary_lines(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python3 -m bench``: options, the run from start to end, and the files it writes.

Invariant: the parent never imports torch or touches CUDA; it writes only into ``--out-dir``
(latest.json after every repeat, so a run cut short still leaves its repeats; latest.md and
latest.png at the end), and the command it records is the one that was typed, with the
STREAMPOOL_* variables that shape the allocator.
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

from . import child, cotenant, markdown, plot, protocol, report, runner, stats, targets
from .configs import (
    CONFIG_NAMES,
    NATIVE,
    VARIANT_PREFIX,
    child_environment,
    cotenant_configs,
    parse_variant,
    resolve,
    workloads_of,
)
from .schedules import COTENANT, TIMED_WORKLOADS, WORKLOADS

REPEATS_FULL = stats.METHOD_REPEATS
REPEATS_QUICK = 3
# The GPU machine allows 10 minutes per command: stop starting repeats in time to write reports.
TIME_BUDGET_FULL_S = 530
TIME_BUDGET_QUICK_S = 240
CHILD_TIMEOUT_S = 180
COTENANT_TIMEOUT_S = 120
COMMAND = "python3 -m bench"


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
    """The options; fills in what depends on --quick and puts native first (every ratio needs
    it), then the variants as ``streampool:LABEL``."""
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Time and memory of streampool against PyTorch's allocators, on the GPU "
        "(run from the repository root; BENCHMARKS.md describes the method).",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        required=True,
        help="where latest.json, latest.md and latest.png go (created)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{REPEATS_QUICK} repeats and a shorter co-tenant (as many as fit its time budget)",
    )
    parser.add_argument(
        "--configs",
        type=_name_list(CONFIG_NAMES, "configuration"),
        default=list(CONFIG_NAMES),
        help=f"comma-separated, from {','.join(CONFIG_NAMES)} (native always runs)",
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
        "--cotenant-repeats",
        type=int,
        default=1,
        help="rounds of the co-tenant workload (default 1)",
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help=f"start no repeat that would end past this many seconds from the "
        f"start (default {TIME_BUDGET_FULL_S}, --quick {TIME_BUDGET_QUICK_S}; 0: none)",
    )
    parser.add_argument(
        "--child-timeout-s",
        type=float,
        default=CHILD_TIMEOUT_S,
        help=f"seconds per child process (default {CHILD_TIMEOUT_S})",
    )
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        metavar="LABEL:VAR=VALUE[,VAR=VALUE]",
        help="also run streampool with these STREAMPOOL_* settings, as "
        "configuration streampool:LABEL (repeatable)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="run nothing: render latest.md and latest.png from this latest.json "
        "(one left by a run cut short: its report too)",
    )
    options = parser.parse_args(list(argv))
    if options.repeats is None:
        options.repeats = REPEATS_QUICK if options.quick else REPEATS_FULL
    if options.repeats < 1 or options.cotenant_repeats < 1:
        parser.error("--repeats and --cotenant-repeats must be at least 1")
    if options.time_budget_s is None:
        options.time_budget_s = TIME_BUDGET_QUICK_S if options.quick else TIME_BUDGET_FULL_S
    if NATIVE not in options.configs:
        options.configs.insert(0, NATIVE)
    options.variants = dict(options.variant)
    if len(options.variants) != len(options.variant):
        parser.error("--variant labels must differ")
    options.configs += [VARIANT_PREFIX + label for label in options.variants]
    return options


def command_line(argv: Sequence[str], environ: Dict[str, str]) -> str:
    """The command as a user would retype it, with the STREAMPOOL_* variables that shape the
    allocator's behaviour (not STREAMPOOL_LIBRARY, a machine's path; the version is reported)."""
    variables = [
        f"{name}={shlex.quote(value)}"
        for name, value in sorted(environ.items())
        if name.startswith("STREAMPOOL_") and name != "STREAMPOOL_LIBRARY"
    ]
    return " ".join(variables + [COMMAND] + [shlex.quote(a) for a in argv])


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


def child_runner(variants: Dict[str, Dict[str, str]], environ: Dict[str, str], timeout_s: float):
    """A runner.ChildRunner that starts ``python3 -m bench.child`` for a configuration."""

    def run(config_name: str, names: List[str], label: str) -> Dict[str, Any]:
        config = resolve(config_name, variants)
        outcome = runner.run_process(
            child.command(config.base, config.backend, names),
            child_environment(config, environ),
            timeout_s,
            label,
        )
        return runner.parse_child_output(outcome, names)

    return run


def write_json(document: Dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "latest.json"
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    protocol.progress(f"wrote {path}")


def write_renderings(document: Dict[str, Any], out_dir: Path) -> None:
    """latest.md, then latest.png; a plot that cannot be drawn (no matplotlib) is reported on
    stderr and loses nothing else."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.md").write_text(markdown.markdown(document))
    protocol.progress(f"wrote {out_dir / 'latest.md'}")
    try:
        plot.write_plot(document, out_dir / "latest.png")
        protocol.progress(f"wrote {out_dir / 'latest.png'}")
    except Exception as exc:  # the plot is optional; the numbers are already written
        protocol.progress(f"no plot: {type(exc).__name__}: {exc}")


def run(
    options: argparse.Namespace,
    argv: Sequence[str],
    environ: Dict[str, str],
    make_runner=child_runner,
    cotenant_trial=cotenant.run_trial,
) -> Dict[str, Any]:
    """Co-tenant first (it warms the machine's file cache), then the repeats; after every repeat
    latest.json holds the raw results so far (report.partial_document), at the end the report.
    Returns the final report."""
    started_s = time.monotonic()
    timed = [w for w in options.workloads if w in TIMED_WORKLOADS]
    facts = {
        "command": command_line(argv, environ),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "driver": driver_version(),
        "quick": options.quick,
        "variants": options.variants,
    }
    cotenant_result: Dict[str, Any] = {}
    if COTENANT in options.workloads:
        names = cotenant_configs(options.configs, options.quick)
        rounds = cotenant.run_cotenant(
            names, options.cotenant_repeats, environ, COTENANT_TIMEOUT_S, trial=cotenant_trial
        )
        cotenant_result = {"cells": cotenant.summarise(rounds), "rounds": rounds}
    workloads_by_config = {
        c: workloads_of(resolve(c, options.variants), timed) for c in options.configs
    }
    configs = [c for c in options.configs if workloads_by_config[c]]

    def inputs(repeats: runner.Repeats) -> Dict[str, Any]:
        """build_report's arguments besides the runs and the stop reason."""
        return {
            "configs": configs,
            "workloads": timed,
            "repeats_requested": options.repeats,
            "orders": repeats.orders,
            "cotenant": cotenant_result,
            "facts": {**facts, "elapsed_s": round(time.monotonic() - started_s, 1)},
        }

    def save(partial: runner.Repeats) -> None:  # no statistics here: they take seconds
        write_json(report.partial_document(partial.runs, inputs(partial)), options.out_dir)

    repeats = runner.Repeats([], [], None)
    if timed:
        repeats = runner.run_repeats(
            configs,
            workloads_by_config,
            options.repeats,
            make_runner(options.variants, environ, options.child_timeout_s),
            time_budget_s=options.time_budget_s,
            started_s=started_s,
            on_repeat=save,
        )
    final = report.build_report(
        repeats.runs,
        stop_reason=repeats.stop_reason,
        target_document=targets.load(),
        **inputs(repeats),
    )
    write_json(final, options.out_dir)
    return final


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parse_args(argv)
    if options.from_json is not None:
        final = json.loads(options.from_json.read_text())
        if final.get("partial"):  # a run cut short: its report from the repeats it finished
            final = report.rebuild(final)
            write_json(final, options.out_dir)
    else:
        final = run(options, argv, dict(os.environ))
    write_renderings(final, options.out_dir)
    print("\n".join(markdown.summary_lines(final)), flush=True)
    return 0

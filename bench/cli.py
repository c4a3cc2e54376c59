"""``python3 -m bench``: the run, the calibration and the merge, and the files they write.

- ``python3 -m bench [--group G ...] [--pairs N] [--block-s S] [--out-dir DIR]``: the workloads
  of each group (plan.GROUPS; ``cotenant``: the co-tenant and the price of a release threshold),
  every configuration in long-lived workers; DIR/results.json (the raw results, rewritten after
  every workload), DIR/report.json and DIR/report.md. Without --group: every group, one after
  the other (the whole benchmark in one process).
- ``python3 -m bench calibrate [--blocks-s 0.05,0.1,...]``: the A/A at several block lengths;
  DIR/calibration.json and DIR/calibration.md.
- ``python3 -m bench merge DIR... --out-dir OUT``: the runs' results pooled into one report.
Invariant: the parent never imports torch or touches CUDA (workers do); it writes only into
--out-dir; it does every pair it announces (no time budget cuts a run short: --budget-s refuses
up front a run estimated to need longer); without torch, numpy or a GPU it says which in one line
and exits with status 2.
"""

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import calibrate, cotenant, details, markdown, nvml, plan, protocol, report, runner
from .configs import (CONFIG_NAMES, COTENANT_NAMES, DEFAULT_CONFIGS, NATIVE, NATIVE_AA,
                      PRICE_CONFIGS, VARIANT_PREFIX, pairs_of, parse_variant)
from .schedules import TIMED_WORKLOADS, preload_modules

COMMAND = "python3 -m bench"
RESULTS = "results.json"


def _names(known: Sequence[str], what: str) -> Callable[[str], List[str]]:
    """An argparse type: comma-separated names from ``known``, in ``known``'s order."""

    def parse(text: str) -> List[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(known)}"
            )
        return [name for name in known if name in names]

    return parse


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected a positive number")
        return value

    return parse


def _blocks(text: str) -> List[float]:
    return [_positive(float, "--blocks-s")(part) for part in text.split(",") if part.strip()]


def _common(parser: argparse.ArgumentParser, out_dir: str) -> None:
    parser.add_argument("--out-dir", type=Path, default=Path(out_dir),
                        help=f"where the files go (created; default {out_dir})")
    parser.add_argument("--pairs", type=_positive(int, "--pairs"), default=None,
                        help=f"pairs per configuration and workload (default {plan.DEFAULT_PAIRS};"
                        " calibrate: 20)")
    parser.add_argument("--budget-s", type=_positive(float, "--budget-s"), default=None,
                        help="refuse to start if the run is estimated to need longer")
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # CPU tests


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    mode = argv.pop(0) if argv and argv[0] in ("calibrate", "merge") else "run"
    parser = argparse.ArgumentParser(
        prog=f"{COMMAND} {mode}" if mode != "run" else COMMAND,
        description="Time and memory of streampool against PyTorch's allocators on the GPU "
        f"(BENCHMARKS.md). '{COMMAND} [--group G]' runs the benchmark, '{COMMAND} calibrate' "
        f"measures the A/A control by block length, '{COMMAND} merge DIR... --out-dir OUT' "
        "pools runs into one report.",
    )
    if mode == "merge":
        parser.add_argument("dirs", nargs="+", type=Path, help="directories with results.json")
        parser.add_argument("--out-dir", type=Path, required=True)
    elif mode == "calibrate":
        _common(parser, "bench-calibration")
        parser.add_argument("--blocks-s", type=_blocks, default=list(calibrate.DEFAULT_BLOCKS_S),
                            help="comma-separated block lengths in seconds (default "
                            f"{','.join(f'{b:g}' for b in calibrate.DEFAULT_BLOCKS_S)})")
        parser.add_argument("--workloads", type=_names(TIMED_WORKLOADS, "workload"),
                            default=list(calibrate.DEFAULT_WORKLOADS))
    else:
        _common(parser, "bench-results")
        parser.add_argument("--group", type=_names(plan.GROUP_NAMES, "group"), action="append",
                            help=f"comma-separated, from {', '.join(plan.GROUP_NAMES)} "
                            "(default: all, one after the other)")
        parser.add_argument("--workloads", type=_names(TIMED_WORKLOADS, "workload"),
                            help="run these workloads as one group instead")
        parser.add_argument("--configs", type=_names(CONFIG_NAMES, "configuration"),
                            default=list(DEFAULT_CONFIGS),
                            help="comma-separated (native always runs; default "
                            f"{','.join(DEFAULT_CONFIGS)})")
        parser.add_argument("--block-s", type=_positive(float, "--block-s"),
                            default=plan.DEFAULT_BLOCK_S,
                            help=f"seconds of steps a block holds (default {plan.DEFAULT_BLOCK_S})")
        parser.add_argument("--cotenant-repeats", type=_positive(int, "--cotenant-repeats"),
                            default=1, help="trials per configuration of the co-tenant's A "
                            "(default 1)")
        parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                            metavar="LABEL:STREAMPOOL_VAR=VALUE[,...]",
                            help="also run streampool with these settings as streampool:LABEL")
    options = parser.parse_args(argv)
    options.mode = mode
    if mode == "run":
        options.groups = sorted({g for chosen in options.group or [] for g in chosen},
                                key=plan.GROUP_NAMES.index) or list(plan.GROUP_NAMES)
        options.variants = dict(options.variant)
        if len(options.variants) != len(options.variant):
            parser.error("--variant labels must differ")
        options.configs = list(dict.fromkeys([NATIVE] + options.configs))
        options.configs += [VARIANT_PREFIX + label for label in options.variants]
        try:
            pairs_of(options.configs, options.variants)
        except ValueError as exc:
            parser.error(f"--configs: {exc}")
    if mode != "merge" and options.pairs is None:
        options.pairs = 20 if mode == "calibrate" else plan.DEFAULT_PAIRS
    return options


def missing_requirement(python: str = sys.executable) -> Optional[str]:
    """What this machine lacks to run the benchmark, in one line (None: nothing)."""
    for module, why in (("torch", "PyTorch"), ("numpy", "numpy (the statistics)")):
        if importlib.util.find_spec(module) is None:
            return f"{COMMAND}: {why} is not installed here (no module {module}); nothing measured"
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        detail = protocol.tail(done.stderr, 1) if done.returncode != 3 else ""
        return (f"{COMMAND}: no CUDA GPU is visible to torch here "
                f"(torch.cuda.is_available() is False{'; ' + detail if detail else ''}); "
                "nothing measured")
    return None


def command_line(argv: Sequence[str], environ: Dict[str, str]) -> str:
    """The command as typed, with the STREAMPOOL_* variables that shape the allocator."""
    variables = [f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items())
                 if k.startswith("STREAMPOOL_") and k != "STREAMPOOL_LIBRARY"]
    return " ".join(variables + [COMMAND] + [shlex.quote(a) for a in argv])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_report(
    calls: List[Dict[str, Any]], out_dir: Path, merge_command: Optional[str] = None
) -> Dict[str, Any]:
    built = report.build(calls, merge_command=merge_command)
    _write(out_dir / "report.json", json.dumps(built, indent=1, allow_nan=False) + "\n")
    _write(out_dir / "report.md", details.render(built))
    protocol.progress(f"wrote {out_dir / 'report.md'} and report.json")
    return built


def _groups(options) -> List[tuple]:
    if options.workloads:
        return [("workloads", options.workloads)]
    return [(g, plan.GROUPS.get(g, ())) for g in options.groups]


def announce(options) -> float:
    """Print what the run will do and return its estimated seconds."""
    total_s = 0.0
    others = len(options.configs) - 1
    for group, workloads in _groups(options):
        if group == plan.COTENANT_GROUP:
            seconds = len(COTENANT_NAMES) * options.cotenant_repeats * 20 + plan.estimate_s(
                ["gpt2"], len(PRICE_CONFIGS), options.pairs, options.block_s, 18.0)
            text = (f"co-tenant ({len(COTENANT_NAMES)} configurations of A × "
                    f"{options.cotenant_repeats}) and the price of a release threshold on gpt2")
        else:
            seconds = plan.estimate_s(workloads, len(options.configs), options.pairs,
                                      options.block_s, plan.START_S.get(group, 18.0))
            text = (f"{len(workloads)} workload(s) ({', '.join(workloads)}) × "
                    f"{len(options.configs)} configurations, {options.pairs} pairs each for "
                    f"{others} of them")
        protocol.progress(f"{group}: {text}: about {seconds / 60:.1f} min")
        total_s += seconds
    protocol.progress(f"blocks of {options.block_s:g} s; about {total_s / 60:.1f} min in all")
    return total_s


def run(options, argv: Sequence[str], environ: Dict[str, str]) -> Dict[str, Any]:
    """The run (module docstring); returns its report."""
    release_s = plan.idle_release_s(environ)
    library = nvml.Nvml.open()
    device = library.handle() if library else None
    call: Dict[str, Any] = {"facts": {
        "command": command_line(argv, environ),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "driver": library.driver_version() if library else None,
        "block_s": options.block_s, "pairs": options.pairs, "idle_release_s": release_s,
        "configs": options.configs, "variants": options.variants, "groups": options.groups,
        "nvml": "clocks and power" if device is not None else None,
    }, "workers": {}, "workloads": [], "cotenant": []}
    sampler = runner.Sampler(library, device)

    def save(_: Any = None) -> None:
        _write(options.out_dir / RESULTS,
               json.dumps({"format": report.FORMAT, "runs": [call]}, allow_nan=False) + "\n")

    def run_workers(names: Sequence[str], workloads: Sequence[str]) -> None:
        opts = runner.Options(options.pairs, options.block_s, release_s)
        live = runner.Runner(names, options.variants, environ, opts, sampler, options.engine,
                             preload=preload_modules(workloads) if options.engine is None else ())
        try:
            uuid = live.infos.get(NATIVE, {}).get("device_uuid")
            if library is not None and uuid:  # the workers' device, whatever NVML numbers it
                sampler.device = library.handle(uuid) or sampler.device
            call["workers"].update({n: live.infos.get(n, {"error": live.dead.get(n)})
                                    for n in names})
            if any(i.get("baseline_process_bytes") is not None for i in live.infos.values()):
                call["facts"]["nvml"] = "clocks, power and process memory"

            def keep(record: Dict[str, Any]) -> None:
                call["workloads"].append(record)
                save()

            runner.run_group(live, workloads, pairs_of(names, options.variants), keep)
        finally:
            live.close()

    for group, workloads in _groups(options):
        protocol.progress(f"=== {group}")
        if group != plan.COTENANT_GROUP:
            run_workers(options.configs, workloads)
            continue
        call["cotenant"] = cotenant.run_cotenant(COTENANT_NAMES, environ,
                                                 options.cotenant_repeats)
        save()
        run_workers(list(PRICE_CONFIGS), ["gpt2"])
    save()
    return write_report([call], options.out_dir)


def run_calibration(options, argv: Sequence[str], environ: Dict[str, str]) -> None:
    opts = runner.Options(options.pairs, options.blocks_s[0], plan.idle_release_s(environ))
    library = nvml.Nvml.open()
    sampler = runner.Sampler(library, library.handle() if library else None)
    preload = preload_modules(options.workloads) if options.engine is None else ()
    live = runner.Runner([NATIVE, NATIVE_AA], {}, environ, opts, sampler, options.engine,
                         preload=preload)
    facts = {
        "command": command_line(argv, environ),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": live.infos.get(NATIVE, {}).get("device", "unknown"),
        "blocks_s": options.blocks_s, "pairs": options.pairs,
    }
    document: Dict[str, Any] = {"facts": facts, "workers": live.infos, "records": []}

    def keep(record: Dict[str, Any]) -> None:
        document["records"].append(record)
        _write(options.out_dir / "calibration.json", json.dumps(document, allow_nan=False))

    try:
        calibrate.run(live, options.workloads, options.blocks_s, on_workload=keep)
    finally:
        live.close()
    _write(options.out_dir / "calibration.md", calibrate.markdown(document["records"], facts))
    print(calibrate.markdown(document["records"], facts), flush=True)


def merge(dirs: Sequence[Path], out_dir: Path, command: Optional[str] = None) -> Dict[str, Any]:
    calls = []
    for directory in dirs:
        path = directory if directory.suffix == ".json" else directory / RESULTS
        if not path.is_file():
            raise SystemExit(f"{COMMAND} merge: {path} not found (a run's --out-dir holds it)")
        calls += json.loads(path.read_text())["runs"]
    _write(out_dir / RESULTS, json.dumps({"format": report.FORMAT, "runs": calls}) + "\n")
    return write_report(calls, out_dir, command)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Dict[str, str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["headline"]:  # the docs' tables from committed results (headline.py)
        from . import headline

        return headline.main(argv[1:])
    environ = dict(os.environ if environ is None else environ)
    options = parse_args(argv)
    if options.mode == "merge":
        built = merge(options.dirs, options.out_dir, command_line(argv, {}))
        print("\n".join(markdown.headline(built)), flush=True)
        return 0
    try:
        plan.idle_release_s(environ)
    except ValueError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    if options.engine is None:
        missing = missing_requirement()
        if missing:
            print(missing, file=sys.stderr)
            return 2
    if options.mode == "calibrate":
        estimate = calibrate.estimate_s(options.workloads, options.blocks_s, options.pairs)
        protocol.progress(f"calibration: about {estimate / 60:.1f} min")
    else:
        estimate = announce(options)
    if options.budget_s is not None and estimate > options.budget_s:
        print(f"{COMMAND}: this run needs about {estimate:.0f} s, more than --budget-s "
              f"{options.budget_s:g}: choose fewer --pairs or fewer groups", file=sys.stderr)
        return 2
    if options.mode == "calibrate":
        run_calibration(options, argv, environ)
        return 0
    built = run(options, argv, environ)
    print("\n".join(markdown.headline(built)), flush=True)
    return 0

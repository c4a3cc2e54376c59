"""The command line of ``python3 -m bench``: its commands, their arguments, and the checks on
them (cli.py runs what they ask).

Invariant: a malformed argument is refused here, by argparse, with the option and what it
accepts, before anything runs.
"""

import argparse
from pathlib import Path
from typing import Any, Callable, List, Sequence

from . import calibrate, isolation, plan
from .configs import (CONFIG_NAMES, DEFAULT_CONFIGS, NATIVE, PRICE_CONFIGS, VARIANT_PREFIX,
                      pairs_of, parse_variant)
from .schedules import TIMED_WORKLOADS

COMMAND = "python3 -m bench"


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


def _without(text: str) -> List[str]:
    try:
        return isolation.parse_without(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(parser: argparse.ArgumentParser, out_dir: str, pairs: str, processes: str) -> None:
    parser.add_argument("--out-dir", type=Path, default=Path(out_dir),
                        help=f"where the files go (created; default {out_dir})")
    parser.add_argument("--pairs", type=_positive(int, "--pairs"), default=None,
                        help=f"pairs per configuration and workload in each process set ({pairs})")
    parser.add_argument("--processes", type=_positive(int, "--processes"), default=None,
                        help=f"process sets, one after the other ({processes})")
    parser.add_argument("--without", type=_without, default=[], metavar="SETTING[,...]",
                        help="turn these off: " + ", ".join(isolation.FEATURES)
                        + " (bench/isolation.py)")
    parser.add_argument("--budget-s", type=_positive(float, "--budget-s"), default=None,
                        help="refuse to start if the run is estimated to need longer")
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # CPU tests
    parser.add_argument("--group", type=_names(plan.GROUP_NAMES, "group"), action="append",
                        help=f"comma-separated, from {', '.join(plan.GROUP_NAMES)} "
                        "(default: all, one after the other)")
    parser.add_argument("--workloads", type=_names(TIMED_WORKLOADS, "workload"),
                        help="these workloads as one group instead")


# Every command of ``python3 -m bench`` (its --help lists them).
COMMANDS = (
    ("", "[--group G]", "run the benchmark on the GPU (needs torch and a CUDA GPU)"),
    ("calibrate", "[--group G]", "measure the A/A control and choose each workload's settings"),
    ("merge", "DIR... --out-dir OUT", "pool runs into one report (no GPU)"),
    ("noise", "DIR...", "where the A/A difference comes from, from the blocks' records (no GPU)"),
    ("headline", "[--check]", "write the tables of README.md and BENCHMARKS.md from the "
     "committed results in bench/results (no GPU)"),
)
SUBCOMMANDS = ("calibrate", "merge", "noise")


def commands_text() -> str:
    rows = [(f"{COMMAND} {name} {arguments}".replace("  ", " "), what)
            for name, arguments, what in COMMANDS]
    width = max(len(command) for command, _ in rows)
    return "commands:\n" + "\n".join(f"  {command:<{width}}  {what}" for command, what in rows)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    mode = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else "run"
    parser = argparse.ArgumentParser(
        prog=f"{COMMAND} {mode}" if mode != "run" else COMMAND,
        description="Time and memory of streampool against PyTorch's allocators on the GPU "
        "(BENCHMARKS.md).",
        epilog=commands_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if mode == "merge":
        parser.add_argument("dirs", nargs="+", type=Path, help="directories with results.json")
        parser.add_argument("--out-dir", type=Path, required=True)
    elif mode == "noise":
        parser.add_argument("dirs", nargs="+", type=Path,
                            help="directories (or files) with a run's results.json or a "
                            "calibration's calibration.json")
    elif mode == "calibrate":
        _common(parser, "bench-calibration", f"default {calibrate.DEFAULT_PAIRS}",
                f"default {calibrate.DEFAULT_PROCESSES}")
        parser.add_argument("--blocks-s", type=_blocks, default=list(calibrate.DEFAULT_BLOCKS_S),
                            help="comma-separated block lengths in seconds (default "
                            f"{','.join(f'{b:g}' for b in calibrate.DEFAULT_BLOCKS_S)})")
        parser.add_argument("--ablate", type=_without, default=[], metavar="SETTING[,...]",
                            help="turn these settings off in every other process set, to "
                            "compare")
        parser.add_argument("--plan-configs", type=_positive(int, "--plan-configs"),
                            default=len(DEFAULT_CONFIGS),
                            help="configurations the planned run compares (default "
                            f"{len(DEFAULT_CONFIGS)})")
        parser.add_argument("--call-s", type=_positive(float, "--call-s"),
                            default=calibrate.CALL_S,
                            help=f"seconds a planned group may take (default {calibrate.CALL_S:g})")
        parser.add_argument("--write", type=Path, default=plan.CALIBRATION_PATH,
                            help="the calibration file to update (default "
                            "bench/calibration.json)")
    else:
        _common(parser, "bench-results", "default: the calibration file's, else "
                f"{plan.DEFAULT_PAIRS}", f"default: the calibration file's, else "
                f"{plan.DEFAULT_PROCESSES}")
        parser.add_argument("--configs", type=_names(CONFIG_NAMES, "configuration"),
                            default=list(DEFAULT_CONFIGS),
                            help="comma-separated (native always runs; default "
                            f"{','.join(DEFAULT_CONFIGS)})")
        parser.add_argument("--block-s", type=_positive(float, "--block-s"), default=None,
                            help="seconds of steps a block holds (default: the calibration "
                            f"file's, else {plan.DEFAULT_BLOCK_S})")
        parser.add_argument("--calibration", default=str(plan.CALIBRATION_PATH),
                            help="the calibration file whose settings are the defaults "
                            "('none': plan's defaults)")
        parser.add_argument("--cotenant-repeats", type=_positive(int, "--cotenant-repeats"),
                            default=1, help="trials per configuration of the co-tenant's A "
                            "(default 1)")
        parser.add_argument("--cotenant-without-price", action="store_true",
                            help="the co-tenant's trials alone; the threshold's price apart is "
                            f"--workloads gpt2 --configs {','.join(PRICE_CONFIGS)}")
        parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                            metavar="LABEL:STREAMPOOL_VAR=VALUE[,...]",
                            help="also run streampool with these settings as streampool:LABEL")
    options = parser.parse_args(argv)
    options.mode = mode
    if mode not in ("merge", "noise"):
        options.groups = sorted({g for chosen in options.group or [] for g in chosen},
                                key=plan.GROUP_NAMES.index) or list(plan.GROUP_NAMES)
        if mode == "calibrate":
            options.groups = [g for g in options.groups if g not in plan.UNPAIRED_GROUPS]
    if mode == "run":
        if options.cotenant_without_price and (options.workloads or
                                               plan.COTENANT_GROUP not in options.groups):
            parser.error("--cotenant-without-price: only with the cotenant group (--group cotenant)")
        options.variants = dict(options.variant)
        if len(options.variants) != len(options.variant):
            parser.error("--variant labels must differ")
        options.configs = list(dict.fromkeys([NATIVE] + options.configs))
        options.configs += [VARIANT_PREFIX + label for label in options.variants]
        try:
            pairs_of(options.configs, options.variants)
        except ValueError as exc:
            parser.error(f"--configs: {exc}")
    return options

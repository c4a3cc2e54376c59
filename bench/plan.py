"""What runs when: the groups, each workload's block length, pairs and process sets (the
calibration file's, else the defaults), the ABBA order of blocks, stages that fit the card, time
estimates.

Invariant: pure functions of their arguments (no clock, no processes, no torch; load_calibration
only reads the file it is given). In round r every
pair (reference, config) of a stage runs its two blocks back to back, the reference first when r
is even and second when r is odd (so over two rounds each side is first once: ABBA), and the
pairs' order is the stage's rotated right by r (so a config's idle gap between two of its blocks
is at most 2 * pairs + 2 blocks, GAP_BLOCKS). A stage always holds the reference of each of its
pairs.
"""

import json
import math
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .schedules import PRELOAD_MODULES

Pair = Tuple[str, str]  # (reference, config)

# The groups of a full run: workloads that share one set of worker processes (one invocation of
# the benchmark each). Each set of processes builds every workload of the group again, so the
# groups are sized for a call of 9 minutes with the default configurations in 3 process sets
# (estimate_s; `python3 -m bench --group G` prints its estimate before it starts): the models
# whose build takes seconds (Llama ~15 s a worker, torch.compile ~25 s) have groups of their own.
GROUPS: Dict[str, Tuple[str, ...]] = {
    "alloc": ("empty_1KiB", "empty_1MiB", "empty_64MiB", "churn"),
    "models": ("multistream", "bert", "gpt2"),
    "decode": ("llama_decode",),
    "vision": ("resnet50", "vision_sizes"),
    "compiled": ("compiled",),
}
COTENANT_GROUP = "cotenant"
# Sleep and wake (bench/sleep.py): its configurations in child processes of their own, one after
# the other, each about a minute on an H200 (GPT-2's state, two cycles, the host link measured).
SLEEP_GROUP = "sleep"
SLEEP_CONFIGS = ("native", "streampool-vmm", "streampool-vmm-reserved", "tms")
SLEEP_CONFIG_S = 60.0
# Groups that run no workers and are not calibrated.
UNPAIRED_GROUPS = (COTENANT_GROUP, SLEEP_GROUP)
GROUP_NAMES = tuple(GROUPS) + UNPAIRED_GROUPS

# The run's defaults where the calibration file (CALIBRATION_PATH, written by `python3 -m bench
# calibrate`) has no entry for a workload: 3 process sets of 8 pairs of 0.2 s blocks.
DEFAULT_BLOCK_S = 0.2
DEFAULT_PAIRS = 8
DEFAULT_PROCESSES = 3
CALIBRATION_PATH = Path(__file__).resolve().parent / "calibration.json"


class Setting(NamedTuple):
    """How one workload is measured: blocks of ``block_s``, ``pairs`` pairs per configuration in
    each of ``processes`` process sets; ``source``: where these came from."""

    block_s: float
    pairs: int
    processes: int
    source: str = "defaults"


def load_calibration(path: Optional[Path] = CALIBRATION_PATH) -> Optional[Dict]:
    """The calibration file, or None where there is none."""
    if path is None or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text())


def settings_for(workloads: Sequence[str], calibration: Optional[Dict] = None,
                 block_s: Optional[float] = None, pairs: Optional[int] = None,
                 processes: Optional[int] = None) -> Dict[str, Setting]:
    """Each workload's Setting: the calibration's where it has one, else the defaults; any of
    ``block_s``, ``pairs``, ``processes`` given (the command line) overrides both."""
    chosen = (calibration or {}).get("workloads", {})
    out = {}
    for workload in workloads:
        entry = chosen.get(workload)
        base = Setting(DEFAULT_BLOCK_S, DEFAULT_PAIRS, DEFAULT_PROCESSES)
        if entry:
            date = (calibration or {}).get("facts", {}).get("date", "")
            base = Setting(entry["block_s"], entry["pairs"], entry["processes"],
                           f"calibration {date}".strip())
        given = {k: v for k, v in (("block_s", block_s), ("pairs", pairs),
                                   ("processes", processes)) if v is not None}
        out[workload] = base._replace(**given, source="command line" if given else base.source)
    return out


# A card is shared by the workers of a stage: keep this fraction of its memory for them.
CARD_FRACTION = 0.9
# What a worker holds besides its workload: CUDA context, cuBLAS/cuDNN handles and workspaces.
PROCESS_OVERHEAD_BYTES = 1 << 30
# Plan for idle gaps at most this fraction of the idle-release delay.
GAP_MARGIN = 0.75

IDLE_RELEASE_VARIABLE = "STREAMPOOL_IDLE_RELEASE"
IDLE_RELEASE_DEFAULT_S = 2.0


def round_order(pairs: Sequence[Pair], round_index: int) -> List[Tuple[str, str, bool]]:
    """``(reference, config, reference_first)`` for each pair of ``round_index`` (module
    docstring)."""
    if not pairs:
        return []
    shift = round_index % len(pairs)
    rotated = list(pairs[len(pairs) - shift :]) + list(pairs[: len(pairs) - shift])
    return [(ref, config, round_index % 2 == 0) for ref, config in rotated]


def block_sequence(pairs: Sequence[Pair], rounds: int) -> List[str]:
    """The configurations in the order their blocks run over ``rounds`` rounds."""
    sequence = []
    for r in range(rounds):
        for ref, config, ref_first in round_order(pairs, r):
            sequence += [ref, config] if ref_first else [config, ref]
    return sequence


def gap_blocks(pairs_in_stage: int) -> int:
    """The most blocks of other workers that can run between two blocks of one config
    (its reference, in every pair of the stage, waits at most 2)."""
    return 2 * pairs_in_stage + 2


def steps_per_block(block_s: float, step_s: float) -> int:
    """Steps that make a block of about ``block_s`` when a step takes ``step_s`` (at least 1)."""
    if block_s <= 0:
        raise ValueError(f"block length {block_s} s must be positive")
    if step_s <= 0:
        return 1
    return max(1, round(block_s / step_s))


def max_pairs_for_gap(idle_release_s: Optional[float], block_wall_s: float) -> Optional[int]:
    """The most pairs a stage may hold so that a config's idle gap stays under GAP_MARGIN of the
    idle-release delay (None: no limit, idle release off); at least 1 (then the report shows
    the gap that was not kept)."""
    if idle_release_s is None or block_wall_s <= 0:
        return None
    blocks = GAP_MARGIN * idle_release_s / block_wall_s
    return max(1, math.floor((blocks - 2) / 2))


def stages(
    pairs: Sequence[Pair],
    active_bytes: Dict[str, int],
    idle_bytes: Dict[str, int],
    card_bytes: int,
    max_pairs: Optional[int] = None,
) -> Tuple[List[List[Pair]], Dict[str, str]]:
    """Pack ``pairs`` into stages, in order, so that in each stage its workers' ``active_bytes``
    plus every other worker's ``idle_bytes`` fit in CARD_FRACTION of ``card_bytes`` and it has
    at most ``max_pairs`` pairs. Returns the stages and, for pairs that fit in no stage,
    ``{config: why}``."""
    budget = CARD_FRACTION * card_bytes
    everyone = {name for pair in pairs for name in pair}
    planned: List[List[Pair]] = []
    left_out: Dict[str, str] = {}

    def need(stage: List[Pair]) -> int:
        members = {name for pair in stage for name in pair}
        return sum(active_bytes[m] for m in members) + sum(
            idle_bytes[m] for m in everyone - members
        )

    for pair in pairs:
        placed = False
        for stage in planned:
            if (max_pairs is None or len(stage) < max_pairs) and need(stage + [pair]) <= budget:
                stage.append(pair)
                placed = True
                break
        if placed:
            continue
        if need([pair]) <= budget:
            planned.append([pair])
        else:
            left_out[pair[1]] = (
                f"does not fit on the card beside {pair[0]}: needs about "
                f"{need([pair]) / 2**30:.1f} GiB with the other workers idle, "
                f"{budget / 2**30:.1f} GiB usable"
            )
    return planned, left_out


_DURATION = re.compile(r"^([0-9]*\.?[0-9]+)(ms|s)$")


def parse_duration_s(text: str, variable: str = IDLE_RELEASE_VARIABLE) -> Optional[float]:
    """The library's syntax: ``250ms``, ``2s``, ``1.5s`` -> seconds; ``off``, ``never`` or ``0``
    -> None (disabled)."""
    value = text.strip().lower()
    if value in ("off", "never", "0"):
        return None
    match = _DURATION.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"{variable}={text!r}: expected a duration such as 250ms, 2s or 1.5s, or off"
        )
    seconds = float(match.group(1))
    return seconds / 1000 if match.group(2) == "ms" else seconds


def idle_release_s(environ: Dict[str, str]) -> Optional[float]:
    """The idle-release delay the workers run with (None: disabled)."""
    if IDLE_RELEASE_VARIABLE not in environ:
        return IDLE_RELEASE_DEFAULT_S
    return parse_duration_s(environ[IDLE_RELEASE_VARIABLE])


# --- time estimates (H100, measured in earlier runs; a guide for planning calls) ---------------
# Per workload: (seconds of one worker's memory pass as the parent waits for it: build, the
# schedule once with memory readings, settle; then seconds of a step), and the seconds a process
# set takes to start (imports, CUDA). From the 2026-11-25 run (wall time less its blocks, per
# worker, less a warm-up); resnet50, vision_sizes and compiled are guesses (their group took
# 3.1 min in all at 5 configurations and 24 pairs). The calibration measures all three for each
# workload it calibrates, and its figures win (costs).
PREPARE_S = {
    "empty_1KiB": (1.0, 0.03),
    "empty_1MiB": (1.0, 0.03),
    "empty_64MiB": (1.0, 0.03),
    "churn": (0.6, 0.003),
    "multistream": (0.8, 0.0003),
    "llama_decode": (14.0, 0.05),
    "bert": (3.5, 0.008),
    "gpt2": (3.5, 0.05),
    "resnet50": (3.0, 0.03),
    "vision_sizes": (5.0, 0.05),
    "compiled": (10.0, 0.005),
}
START_S = {"alloc": 8.0, "models": 18.0, "decode": 18.0, "vision": 10.0, "compiled": 12.0}
# Wall time of a block / its steps' time (synchronisation, pipe, NVML, the other side's slower
# steps): 2026-11-25, 0.2 s blocks, 0.38-0.60 s of blocks and 0.43-0.67 s of wall per pair.
BLOCK_OVERHEAD = 1.25
# Warm-up blocks a worker runs in a stage (the cycle once, then 3 or more to settle; every
# worker of the stage runs until the slowest has settled, and a worker active in several stages
# warms up in each: a run of several stages takes longer than this counts).
WARM_UP_BLOCKS = 4


# Seconds a worker's memory pass takes beyond its figure above when its workload is the first of
# the worker's workloads to build a model with a module of PRELOAD_MODULES (the imports are
# preloaded; the first model built with them is not). Measured on an H200: gpt2 built first
# (`bench/results/2026-12-02-h200-full-ed691fa/models-a/`, five process sets) took 11.0 s a
# worker against the calibration's 2.56 s, measured after bert. A workload's figure is for its
# place in its group (GROUPS, the order the calibration runs them in), so a run in another order
# moves it by this much, either way.
FIRST_BUILD_S = {"transformers": 8.4}


def _first_users(workloads: Sequence[str]) -> Dict[str, List[str]]:
    """Each workload of ``workloads`` -> the modules it is the first of them to build with."""
    seen: set = set()
    firsts: Dict[str, List[str]] = {}
    for workload in workloads:
        modules = [m for m in PRELOAD_MODULES.get(workload, ()) if m not in seen]
        seen.update(modules)
        firsts[workload] = modules
    return firsts


def first_build_s(workload: str, workloads: Sequence[str]) -> float:
    """Seconds to add to ``workload``'s memory pass (one worker) when it runs in ``workloads``,
    in that order, rather than at its place in its group (FIRST_BUILD_S)."""
    group = next((g for g in GROUPS.values() if workload in g), (workload,))
    here = _first_users(workloads).get(workload, [])
    there = _first_users(group)[workload]
    return (sum(FIRST_BUILD_S.get(m, 0.0) for m in here)
            - sum(FIRST_BUILD_S.get(m, 0.0) for m in there))


def costs(workload: str, block_s: float, calibration: Optional[Dict] = None) -> Dict[str, float]:
    """``prepare_s`` (a worker's memory pass), ``warm_up_s`` (a cold worker's warm-up in a stage)
    and ``pair_s`` (a pair's wall time) of ``workload`` at blocks of ``block_s``: the
    calibration's measurements where it has them (``measured`` of its entry), else PREPARE_S."""
    prepare_s, step_s = PREPARE_S.get(workload, (5.0, 0.05))
    block_wall_s = max(block_s, step_s) * BLOCK_OVERHEAD
    figures = {"prepare_s": prepare_s, "warm_up_s": WARM_UP_BLOCKS * block_wall_s,
               "pair_s": 2 * block_wall_s}
    measured = ((calibration or {}).get("workloads", {}).get(workload) or {}).get("measured", {})
    pair_s = measured.get("pair_s", {}).get(f"{block_s:g}")
    for key, value in (("prepare_s", measured.get("prepare_s")), ("pair_s", pair_s),
                       ("warm_up_s", measured.get("warm_up_s", {}).get(f"{block_s:g}"))):
        if value is not None:
            figures[key] = value
    return figures


def workload_s(workload: str, configs: int, setting: Setting,
               calibration: Optional[Dict] = None, prepare_shift_s: float = 0.0) -> float:
    """Seconds ``workload`` takes with ``configs`` workers (one of them native) at ``setting``:
    each process set's memory passes (each moved by ``prepare_shift_s``, to no less than 0),
    warm-ups and pairs (not the sets' start)."""
    c = costs(workload, setting.block_s, calibration)
    prepare_s = max(0.0, c["prepare_s"] + prepare_shift_s)
    per_set = configs * (prepare_s + c["warm_up_s"])
    per_set += (configs - 1) * setting.pairs * c["pair_s"]
    return setting.processes * per_set


def estimate_s(workloads: Sequence[str], configs: int, settings: Dict[str, Setting],
               start_s: float, calibration: Optional[Dict] = None) -> float:
    """Seconds a run of ``workloads`` with ``configs`` workers should take: every process set's
    start, then each workload's (workload_s), its memory passes moved by first_build_s."""
    sets = max((settings[w].processes for w in workloads), default=0)
    return sets * start_s + sum(
        workload_s(w, configs, settings[w], calibration, first_build_s(w, workloads))
        for w in workloads)


def start_s(group: str, calibration: Optional[Dict] = None) -> float:
    """Seconds a process set of ``group`` takes to start: the calibration's, else START_S."""
    measured = (calibration or {}).get("groups", {}).get(group, {}).get("start_s")
    return measured if measured is not None else START_S.get(group, 18.0)

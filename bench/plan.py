"""What runs when: the ABBA order of blocks, block sizes, stages that fit the card, time estimates.

Invariant: pure functions of their arguments (no clock, no processes, no torch). In round r every
pair (reference, config) of a stage runs its two blocks back to back, the reference first when r
is even and second when r is odd (so over two rounds each side is first once: ABBA), and the
pairs' order is the stage's rotated right by r (so a config's idle gap between two of its blocks
is at most 2 * pairs + 2 blocks, GAP_BLOCKS). A stage always holds the reference of each of its
pairs.
"""

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

Pair = Tuple[str, str]  # (reference, config)

# The groups of a full run: workloads that share one set of worker processes (one invocation of
# the benchmark each).
# Each fits in about 5-8 minutes at the defaults (estimate_s; `python3 -m bench --group G`
# prints its estimate before it starts).
GROUPS: Dict[str, Tuple[str, ...]] = {
    "alloc": ("empty_1KiB", "empty_1MiB", "empty_64MiB", "churn"),
    "models": ("multistream", "llama_decode", "bert", "gpt2"),
    "vision": ("resnet50", "vision_sizes", "compiled"),
}
COTENANT_GROUP = "cotenant"
GROUP_NAMES = tuple(GROUPS) + (COTENANT_GROUP,)

# The run's defaults (BENCHMARKS.md, "Method": chosen from a calibration run).
DEFAULT_BLOCK_S = 0.2
DEFAULT_PAIRS = 24

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
# Per workload: (seconds one worker needs to build it and run its schedule once with memory
# readings, seconds of a step), and the seconds a worker takes to start (imports, CUDA).
PREPARE_S = {
    "empty_1KiB": (1.0, 0.025),
    "empty_1MiB": (1.0, 0.025),
    "empty_64MiB": (1.0, 0.025),
    "churn": (1.0, 0.002),
    "multistream": (1.0, 0.0005),
    "llama_decode": (4.0, 0.12),
    "bert": (3.0, 0.01),
    "gpt2": (4.0, 0.05),
    "resnet50": (3.0, 0.03),
    "vision_sizes": (5.0, 0.05),
    "compiled": (25.0, 0.005),
}
START_S = {"alloc": 8.0, "models": 18.0, "vision": 10.0}
BLOCK_OVERHEAD = 1.15  # synchronisation, pipe and NVML reads around each block


def estimate_s(
    workloads: Sequence[str], configs: int, pairs: int, block_s: float, start_s: float
) -> float:
    """Seconds a run of ``workloads`` with ``configs`` workers (one of them native) should take:
    start, the solo memory passes one worker at a time, warm-up, and the timed pairs."""
    total = start_s
    for workload in workloads:
        prepare_s, step_s = PREPARE_S.get(workload, (5.0, 0.05))
        block_wall_s = max(block_s, step_s) * BLOCK_OVERHEAD
        total += configs * prepare_s + configs * 2 * block_wall_s
        total += (configs - 1) * pairs * 2 * block_wall_s
    return total

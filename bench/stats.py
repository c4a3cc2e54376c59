"""The benchmark's statistics: medians, seeded bootstrap intervals, the A/A comparison.

Invariant: every function here is pure and deterministic (the bootstrap draws from its own
``random.Random(seed)``), takes plain numbers and knows nothing of workloads or configurations, so
the same data always gives the same interval, whatever else the report computes first.
"""

import math
import random
import statistics
from typing import List, Optional, Sequence, Tuple

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 15
CONFIDENCE = 0.95
# The fewest repeats whose intervals the method trusts (issue 15); --quick runs fewer.
METHOD_REPEATS = 8


def quantile(sorted_values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ascending ``sorted_values``, interpolating linearly between
    neighbouring order statistics (position ``fraction * (n - 1)``, numpy's default)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = fraction * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    weight = position - below
    return sorted_values[below] * (1 - weight) + sorted_values[above] * weight


def bootstrap_median_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values``: the median of ``resamples``
    resamples drawn with replacement (same size as ``values``), and the (1 - confidence) / 2 and
    (1 + confidence) / 2 quantiles of those medians."""
    if not values:
        raise ValueError("bootstrap of no values")
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return quantile(medians, tail), quantile(medians, 1 - tail)


def ratios(mine: Sequence[float], reference: Sequence[float]) -> List[float]:
    """``mine[i] / reference[i]`` for each repeat ``i`` (the two lists are of the same repeats)."""
    if len(mine) != len(reference):
        raise ValueError("ratios of lists of different lengths")
    return [m / r for m, r in zip(mine, reference)]


def summarise_ratios(name: str, per_repeat: Sequence[float]) -> dict:
    """``{name: median, name_ci95: [low, high], name_min, name_max}`` of per-repeat ratios."""
    low, high = bootstrap_median_interval(per_repeat)
    return {
        name: statistics.median(per_repeat),
        f"{name}_ci95": [low, high],
        f"{name}_min": min(per_repeat),
        f"{name}_max": max(per_repeat),
    }


def compare_with_aa(
    interval: Sequence[float], aa_interval: Optional[Sequence[float]]
) -> Optional[str]:
    """ "lower" or "higher" when ``interval`` lies wholly below or above the A/A interval (native
    against itself in the same run): only then is a difference from native claimed; "within A/A"
    when they overlap; None without an A/A interval."""
    if aa_interval is None:
        return None
    if interval[1] < aa_interval[0]:
        return "lower"
    if interval[0] > aa_interval[1]:
        return "higher"
    return "within A/A"


def rotated(items: Sequence[str], repeat: int) -> List[str]:
    """``items`` rotated left by ``repeat`` places: repeat 0 runs them in the given order, repeat 1
    starts with the second, ...; over len(items) repeats each item runs once in every position."""
    if not items:
        return []
    shift = repeat % len(items)
    return list(items[shift:]) + list(items[:shift])

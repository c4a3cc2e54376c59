"""The benchmark's statistics: paired ratios, their median and a bootstrap 95% interval.

A sample is a *pair* of adjacent blocks (a configuration's and its reference's, same steps); its
ratio is config time / reference time. The reported ratio is the median of the paired ratios.
Pairs come from several worker *processes* (a set of processes, one per configuration, measures
a share of the pairs; then a fresh set): two processes of one configuration can differ by a few
percent for the whole of their life, so the process is a random effect and the interval comes
from a two-level bootstrap on log ratios (``hierarchical_interval``): draw processes with
replacement, then pairs within each drawn process. The processes' effects are rescaled to the
between-process variance estimated from them and widened by t(K-1)/z for K processes (the
t interval's small-sample factor), so that a per-process bias widens the interval instead of
moving it. On synthetic A/As (pair sd 8%, process sd 0-5%, 300 runs each) it covered 1.00 in
89-97% of runs at K = 3, 93-97% at K = 4 and 97% at K = 6, where the bootstrap over pairs alone
covered 63-88% once the process sd was 5% (tests/test_stats.py checks K = 4).
With one process this is the smoothed bootstrap over pairs (each resampled log ratio gets
Gaussian noise of sd = robust sd / sqrt(n): the plain percentile bootstrap of a median is
discrete and covers only ~92-94% at 10-20 pairs; smoothed, 94-96% on every synthetic drift model
tried). No interval from fewer than MIN_PAIRS pairs.

Invariant: every function is pure and deterministic (numpy's PCG64 seeded with BOOTSTRAP_SEED),
so the same pairs always give the same interval, whatever was computed before.
"""

import math
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 15
CONFIDENCE = 0.95
Z_95 = 1.959964
# No interval (and so no verdict) from fewer pairs than this: with 9 pairs the extreme order
# statistics already bound a 95% interval of the median.
MIN_PAIRS = 10
# Asymptotic standard error of a median / that of a mean, for normal data (sqrt(pi / 2)).
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
# Two-sided 97.5% quantiles of Student's t by degrees of freedom (K processes: K - 1); beyond
# the table the normal's.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def _numpy():
    import numpy

    return numpy


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def paired_ratios(config_s: Sequence[float], reference_s: Sequence[float]) -> list:
    """``config_s[i] / reference_s[i]`` for each pair ``i``."""
    if len(config_s) != len(reference_s):
        raise ValueError(f"{len(config_s)} config times for {len(reference_s)} reference times")
    if min(list(config_s) + list(reference_s), default=1.0) <= 0:
        raise ValueError("a block time is not positive")
    return [c / r for c, r in zip(config_s, reference_s)]


def robust_sd(values: Sequence[float]) -> float:
    """min(sample sd, IQR / 1.349): the sd, unless outliers inflate it."""
    numpy = _numpy()
    array = numpy.asarray(values, dtype=float)
    if len(array) < 2:
        return 0.0
    q75, q25 = numpy.percentile(array, [75, 25])
    return float(min(array.std(ddof=1), (q75 - q25) / 1.349))


def median_interval(
    ratios: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Optional[Tuple[float, float]]:
    """The smoothed bootstrap interval of the median ratio (module docstring); None below
    MIN_PAIRS ratios."""
    if len(ratios) < MIN_PAIRS:
        return None
    numpy = _numpy()
    logs = numpy.log(numpy.asarray(ratios, dtype=float))[None, :]
    rng = numpy.random.Generator(numpy.random.PCG64(seed))
    low, high = log_intervals(logs, resamples, rng, confidence)[0]
    return float(math.exp(low)), float(math.exp(high))


def log_intervals(logs: Any, resamples: int, rng: Any, confidence: float = CONFIDENCE) -> Any:
    """The interval of the median of each row of ``logs`` (runs x pairs, log ratios), on the log
    scale: ``[[low, high], ...]``. One draw of indices and noise serves every row."""
    numpy = _numpy()
    runs, n = logs.shape
    indices = rng.integers(0, n, size=(resamples, n))
    noise = rng.normal(0.0, 1.0, size=(resamples, n))
    q75, q25 = numpy.percentile(logs, [75, 25], axis=1)
    sd = logs.std(axis=1, ddof=1) if n > 1 else numpy.zeros(runs)
    bandwidth = numpy.minimum(sd, (q75 - q25) / 1.349) / math.sqrt(n)
    tail = (1 - confidence) / 2
    out = numpy.empty((runs, 2))
    chunk = max(1, 2_000_000 // (resamples * n))  # rows at a time: bounded memory
    for start in range(0, runs, chunk):
        rows = slice(start, start + chunk)
        drawn = logs[rows][:, indices] + bandwidth[rows, None, None] * noise
        middle = numpy.partition(drawn, [(n - 1) // 2, n // 2], axis=2)
        medians = (middle[:, :, (n - 1) // 2] + middle[:, :, n // 2]) / 2
        out[rows] = numpy.quantile(medians, [tail, 1 - tail], axis=1).T
    return out


def t_975(degrees: int) -> float:
    """Student's t 97.5% quantile at ``degrees`` of freedom (the next lower tabled row)."""
    if degrees < 1:
        raise ValueError(f"{degrees} degrees of freedom")
    return T_975[max(d for d in T_975 if d <= degrees)] if degrees <= 30 else Z_95


def _groups(ratios: Sequence[float], processes: Optional[Sequence[Hashable]]) -> List[List[float]]:
    """The log ratios of each process, processes in the order first seen (one group without
    labels)."""
    if processes is None:
        return [[math.log(r) for r in ratios]]
    if len(processes) != len(ratios):
        raise ValueError(f"{len(processes)} process labels for {len(ratios)} ratios")
    groups: Dict[Hashable, List[float]] = {}
    for ratio, process in zip(ratios, processes):
        groups.setdefault(process, []).append(math.log(ratio))
    return list(groups.values())


def components(groups: Sequence[Sequence[float]]) -> Dict[str, Any]:
    """Variance components of log ratios grouped by process: ``within_sd`` (a pair's spread
    inside a process: robust sd of the deviations from each process's median, corrected for the
    medians' degrees of freedom), ``between_sd`` (sd of the processes' own shifts: the variance of
    the process medians less what within-process noise alone puts there, (pi/2) within^2 / n,
    floored at 0), and each process's median (log)."""
    numpy = _numpy()
    medians = [float(numpy.median(g)) for g in groups]
    deviations = [v - m for g, m in zip(groups, medians) for v in g]
    total, count = len(deviations), len(groups)
    within = robust_sd(deviations) * math.sqrt(total / max(1, total - count)) if total > 1 else 0.0
    between = 0.0
    if count > 1:
        noise = sum(MEDIAN_EFFICIENCY**2 * within**2 / len(g) for g in groups) / count
        between = math.sqrt(max(0.0, float(numpy.var(medians, ddof=1)) - noise))
    return {"within_sd": within, "between_sd": between, "medians": medians}


def hierarchical_interval(
    groups: Sequence[Sequence[float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Optional[Tuple[float, float]]:
    """The 95% interval of the median ratio from log ratios grouped by process (module
    docstring), as ratios; None below MIN_PAIRS pairs in all. One process: median_interval.

    Each resample draws K processes with replacement; a drawn process contributes its own
    number of values: center + its shift (rescaled) + deviations from its median drawn with
    replacement from its own, each with the smoothing noise of sd within_sd / sqrt(pairs)."""
    sizes = [len(g) for g in groups if len(g)]
    groups = [list(g) for g in groups if len(g)]
    if sum(sizes) < MIN_PAIRS:
        return None
    if len(groups) == 1:
        return median_interval([math.exp(v) for v in groups[0]], resamples, seed)
    numpy = _numpy()
    rng = numpy.random.Generator(numpy.random.PCG64(seed))
    parts = components(groups)
    medians = numpy.asarray(parts["medians"])
    center = float(numpy.median(numpy.concatenate(groups)))
    shifts = medians - center
    spread = float(shifts.var())
    count = len(groups)
    scale = 0.0
    if spread > 0:
        scale = parts["between_sd"] / math.sqrt(spread) * t_975(count - 1) / Z_95
    shifts = shifts * scale
    deviations = numpy.concatenate([numpy.asarray(g) - m for g, m in zip(groups, medians)])
    sizes_array = numpy.asarray(sizes)
    offsets = numpy.concatenate([[0], numpy.cumsum(sizes_array)[:-1]])
    widest = int(sizes_array.max())
    drawn = rng.integers(0, count, size=(resamples, count))
    within = rng.random(size=(resamples, count, widest))
    drawn_sizes = sizes_array[drawn][..., None]
    inside = numpy.minimum((within * drawn_sizes).astype(int), drawn_sizes - 1)
    valid = numpy.arange(widest) < drawn_sizes
    bandwidth = parts["within_sd"] / math.sqrt(sum(sizes))
    values = center + shifts[drawn][..., None] + deviations[offsets[drawn][..., None] + inside]
    values = values + bandwidth * rng.normal(size=values.shape)
    values = numpy.where(valid, values, numpy.nan).reshape(resamples, -1)
    values.sort(axis=1)  # NaN last
    n = valid.reshape(resamples, -1).sum(axis=1)
    low_middle = numpy.take_along_axis(values, ((n - 1) // 2)[:, None], axis=1)[:, 0]
    high_middle = numpy.take_along_axis(values, (n // 2)[:, None], axis=1)[:, 0]
    medians_drawn = (low_middle + high_middle) / 2
    tail = (1 - CONFIDENCE) / 2
    low, high = numpy.quantile(medians_drawn, [tail, 1 - tail])
    return float(math.exp(low)), float(math.exp(high))


def summarise(
    ratios: Sequence[float], processes: Optional[Sequence[Hashable]] = None
) -> Dict[str, object]:
    """``{"ratio": median, "ci95": [low, high] or None, "n": pairs, "log_sd": sd of log ratios,
    "processes": K, "between_sd", "within_sd", "process_ratios": each process's median}``
    (ci95 is None below MIN_PAIRS pairs; every field None without pairs). ``processes``: the
    process (set) of each ratio; None: all from one."""
    if not ratios:
        return {"ratio": None, "ci95": None, "n": 0, "log_sd": None, "processes": 0}
    groups = _groups(ratios, processes)
    interval = hierarchical_interval(groups)
    logs = [math.log(r) for r in ratios]
    parts = components(groups)
    return {
        "ratio": median(ratios),
        "ci95": list(interval) if interval else None,
        "n": len(ratios),
        "log_sd": robust_sd(logs) if len(logs) > 1 else None,
        "processes": len(groups),
        "within_sd": parts["within_sd"],
        "between_sd": parts["between_sd"] if len(groups) > 1 else None,
        "process_ratios": [math.exp(m) for m in parts["medians"]],
    }


def pairs_needed(log_sd: float, half_width_fraction: float) -> int:
    """Pairs for a 95% interval of the median ratio of about ±``half_width_fraction`` (0.03 for
    ±3%) when paired log ratios have sd ``log_sd``: (z * sqrt(pi/2) * sd / log(1 + h))^2, at
    least MIN_PAIRS."""
    if half_width_fraction <= 0:
        raise ValueError(f"half width {half_width_fraction} must be positive")
    half_width = math.log(1 + half_width_fraction)
    needed = (Z_95 * MEDIAN_EFFICIENCY * log_sd / half_width) ** 2
    return max(MIN_PAIRS, math.ceil(needed))

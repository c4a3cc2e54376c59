"""The benchmark's statistics: paired ratios, their median and a bootstrap 95% interval over pairs.

A sample is a *pair* of adjacent blocks (a configuration's and its reference's, same steps); its
ratio is config time / reference time. The reported ratio is the median of the paired ratios; its
interval is a smoothed percentile bootstrap of that median over pairs, computed on log ratios
(each resampled log ratio gets Gaussian noise of sd = robust sd / sqrt(n): the plain percentile
bootstrap of a median is discrete and covers only ~92-94% at 10-20 pairs; smoothed, 94-96% on
every synthetic drift model tried, tests/test_stats.py). No interval from fewer than MIN_PAIRS.

Invariant: every function is pure and deterministic (numpy's PCG64 seeded with BOOTSTRAP_SEED),
so the same pairs always give the same interval, whatever was computed before.
"""

import math
from typing import Any, Dict, Optional, Sequence, Tuple

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 15
CONFIDENCE = 0.95
Z_95 = 1.959964
# No interval (and so no verdict) from fewer pairs than this: with 9 pairs the extreme order
# statistics already bound a 95% interval of the median.
MIN_PAIRS = 10
# Asymptotic standard error of a median / that of a mean, for normal data (sqrt(pi / 2)).
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)


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


def summarise(ratios: Sequence[float]) -> Dict[str, object]:
    """``{"ratio": median, "ci95": [low, high] or None, "n": pairs, "log_sd": sd of log ratios}``
    (ci95 is None below MIN_PAIRS pairs; every field None without pairs)."""
    if not ratios:
        return {"ratio": None, "ci95": None, "n": 0, "log_sd": None}
    interval = median_interval(ratios)
    logs = [math.log(r) for r in ratios]
    return {
        "ratio": median(ratios),
        "ci95": list(interval) if interval else None,
        "n": len(ratios),
        "log_sd": robust_sd(logs) if len(logs) > 1 else None,
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

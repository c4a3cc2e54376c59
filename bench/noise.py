"""Where the A/A difference comes from: which quantity recorded per block moves with the difference
between two worker processes of native (native-aa ÷ native), the noise the intervals are made of.

Each timed block records (worker.DIAGNOSTICS, runner.block_diagnostics) the GPU time of its steps
(CUDA events), the CPU time of the thread that launched them and its part in the kernel, the time
the hypervisor stole from the CPUs it ran on, its context switches, the CPU it ended on, and the
SM clock NVML read after it. For each workload, over the A/A pairs of each
process set, each quantity's A/A effect per pair (QUANTITIES: a log ratio native-aa ÷ native, or a
difference for counts and shares), the set's median, and its Pearson correlation with the A/A's
own log ratio, across process sets (the between-process difference the intervals miss) and across
pairs; beside them, the CPUs each of the two workers was given in each set and the CPUs its blocks
ended on (a CPU set is a category, not a number: with ``rotate`` on, every set moves it).
Invariant: pure functions of raw results (results.json's calls, or a calibration's records); a
pair without the fields (results from before they were recorded) is counted and left out, never
filled in; a correlation needs MIN_POINTS points that vary, else None.
"""

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import affinity, stats
from .configs import NATIVE, NATIVE_AA

MIN_POINTS = 3
# Below this many process sets a correlation across sets says little (said in the report).
FEW_SETS = 4


def _log_ratio(key: str) -> Callable[[Dict, Dict, Dict], Optional[float]]:
    def effect(pair: Dict, mine: Dict, theirs: Dict) -> Optional[float]:
        a, b = mine.get(key), theirs.get(key)
        return math.log(a / b) if a and b and a > 0 and b > 0 else None

    return effect


def _off_cpu(pair: Dict, mine: Dict, theirs: Dict) -> Optional[float]:
    """The share of the block the launching thread was not on a CPU, native-aa's less native's."""
    shares = []
    for block, elapsed in ((mine, pair["config_s"]), (theirs, pair["ref_s"])):
        if block.get("cpu_s") is None or not elapsed:
            return None
        shares.append(max(0.0, elapsed - block["cpu_s"]) / elapsed)
    return shares[0] - shares[1]


def _share(key: str) -> Callable[[Dict, Dict, Dict], Optional[float]]:
    """The share of the block ``key`` took, native-aa's less native's."""

    def effect(pair: Dict, mine: Dict, theirs: Dict) -> Optional[float]:
        shares = []
        for block, elapsed in ((mine, pair["config_s"]), (theirs, pair["ref_s"])):
            if block.get(key) is None or not elapsed:
                return None
            shares.append(block[key] / elapsed)
        return shares[0] - shares[1]

    return effect


def _difference(key: str) -> Callable[[Dict, Dict, Dict], Optional[float]]:
    def effect(pair: Dict, mine: Dict, theirs: Dict) -> Optional[float]:
        a, b = mine.get(key), theirs.get(key)
        return None if a is None or b is None else float(a - b)

    return effect


# name -> (column title, effect of one pair, how a median effect prints)
QUANTITIES: Dict[str, Tuple[str, Callable[[Dict, Dict, Dict], Optional[float]], str]] = {
    "gpu_s": ("GPU time (events)", _log_ratio("gpu_s"), "ratio"),
    "cpu_s": ("CPU time of the launching thread", _log_ratio("cpu_s"), "ratio"),
    "off_cpu": ("share of the block off the CPU", _off_cpu, "points"),
    "nivcsw": ("involuntary context switches", _difference("nivcsw"), "count"),
    "sm_mhz": ("SM clock after the block", _log_ratio("sm_mhz"), "ratio"),
    "system_s": ("share of the block in the kernel", _share("system_s"), "points"),
    "steal_s": ("share of the block stolen by the hypervisor", _share("steal_s"), "points"),
}


def correlation(xs: Sequence[Optional[float]], ys: Sequence[Optional[float]]) -> Optional[float]:
    """Pearson's r over the positions where both are known; None below MIN_POINTS or without
    variation."""
    points = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(points) < MIN_POINTS:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    if sxx <= 0 or syy <= 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / math.sqrt(sxx * syy)


def _median(values: Iterable[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return stats.median(known) if known else None


class ProcessSet:
    """The A/A pairs of one workload in one process set, and where the two workers ran."""

    def __init__(self, label: str, pairs: List[Dict[str, Any]], cpus: Dict[str, Optional[str]]):
        self.label, self.pairs, self.cpus = label, pairs, cpus


def _aa_pairs(pairs: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [p for p in pairs if p.get("config") == NATIVE_AA and p.get("ref") == NATIVE]


def _given_cpus(process_set: Optional[Dict[str, Any]]) -> Dict[str, Optional[str]]:
    """Each worker's CPU list in a process set's facts (isolation's ``cpus``, else each worker's
    own set-up facts)."""
    facts = process_set or {}
    given = dict(facts.get("cpus") or {})
    for name, info in (facts.get("workers") or {}).items():
        cpus = ((info or {}).get("setup") or {}).get("cpus")
        if name not in given and cpus:
            given[name] = cpus
    return {NATIVE: given.get(NATIVE), NATIVE_AA: given.get(NATIVE_AA)}


def sets_of_calls(calls: Sequence[Dict[str, Any]]) -> Dict[str, List[ProcessSet]]:
    """``{workload: [ProcessSet]}`` from results.json's calls (a workload record is one set)."""
    out: Dict[str, List[ProcessSet]] = {}
    for number, call in enumerate(calls):
        facts = {s.get("index"): s for s in call.get("process_sets", [])}
        for record in call.get("workloads", []):
            index = record.get("process_set", 0)
            label = f"{index + 1}" if len(calls) == 1 else f"{number + 1}.{index + 1}"
            out.setdefault(record["workload"], []).append(
                ProcessSet(label, _aa_pairs(record.get("pairs", [])),
                           _given_cpus(facts.get(index))))
    return out


def sets_of_calibration(raw: Dict[str, Any]) -> Dict[str, List[ProcessSet]]:
    """The same from a calibration's raw group (calibration.json's ``groups[G]``): the pairs of
    every block length of a process set together (the same two processes)."""
    facts = {s.get("index"): s for s in raw.get("sets", [])}
    out: Dict[str, List[ProcessSet]] = {}
    for record in raw.get("records", []):
        index = record.get("process_set", 0)
        pairs = [p for block in record.get("blocks", {}).values() for p in block.get("pairs", [])]
        out.setdefault(record["workload"], []).append(
            ProcessSet(f"{index + 1}", _aa_pairs(pairs), _given_cpus(facts.get(index))))
    return out


def _has_fields(pair: Dict[str, Any]) -> bool:
    return isinstance(pair.get("config_block"), dict) and isinstance(pair.get("ref_block"), dict)


def _ended_on(pairs: Sequence[Dict[str, Any]], side: str) -> List[int]:
    return sorted({p[side]["cpu"] for p in pairs if p[side].get("cpu") is not None})


def diagnose_sets(process_sets: Sequence[ProcessSet]) -> Dict[str, Any]:
    """One workload's diagnosis (module docstring)."""
    without = sum(1 for s in process_sets for p in s.pairs if not _has_fields(p))
    rows, aa_by_pair, effects_by_pair = [], [], {q: [] for q in QUANTITIES}
    for process_set in process_sets:
        pairs = [p for p in process_set.pairs if _has_fields(p)]
        if not pairs:
            continue
        aa = [math.log(p["config_s"] / p["ref_s"]) for p in pairs]
        effects = {q: [effect(p, p["config_block"], p["ref_block"]) for p in pairs]
                   for q, (_, effect, _) in QUANTITIES.items()}
        aa_by_pair += aa
        for q, values in effects.items():
            effects_by_pair[q] += values
        rows.append({
            "set": process_set.label,
            "pairs": len(pairs),
            "aa": _median(aa),
            "effects": {q: _median(v) for q, v in effects.items()},
            "cpus": process_set.cpus,
            "ended_on": {NATIVE: _ended_on(pairs, "ref_block"),
                         NATIVE_AA: _ended_on(pairs, "config_block")},
        })
    correlations = {
        q: {"sets": correlation([r["effects"][q] for r in rows], [r["aa"] for r in rows]),
            "pairs": correlation(effects_by_pair[q], aa_by_pair)}
        for q in QUANTITIES
    }
    return {"sets": rows, "pairs": len(aa_by_pair), "pairs_without_fields": without,
            "correlations": correlations, "closest": closest(correlations)}


def closest(correlations: Dict[str, Dict[str, Optional[float]]]) -> Dict[str, Any]:
    """The quantity whose effect correlates most with the A/A, across sets and across pairs
    (by |r|; None where no correlation could be computed)."""
    out: Dict[str, Any] = {}
    for scope in ("sets", "pairs"):
        known = [(abs(c[scope]), q, c[scope]) for q, c in correlations.items()
                 if c[scope] is not None]
        out[scope] = None if not known else {"quantity": max(known)[1], "r": max(known)[2]}
    return out


def diagnose(sets_by_workload: Dict[str, List[ProcessSet]]) -> Dict[str, Any]:
    """``{workload: diagnosis}`` for every workload with A/A pairs that carry the fields."""
    out = {}
    for workload, process_sets in sets_by_workload.items():
        diagnosis = diagnose_sets(process_sets)
        if diagnosis["sets"]:
            out[workload] = diagnosis
    return out


def diagnose_calls(calls: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    return diagnose(sets_of_calls(calls))


# --- Markdown ---------------------------------------------------------------------------------


def _effect_text(value: Optional[float], kind: str) -> str:
    if value is None:
        return "—"
    if kind == "ratio":
        return f"{math.exp(value):.3f}"
    if kind == "points":
        return f"{100 * value:+.1f} pt"
    return f"{value:+.1f}"


def _r_text(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _where(row: Dict[str, Any], name: str) -> str:
    given = row["cpus"].get(name) or "?"
    ended = affinity.format_cpulist(row["ended_on"][name]) if row["ended_on"][name] else "?"
    return f"{given} (ended on {ended})"


def markdown(diagnoses: Dict[str, Any]) -> List[str]:
    """The section of report.md (and of ``python3 -m bench noise``); [] without diagnoses."""
    if not diagnoses:
        return []
    titles = [title for title, _, _ in QUANTITIES.values()]
    lines = [
        "Per process set: the A/A (native-aa ÷ native, median of its pairs) and, per block "
        "quantity, native-aa's against native's (a ratio; a difference in points of the block "
        "or in counts). r: Pearson's correlation of a quantity's effect with the A/A's log "
        "ratio, across process sets (the difference between processes) / across pairs; "
        f"fewer than {FEW_SETS} sets say little. CPUs: each worker's CPU set (the CPUs its "
        "blocks ended on).",
        "",
        "| workload | set | A/A | " + " | ".join(titles) + " | native's CPUs | native-aa's CPUs |",
        "|---" * (len(titles) + 5) + "|",
    ]
    kinds = [kind for _, _, kind in QUANTITIES.values()]
    verdicts = []
    for workload, diagnosis in diagnoses.items():
        for row in diagnosis["sets"]:
            effects = [_effect_text(row["effects"][q], k) for q, k in zip(QUANTITIES, kinds)]
            lines.append(f"| `{workload}` | {row['set']} ({row['pairs']} pairs) | "
                         f"{_effect_text(row['aa'], 'ratio')} | " + " | ".join(effects)
                         + f" | {_where(row, NATIVE)} | {_where(row, NATIVE_AA)} |")
        r = [f"{_r_text(c['sets'])} / {_r_text(c['pairs'])}"
             for c in diagnosis["correlations"].values()]
        lines.append(f"| `{workload}` | r: sets / pairs | | " + " | ".join(r) + " | | |")
        verdicts.append(verdict(workload, diagnosis))
    lines += ["", *[f"- {v}" for v in verdicts]]
    return lines


def verdict(workload: str, diagnosis: Dict[str, Any]) -> str:
    """One line: the quantity closest to the A/A across sets and across pairs (the largest |r|,
    however small: the line gives r)."""
    parts = []
    sets = len(diagnosis["sets"])
    for scope, what in (("sets", f"across {sets} process sets"),
                        ("pairs", f"across {diagnosis['pairs']} pairs")):
        best = diagnosis["closest"][scope]
        if best is None:
            parts.append(f"{what}: no correlation (too few points, or none varies)")
        else:
            parts.append(f"{what}: {QUANTITIES[best['quantity']][0]} (r = {best['r']:+.2f})")
    text = f"`{workload}`: closest to the A/A " + "; ".join(parts)
    if sets < FEW_SETS:
        text += f" ({sets} sets: weak evidence)"
    if diagnosis["pairs_without_fields"]:
        text += f"; {diagnosis['pairs_without_fields']} pairs recorded none of these"
    return text + "."

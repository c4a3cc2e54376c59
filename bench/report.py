"""From the children's records to the latest.json document: ratios to native, intervals, A/A.

Invariant: every ratio compares two records of the *same repeat* (a configuration's and
native's), and a reported value is the median of those per-repeat ratios with its seeded
bootstrap interval; a repeat where either side failed is left out and named in
``repeat_errors``. A cell exists only for a workload its configuration ran. Memory ratios use
native's peak live bytes as the denominator for every configuration.
"""

import statistics
from typing import Any, Dict, Optional, Sequence

from . import stats, targets
from .configs import NATIVE, NATIVE_AA
from .schedules import has_memory_ratio

# A configuration holding more than this fraction of native's peak live bytes above what native
# holds at a workload's start has its memory ratio marked as a lower bound.
HELD_LOWER_BOUND_FRACTION = 0.05

Runs = Sequence[Dict[str, Dict[str, Any]]]


# Below this many repeats (of a configuration or of the A/A control) no difference is claimed.
MIN_REPEATS_TO_CLAIM = 3

def _median_int(values: Sequence[int]) -> int:
    return int(round(statistics.median(values)))


def _memory_fields(workload: str, pairs: Sequence[tuple]) -> Dict[str, Any]:
    """peak_device_bytes, peak_live_bytes (native's), peak_memory_ratio with its interval and
    spread, and the lower-bound flag, from (config record, native record) pairs."""
    live = _median_int([native["peak_live_bytes"] for _, native in pairs])
    fields: Dict[str, Any] = {
        "peak_device_bytes": _median_int([mine["peak_device_bytes"] for mine, _ in pairs]),
        "peak_live_bytes": live,
        "held_at_start_bytes": _median_int([m["held_at_start_bytes"] for m, _ in pairs]),
        "peak_memory_ratio": None,
    }
    if not has_memory_ratio(workload) or min(n["peak_live_bytes"] for _, n in pairs) <= 0:
        return fields
    per_repeat = [m["peak_device_bytes"] / n["peak_live_bytes"] for m, n in pairs]
    fields.update(stats.summarise_ratios("peak_memory_ratio", per_repeat))
    excess_held_bytes = statistics.median(
        [m["held_at_start_bytes"] - n["held_at_start_bytes"] for m, n in pairs]
    )
    fields["peak_memory_lower_bound"] = excess_held_bytes > HELD_LOWER_BOUND_FRACTION * live
    return fields


def aggregate_cell(runs: Runs, config: str, workload: str) -> Optional[Dict[str, Any]]:
    """The result of ``config`` on ``workload`` over all repeats (see the module's invariant);
    ``{"error": ...}`` when no repeat produced both records; None when it never ran it."""
    pairs, errors = [], []
    for run in runs:
        if config not in run or workload not in run[config]["workloads"]:
            continue
        mine, native = run[config]["workloads"][workload], run[NATIVE]["workloads"][workload]
        if "error" in mine:
            errors.append(mine["error"])
        elif "error" in native:
            errors.append(f"native failed in the same repeat: {native['error']}")
        else:
            pairs.append((mine, native))
    if not pairs:
        return {"error": errors[0]} if errors else None
    cell: Dict[str, Any] = {}
    for clock in ("time", "gpu_time"):
        key = "host_time_s" if clock == "time" else "gpu_time_s"
        per_repeat = stats.ratios([m[key] for m, _ in pairs], [n[key] for _, n in pairs])
        cell.update(stats.summarise_ratios(f"{clock}_ratio", per_repeat))
    units = pairs[0][0]["units"]
    cell["unit"] = pairs[0][0]["unit"]
    cell["host_time_per_unit_s"] = statistics.median([m["host_time_s"] / units for m, _ in pairs])
    cell["gpu_time_per_unit_s"] = statistics.median([m["gpu_time_s"] / units for m, _ in pairs])
    cell["repeats_measured"] = len(pairs)
    cell.update(_memory_fields(workload, pairs))
    if errors:
        cell["repeat_errors"] = errors
    return cell


def aggregate(runs: Runs, configs: Sequence[str], workloads: Sequence[str]) -> Dict[str, Any]:
    """``{workload: {config: cell}}`` for the configurations that ran each workload, each cell
    compared with the A/A control's interval where native-aa ran (``time_vs_aa``,
    ``gpu_time_vs_aa``: "lower", "higher", "within A/A", or "too few repeats" when either was
    measured in fewer than MIN_REPEATS_TO_CLAIM repeats: one repeat's "interval" is a point, and
    two points never overlap)."""
    table: Dict[str, Dict[str, Any]] = {}
    for workload in workloads:
        cells = {c: aggregate_cell(runs, c, workload) for c in configs}
        cells = {c: cell for c, cell in cells.items() if cell is not None}
        aa = cells.get(NATIVE_AA, {})
        for config, cell in cells.items():
            if "error" in cell or config in (NATIVE, NATIVE_AA):
                continue
            measured = min(cell["repeats_measured"], aa.get("repeats_measured", 0))
            for clock in ("time", "gpu_time"):
                aa_interval = aa.get(f"{clock}_ratio_ci95")
                verdict = stats.compare_with_aa(cell[f"{clock}_ratio_ci95"], aa_interval)
                if verdict is not None and measured < MIN_REPEATS_TO_CLAIM:
                    verdict = "too few repeats"
                if verdict is not None:
                    cell[f"{clock}_vs_aa"] = verdict
        table[workload] = cells
    return table


def run_facts(runs: Runs) -> Dict[str, str]:
    """GPU name, torch and CUDA versions (from the first child that reported them) and the
    streampool version (from a streampool child)."""
    infos = [run[config]["info"] for run in runs for config in run if run[config]["info"]]
    first = infos[0] if infos else {}
    versions = [info["streampool_version"] for info in infos if "streampool_version" in info]
    return {
        "device": first.get("device", "unknown (no child started CUDA)"),
        "torch": first.get("torch", "unknown"),
        "cuda": first.get("cuda", "unknown"),
        "streampool": versions[0] if versions else "unknown (no streampool child started)",
    }


def child_wall_times_s(runs: Runs) -> Dict[str, float]:
    """Median wall time of each configuration's child process, for planning GPU time."""
    names = list(dict.fromkeys(c for run in runs for c in run))
    times = {c: [run[c].get("wall_s", 0.0) for run in runs if c in run] for c in names}
    return {c: round(statistics.median(t), 2) for c, t in times.items() if t}


def build_report(
    runs: Runs,
    *,
    configs: Sequence[str],
    workloads: Sequence[str],
    repeats_requested: int,
    orders: Sequence[Sequence[str]],
    stop_reason: Optional[str],
    cotenant: Dict[str, Any],
    facts: Dict[str, Any],
    target_document: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The latest.json document. ``facts``: command, date, driver, quick, variants, elapsed_s;
    ``cotenant``: ``{"cells": summarise(rounds), "rounds": rounds}`` (or empty)."""
    found = run_facts(runs)
    report: Dict[str, Any] = {
        "device": found["device"],
        "driver": facts.get("driver", "unknown"),
        "torch": found["torch"],
        "cuda": found["cuda"],
        "streampool": found["streampool"],
        "date": facts.get("date", ""),
        "command": facts.get("command", ""),
        "quick": facts.get("quick", False),
        "repeats": len(runs),
        "repeats_requested": repeats_requested,
        "stop_reason": stop_reason,
        "configs": list(configs),
        "variants": facts.get("variants", {}),
        "config_orders": [list(order) for order in orders],
        "aa_config": NATIVE_AA if NATIVE_AA in configs else None,
        "elapsed_s": facts.get("elapsed_s"),
        "child_wall_s": child_wall_times_s(runs),
        "workloads": aggregate(runs, configs, workloads) if runs else {},
        "cotenant": cotenant.get("cells", {}),
        "raw": list(runs),
        "cotenant_raw": cotenant.get("rounds", []),
    }
    report["targets"] = targets.judge(report, target_document)
    return report


def partial_document(runs: Runs, inputs: Dict[str, Any]) -> Dict[str, Any]:
    """What latest.json holds while a run goes on: the repeats so far and the inputs of
    build_report, no statistics (they take seconds); ``rebuild`` makes the report from it."""
    return {"partial": True, "repeats": len(runs), "inputs": inputs, "raw": list(runs)}


def rebuild(document: Dict[str, Any]) -> Dict[str, Any]:
    """The report of a run that stopped before its end, from its last partial_document."""
    runs = document["raw"]
    reason = f"incomplete: the run stopped after {len(runs)} repeat(s)"
    return build_report(runs, stop_reason=reason, **document["inputs"])

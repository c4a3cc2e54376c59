"""The targets (bench/targets.json) and their verdicts on a report.

Invariant: one rule (targets.json "about"): "<= X" is met when the interval's upper end is <= X,
">= X" when its lower end is >= X, "< X" when the upper end is < X; never by a median alone. A
time ratio without an interval (fewer than stats.MIN_PAIRS pairs) is "no interval", a failed
cell "failed", one that did not run "not measured": none of them is met. Rows are made for every
judged configuration and workload named, run or not, so a missing measurement shows.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .configs import NATIVE_AA, THRESHOLD

TARGETS_PATH = Path(__file__).with_name("targets.json")
METRICS = {
    "time": ("workloads",),
    "memory": ("workloads",),
    "aa": ("workloads", "at_least", "at_most"),
    "cotenant": ("config", "idle_s", "at_most"),
    "price": ("workload", "at_most"),
}
BOUNDS = ("at_most", "at_least", "at_most_config", "below_config")


def load(path: Path = TARGETS_PATH) -> Dict[str, Any]:
    """The targets document; raises ValueError naming a target that cannot be judged."""
    document = json.loads(Path(path).read_text())
    for target in document["targets"]:
        metric = target.get("metric")
        if metric not in METRICS:
            raise ValueError(f"target {target}: metric must be one of {', '.join(METRICS)}")
        missing = [key for key in METRICS[metric] if key not in target]
        if missing or not any(key in target for key in BOUNDS):
            raise ValueError(f"target {target} lacks {', '.join(missing) or 'a bound'}")
    return document


def verdict(interval: Optional[Tuple[float, float]], target: Dict[str, Any], bound=None) -> str:
    """met / not met for ``interval`` (low, high) against the target's bounds (module rule);
    ``bound``: the other configuration's lowest value, for at_most_config / below_config."""
    low, high = interval
    met = True
    if "at_most" in target:
        met &= high <= target["at_most"]
    if "at_least" in target:
        met &= low >= target["at_least"]
    if "at_most_config" in target:
        met &= high <= bound
    if "below_config" in target:
        met &= high < bound
    return "met" if met else "not met"


def target_text(target: Dict[str, Any]) -> str:
    parts = []
    if "at_least" in target:
        parts.append(f">= {target['at_least']:.2f}")
    if "at_most" in target:
        parts.append(f"<= {target['at_most']:.2f}")
    if "at_most_config" in target:
        parts.append(f"<= {target['at_most_config']}")
    if "below_config" in target:
        parts.append(f"< {target['below_config']}")
    unit = {"time": "×native", "aa": "×native", "price": "× streampool", "cotenant": "GiB"}
    return " and ".join(parts) + f" {unit.get(target['metric'], '')}".rstrip()


def _time_row(cell: Optional[Dict[str, Any]], target: Dict[str, Any]) -> Dict[str, Any]:
    if not cell:
        return {"status": "not measured"}
    if cell.get("failed"):
        return {"status": "failed", "error": cell["errors"][0]}
    time = cell.get("time") or {}
    if time.get("ratio") is None:
        return {"status": "not measured"}
    row = {"value": time["ratio"], "interval": time["ci95"], "n": time["n"]}
    if time["ci95"] is None:
        return {**row, "status": "no interval"}
    return {**row, "status": verdict(tuple(time["ci95"]), target)}


def _memory_row(cells: Dict[str, Any], config: str, target: Dict[str, Any]) -> Dict[str, Any]:
    cell = cells.get(config)
    if not cell:
        return {"status": "not measured"}
    if cell.get("failed") or not cell.get("memory"):
        return {"status": "failed" if cell.get("failed") else "not measured",
                "error": (cell.get("errors") or [""])[0]}
    memory = cell["memory"]
    row = {"value": memory["ratio"], "interval": [memory["low"], memory["high"]]}
    other = target.get("at_most_config") or target.get("below_config")
    other_memory = (cells.get(other) or {}).get("memory")
    if other_memory is None:
        return {**row, "status": f"not judged ({other} not measured)"}
    row["compared_with"] = other_memory["low"]
    return {**row, "status": verdict((memory["low"], memory["high"]), target, other_memory["low"])}


def _cotenant_row(report: Dict[str, Any], target: Dict[str, Any]) -> Dict[str, Any]:
    cell = report.get("cotenant", {}).get(target["config"])
    if not cell:
        return {"status": "not measured"}
    if "error" in cell:
        return {"status": "failed", "error": cell["error"]}
    probes = [p for p in cell["probes"] if abs(p["idle_s"] - target["idle_s"]) < 1.0]
    if not probes:
        return {"status": "not measured"}
    probe = probes[0]
    interval = (probe["held_gib_min"], probe["held_gib_max"])
    row = {"value": probe["held_gib_median"], "interval": list(interval)}
    return {**row, "status": verdict(interval, target)}


def judge(report: Dict[str, Any], document: Optional[Dict[str, Any]] = None) -> List[dict]:
    """One row per target and judged configuration (and workload): ``metric``, ``workload``,
    ``config``, ``target`` (text), ``status``, and where measured ``value``, ``interval``."""
    document = load() if document is None else document
    cells = report.get("workloads", {})
    rows = []
    for target in document["targets"]:
        metric, text = target["metric"], target_text(target)
        if metric == "cotenant":
            row = _cotenant_row(report, target)
            rows.append({"metric": metric, "workload": f"idle {target['idle_s']:g} s",
                         "config": target["config"], "target": text, **row})
            continue
        if metric == "price":
            cell = cells.get(target["workload"], {}).get(THRESHOLD)
            rows.append({"metric": metric, "workload": target["workload"], "config": THRESHOLD,
                         "target": text, **_time_row(cell, target)})
            continue
        configs = [NATIVE_AA] if metric == "aa" else document["judged_configs"]
        for workload in target["workloads"]:
            for config in configs:
                workload_cells = cells.get(workload, {})
                if metric == "memory":
                    row = _memory_row(workload_cells, config, target)
                else:
                    row = _time_row(workload_cells.get(config), target)
                rows.append({"metric": metric, "workload": workload, "config": config,
                             "target": text, **row})
    return rows

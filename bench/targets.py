"""The targets (bench/targets.json) and their verdicts on one run's report.

Invariant: a ratio target is "met" only if the 95% interval's upper end is at or below its
``upper_at_most`` (and the median at or below ``median_at_most`` where one is given); a median
alone never meets a target. A memory ratio that is only a lower bound is not judged. The
co-tenant target is met only if the configuration's smallest fit over its repeats exceeds the
largest of every listed configuration that was measured. Rows are made only for configurations
and workloads that ran.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

TARGETS_PATH = Path(__file__).with_name("targets.json")
COTENANT_METRIC = "cotenant_fit_fraction"


def load(path: Path = TARGETS_PATH) -> Dict[str, Any]:
    """The targets document; raises ValueError if a target lacks what judging it needs."""
    document = json.loads(Path(path).read_text())
    for target in document["targets"]:
        if target["metric"] == COTENANT_METRIC:
            needed = ("workload", "config", "above_all_of")
        else:
            needed = ("workload", "upper_at_most")
        missing = [key for key in needed if key not in target]
        if missing:
            raise ValueError(f"target {target} lacks {', '.join(missing)}")
    return document


def target_text(target: Dict[str, Any]) -> str:
    """How the target reads in a table, e.g. ``≤ 1.00×, upper end ≤ 1.02``."""
    if target["metric"] == COTENANT_METRIC:
        return "> " + ", ".join(target["above_all_of"]) + " (no empty_cache)"
    upper = f"upper end ≤ {target['upper_at_most']:.2f}"
    if "median_at_most" in target:
        return f"median ≤ {target['median_at_most']:.2f}×, {upper}"
    return upper


def _ratio_row(report: Dict[str, Any], target: Dict[str, Any], config: str) -> Optional[dict]:
    cell = report["workloads"].get(target["workload"], {}).get(config)
    if cell is None:
        return None
    row = {
        "workload": target["workload"],
        "metric": target["metric"],
        "config": config,
        "target": target_text(target),
    }
    if "error" in cell or cell.get(target["metric"]) is None:
        return {**row, "median": None, "ci95": None, "status": "not measured"}
    median, (low, high) = cell[target["metric"]], cell[f"{target['metric']}_ci95"]
    row.update(median=median, ci95=[low, high])
    if target["metric"] == "peak_memory_ratio" and cell.get("peak_memory_lower_bound"):
        return {**row, "status": "not judged (memory held before the workload)"}
    met = high <= target["upper_at_most"] and median <= target.get("median_at_most", float("inf"))
    return {**row, "status": "met" if met else "not met"}


def _cotenant_row(report: Dict[str, Any], target: Dict[str, Any]) -> Optional[dict]:
    cells = report.get("cotenant", {})
    config = target["config"]
    if config not in cells:
        return None
    row = {
        "workload": target["workload"],
        "metric": COTENANT_METRIC,
        "config": config,
        "target": target_text(target),
    }
    mine = cells[config]
    others = {n: cells[n] for n in target["above_all_of"] if n in cells and "error" not in cells[n]}
    if "error" in mine:
        return {**row, "median": None, "ci95": None, "status": "not measured"}
    row.update(
        median=mine[COTENANT_METRIC],
        ci95=[mine[f"{COTENANT_METRIC}_min"], mine[f"{COTENANT_METRIC}_max"]],
    )
    if not others:
        return {**row, "status": "not judged (no PyTorch configuration measured)"}
    best_other = max(cell[f"{COTENANT_METRIC}_max"] for cell in others.values())
    met = mine[f"{COTENANT_METRIC}_min"] > best_other
    return {**row, "compared_with": sorted(others), "status": "met" if met else "not met"}


def judge(report: Dict[str, Any], document: Optional[Dict[str, Any]] = None) -> List[dict]:
    """One row per (target, judged configuration that ran it): workload, metric, config, target
    text, median, ci95 (for the co-tenant: min and max over repeats) and status."""
    document = load() if document is None else document
    rows = []
    for target in document["targets"]:
        if target["metric"] == COTENANT_METRIC:
            row = _cotenant_row(report, target)
            rows += [row] if row else []
            continue
        for config in document["judged_configs"]:
            if config in report["configs"]:
                row = _ratio_row(report, target, config)
                rows += [row] if row else []
    return rows

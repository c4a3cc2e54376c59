"""From the raw results of one or more runs (results.json each) to the report (report.json).

A run is one ``python3 -m bench`` command (a group of workloads); ``merge`` pools several.
Invariant: a time ratio is the median of paired ratios, each pair two adjacent blocks of the *same
run* on the same steps, pooled over runs; its interval is stats.summarise's two-level bootstrap
with each workload record as one process (a record is one set of worker processes: a run makes one
per process set, a merge pools them), none below stats.MIN_PAIRS pairs. A memory ratio is a
configuration's peak device memory ÷ native's peak live bytes of the *same run*; over several runs
(process sets) the report keeps the median and the lowest and highest. A configuration that failed
on a workload in a run contributes no pairs from that run and its error is kept; a cell without any
measurement is a failure, never absent. ``aa_noise`` (noise.py) relates the A/A of each process set
to what its blocks recorded; empty for results recorded before blocks carried those fields.
"""

from typing import Any, Dict, List, Optional, Sequence

from . import noise, stats, targets
from .configs import NATIVE, NATIVE_AA, POOL_THRESHOLD, THRESHOLD, VMM_THRESHOLD
from .schedules import UNIT_SCALE, has_memory_ratio

FORMAT = 2


def _calls_facts(calls: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Device, versions and commands over the runs (a mismatch is named, not hidden)."""
    infos = [info for call in calls for info in call.get("workers", {}).values() if info]

    def values(key: str, source) -> List[str]:
        return sorted({str(item[key]) for item in source if item.get(key) not in (None, "")})

    facts = [call.get("facts", {}) for call in calls]
    return {
        "device": values("device", infos) or ["unknown (no worker started CUDA)"],
        "torch": values("torch", infos) or ["unknown"],
        "cuda": values("cuda", infos) or ["unknown"],
        "streampool": values("streampool_version", infos) or ["unknown"],
        "driver": values("driver", facts) or ["unknown"],
        "commands": [f.get("command", "") for f in facts],
        "dates": [f.get("date", "") for f in facts],
        "block_s": sorted({f.get("block_s") for f in facts if f.get("block_s") is not None}),
        "idle_release_s": [f.get("idle_release_s") for f in facts],
        "nvml": [f.get("nvml") for f in facts],
        "gpu": [gpu_summary(call) for call in calls],
    }


def gpu_summary(call: Dict[str, Any]) -> Dict[str, Any]:
    """SM clock range, highest power and throttled pairs over the run's timed pairs."""
    pairs = [p for run in call.get("workloads", []) for p in run.get("pairs", [])]
    samples = [s for p in pairs for s in p.get("gpu", []) if s]
    clocks = [s["sm_mhz"] for s in samples if s.get("sm_mhz") is not None]
    power = [s["power_w"] for s in samples if s.get("power_w") is not None]
    return {
        "pairs": len(pairs),
        "throttled_pairs": sum(1 for p in pairs if p.get("throttled")),
        "sm_mhz": [min(clocks), max(clocks)] if clocks else None,
        "power_w_max": max(power) if power else None,
    }


def _memory(records: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """``records``: (config's memory pass, native's) per run -> the memory figures, from the
    runs where both were read."""
    usable = [
        (mine, native)
        for mine, native in records
        if mine.get("peak_device_bytes") is not None and (native.get("peak_live_bytes") or 0) > 0
    ]
    if not usable:
        return None
    ratios = [mine["peak_device_bytes"] / native["peak_live_bytes"] for mine, native in usable]
    return {
        "ratio": stats.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "runs": len(ratios),
        "peak_device_bytes": int(stats.median([m["peak_device_bytes"] for m, _ in usable])),
        "peak_live_bytes": int(stats.median([n["peak_live_bytes"] for _, n in usable])),
        "sources": sorted({m["memory_source"] for m, _ in usable}),
    }


def _cell(workload: str, config: str, runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One configuration on one workload over ``runs`` (raw workload records of runs)."""
    cell: Dict[str, Any] = {"errors": [], "runs": 0}
    pairs, memory_records, gaps, own_blocks, units = [], [], [], [], None
    processes: List[int] = []
    for index, (run, idle_release_s) in enumerate(runs):
        prepared, failed = run.get("prepare", {}), run.get("failed", {})
        if config not in prepared and config not in failed:
            continue
        cell["runs"] += 1
        if config in failed:
            cell["errors"].append(failed[config])
            continue
        if config == NATIVE or NATIVE in prepared:
            memory_records.append((prepared[config], prepared.get(NATIVE, {})))
        mine = [p for p in run.get("pairs", []) if p["config"] == config]
        as_ref = [p for p in run.get("pairs", []) if p["ref"] == config]
        pairs += mine
        processes += [index] * len(mine)
        own_blocks += [p["config_s"] / p["units"] for p in mine]
        own_blocks += [p["ref_s"] / p["units"] for p in as_ref]
        gaps += [p["config_idle_s"] for p in mine if p.get("config_idle_s") is not None]
        gaps += [p["ref_idle_s"] for p in as_ref if p.get("ref_idle_s") is not None]
        if idle_release_s is not None:
            cell["idle_release_s"] = idle_release_s
        peak = run.get("process_peak_bytes", {}).get(config)
        baseline = run.get("baseline_process_bytes", {}).get(config)
        if peak is not None and baseline is not None:  # NVML, with every worker alive
            during = max(peak - baseline, cell.get("process_bytes_during_timing", 0))
            cell["process_bytes_during_timing"] = during
        units = prepared[config].get("unit", units)
    if cell["runs"] == 0:
        return {}
    if pairs:
        ratios = stats.paired_ratios([p["config_s"] for p in pairs], [p["ref_s"] for p in pairs])
        cell["time"] = {**stats.summarise(ratios, processes), "ref": pairs[0]["ref"]}
        cell["throttled_pairs"] = sum(1 for p in pairs if p.get("throttled"))
    if own_blocks:
        cell["per_unit_s"] = stats.median(own_blocks)
        cell["unit"] = units
    elif config != NATIVE and len(cell["errors"]) < cell["runs"]:
        cell["errors"].append("no pair was timed")
    if has_memory_ratio(workload) and memory_records:
        cell["memory"] = _memory(memory_records)
    if gaps:
        cell["max_idle_s"] = max(gaps)
        release = cell.get("idle_release_s")
        cell["gap_over_idle_release"] = release is not None and max(gaps) >= release
    if cell["errors"] and "time" not in cell and "memory" not in cell:
        cell["failed"] = True
    return cell


def workload_cells(calls: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``{workload: {config: cell}}`` over every run, workloads in the order first seen."""
    runs: Dict[str, List] = {}
    for call in calls:
        release = call.get("facts", {}).get("idle_release_s")
        for run in call.get("workloads", []):
            runs.setdefault(run["workload"], []).append((run, release))
    table = {}
    for workload, records in runs.items():
        configs = []
        for run, _ in records:
            configs += list(run.get("prepare", {})) + list(run.get("failed", {}))
        cells = {c: _cell(workload, c, records) for c in dict.fromkeys(configs)}
        table[workload] = {c: cell for c, cell in cells.items() if cell}
    return table


def cotenant_cells(calls: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``{A's configuration: {"probes": [{"idle_s", "held_gib_median", "held_gib_min",
    "held_gib_max", "free_gib_min", "confirmed"}], "rounds", "empty_cache_called"}}`` or
    ``{"error"}``."""
    trials: Dict[str, List[Dict[str, Any]]] = {}
    for call in calls:
        for trial in call.get("cotenant", []):
            trials.setdefault(trial["config"], []).append(trial)
    cells = {}
    for name, results in trials.items():
        measured = [t for t in results if "error" not in t]
        errors = [t["error"] for t in results if "error" in t]
        if not measured:
            cells[name] = {"error": errors[0], "rounds": 0}
            continue
        probes = []
        for i, first in enumerate(measured[0]["probes"]):
            at = [t["probes"][i] for t in measured if len(t["probes"]) > i]
            held = [p["held_beyond_live_bytes"] / 2**30 for p in at]
            probes.append(
                {
                    "idle_s": first["idle_s"],
                    "held_gib_median": stats.median(held),
                    "held_gib_min": min(held),
                    "held_gib_max": max(held),
                    "free_gib_min": min(p["free_bytes"] for p in at) / 2**30,
                    "confirmed": all(p["confirmed"] for p in at),
                    "errors": [p["error"] for p in at if p.get("error")],
                }
            )
        cells[name] = {
            "probes": probes,
            "rounds": len(measured),
            "empty_cache_called": measured[0]["empty_cache_called"],
            "live_gib": measured[0]["live_bytes"] / 2**30,
            "errors": errors,
        }
    return cells


def sleep_of(calls: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The sleep group's report (bench/sleep_report.py's, without the raw records) of the last
    call that ran it; None if none did."""
    found = [call["sleep"] for call in calls if call.get("sleep")]
    return found[-1] if found else None


def build(
    calls: Sequence[Dict[str, Any]], target_document=None, merge_command: Optional[str] = None
) -> Dict[str, Any]:
    """The report of ``calls`` (raw results.json documents, one per run)."""
    workloads = workload_cells(calls)
    report = {
        "format": FORMAT,
        "facts": {**_calls_facts(calls), "merge_command": merge_command},
        "workloads": workloads,
        "cotenant": cotenant_cells(calls),
        "sleep": sleep_of(calls),
        "price": workloads.get("gpt2", {}).get(THRESHOLD, {}).get("time"),
        "price_vmm": workloads.get("gpt2", {}).get(VMM_THRESHOLD, {}).get("time"),
        "price_pool": workloads.get("gpt2", {}).get(POOL_THRESHOLD, {}).get("time"),
        "aa": {w: cells[NATIVE_AA].get("time") for w, cells in workloads.items()
               if NATIVE_AA in cells},
        "unit_scale": UNIT_SCALE,
        "aa_noise": noise.diagnose_calls(calls),
    }
    report["targets"] = targets.judge(report, target_document)
    return report

"""Calibration: the A/A control (native-aa against native) in several process sets at several
block lengths, and from it each workload's settings for the run (the calibration file).

For each process set (sets.py) and workload, the two workers prepare it, then run ``pairs`` ABBA
pairs at each block length in turn. Per (workload, block length): the spread of a pair inside a
process and between processes (stats.components), the A/A median and interval, the wall time
of a pair and of a warm-up, and each worker's memory pass; then ``choose`` plans the group's
run: for K process sets (3 to MAX_PROCESSES) and each workload its block length and pairs per
set, the predicted A/A interval (``predicted_half_width``: the interval stats.py computes, at the
measured spreads) inside the workload's band (HALF_WIDTH) at the least time, the group within
``call_s`` seconds with the planned number of configurations; where no plan fits, the one with
the smallest predicted interval relative to the bands that does, said so.
``--ablate SETTING[,...]``: every other set without them (sets.off_in); the report compares
the two kinds of set, and no settings are written.
Invariant: every figure comes from pairs measured in this call; nothing is carried over; the
calibration file changes only for the workloads of the groups calibrated.
"""

import json
import math
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from . import plan, runner, sets, stats
from .configs import NATIVE, NATIVE_AA

DEFAULT_BLOCKS_S = (0.1, 0.3)
DEFAULT_PAIRS = 8
DEFAULT_PROCESSES = 4
# A group's planned run: at most this long (a 9-minute call, with room for the estimate's error).
CALL_S = 450.0
# The A/A half-width each workload must reach (targets.json's A/A bands).
HALF_WIDTH = {"churn": 0.05, "multistream": 0.05, "empty_1KiB": 0.05, "empty_1MiB": 0.05,
              "empty_64MiB": 0.05}
DEFAULT_HALF_WIDTH = 0.03
MIN_PROCESSES = 3
MAX_PROCESSES = 8
MIN_PAIRS_PER_SET = 4
FORMAT = 1


def run(workloads: Sequence[str], options, environ: Dict[str, str], sampler, library,
        release_s: Optional[float], log=None) -> Dict[str, Any]:
    """The raw calibration of ``workloads``: one record per (process set, workload)."""
    names = [NATIVE, NATIVE_AA]
    raw: Dict[str, Any] = {"workloads": list(workloads), "records": [], "sets": []}
    base = runner.Options(options.pairs, options.blocks_s[0], release_s)
    extra = {"log": log} if log else {}
    for index, live, facts in sets.process_sets(
            options.processes, names, {}, environ, base, lambda _: workloads, sampler,
            options.engine, options.without, options.ablate, library, **extra):
        raw["sets"].append(facts)
        raw.setdefault("device", live.infos.get(NATIVE, {}).get("device"))
        for workload in workloads:
            prepared, failed = live.prepare(workload, names)
            record = {"workload": workload, "process_set": index, "off": facts["off"],
                      "prepare": prepared, "failed": failed, "blocks": {}}
            for block_s in options.blocks_s:
                live.options = runner.Options(options.pairs, block_s, release_s,
                                              "settle" not in facts["off"])
                began_s = time.monotonic()
                timed = live.time(workload, [(NATIVE, NATIVE_AA)], prepared, failed, block_s)
                if timed["pairs"]:
                    record["blocks"][f"{block_s:g}"] = {
                        "steps_per_block": timed["steps_per_block"], "pairs": timed["pairs"],
                        "wall_s": time.monotonic() - began_s, "warm_up_s": timed["warm_up_s"],
                        "warm_up_blocks": timed["warm_up_blocks"]}
            live.drop_all()
            raw["records"].append(record)
    return raw


def _median(values: Sequence[float]) -> Optional[float]:
    return stats.median(values) if values else None


def analyse(raw: Dict[str, Any], off: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Per workload, from the records whose sets had exactly ``off`` turned off (None: the sets
    with the fewest off): ``blocks`` {block: A/A summary (stats.summarise by process set) with
    ``pair_s`` and ``warm_up_s`` (a worker's)}, ``between_sd`` (pooled over block lengths),
    ``prepare_s`` (a worker's memory pass, wall); and ``start_s`` (a set's start)."""
    records = raw["records"]
    if off is None:
        fewest = min((len(r["off"]) for r in records), default=0)
        off = next((r["off"] for r in records if len(r["off"]) == fewest), [])
    records = [r for r in records if list(r["off"]) == list(off)]
    out: Dict[str, Any] = {"off": list(off), "workloads": {},
                           "start_s": _median([s["start_s"] for s in raw["sets"]
                                               if list(s["off"]) == list(off)])}
    for workload in raw["workloads"]:
        mine = [r for r in records if r["workload"] == workload]
        blocks: Dict[str, Any] = {}
        for block in dict.fromkeys(b for r in mine for b in r["blocks"]):
            entries = [(r["process_set"], r["blocks"][block]) for r in mine if block in r["blocks"]]
            pairs = [(index, p) for index, e in entries for p in e["pairs"]]
            ratios = stats.paired_ratios([p["config_s"] for _, p in pairs],
                                         [p["ref_s"] for _, p in pairs])
            summary = stats.summarise(ratios, [index for index, _ in pairs])
            summary["pair_s"] = _median([(e["wall_s"] - e["warm_up_s"]) / len(e["pairs"])
                                         for _, e in entries])
            summary["warm_up_s"] = _median([e["warm_up_s"] / 2 for _, e in entries])
            summary["steps_per_block"] = entries[0][1]["steps_per_block"]
            blocks[block] = summary
        between = [s["between_sd"] for s in blocks.values() if s.get("between_sd") is not None]
        walls = [p["wall_s"] for r in mine for p in r["prepare"].values() if "wall_s" in p]
        out["workloads"][workload] = {
            "blocks": blocks,
            "between_sd": math.sqrt(sum(b * b for b in between) / len(between)) if between
            else None,
            "prepare_s": _median(walls),
            "failed": {k: v for r in mine for k, v in r["failed"].items()},
        }
    return out


def predicted_half_width(within_sd: float, between_sd: float, processes: int,
                         pairs: int) -> float:
    """The half-width (as a fraction) of the A/A interval stats.summarise should give with
    ``processes`` sets of ``pairs`` pairs at these spreads: z * sqrt((t/z)^2 between^2 / K +
    (pi/2) within^2 / (K pairs)), back from the log scale."""
    factor = stats.t_975(processes - 1) / stats.Z_95 if processes > 1 else 1.0
    variance = (factor * between_sd) ** 2 / processes
    variance += stats.MEDIAN_EFFICIENCY ** 2 * within_sd ** 2 / (processes * pairs)
    return math.exp(stats.Z_95 * math.sqrt(variance)) - 1


def pairs_for(within_sd: float, between_sd: float, processes: int,
              half_width: float) -> Optional[int]:
    """The fewest pairs per set for ``half_width`` (None: the spread between processes alone is
    wider than that at ``processes`` sets)."""
    room = (math.log(1 + half_width) / stats.Z_95) ** 2
    room -= (stats.t_975(processes - 1) / stats.Z_95 * between_sd) ** 2 / processes
    if room <= 0:
        return None
    needed = stats.MEDIAN_EFFICIENCY ** 2 * within_sd ** 2 / (processes * room)
    return max(MIN_PAIRS_PER_SET, math.ceil(stats.MIN_PAIRS / processes), math.ceil(needed))


def _plan(measured: Dict[str, Any], processes: int, scale: float, configs: int,
          start_s: float) -> Optional[Dict[str, Any]]:
    """Each workload's cheapest (block, pairs) for ``scale`` x its band at ``processes`` sets,
    and the group's seconds; None if some workload cannot reach it."""
    chosen, total = {}, processes * start_s
    for workload, figures in measured["workloads"].items():
        band = HALF_WIDTH.get(workload, DEFAULT_HALF_WIDTH)
        options = []
        for block, summary in figures["blocks"].items():
            pairs = pairs_for(summary["within_sd"], figures["between_sd"] or 0.0, processes,
                              scale * band)
            if pairs is None or summary["pair_s"] is None:
                continue
            seconds = processes * configs * ((figures["prepare_s"] or 0) + summary["warm_up_s"])
            seconds += processes * (configs - 1) * pairs * summary["pair_s"]
            half = predicted_half_width(summary["within_sd"], figures["between_sd"] or 0.0,
                                        processes, pairs)
            options.append((seconds, float(block), pairs, half, band))
        if not options:
            return None
        seconds, block, pairs, half, band = min(options)
        chosen[workload] = {"block_s": block, "pairs": pairs, "processes": processes,
                            "band": band, "predicted_half_width": round(half, 4),
                            "seconds": round(seconds, 1)}
        total += seconds
    return {"workloads": chosen, "estimated_s": round(total, 1)}


def choose(raw: Dict[str, Any], group: str, configs: int, call_s: float) -> Dict[str, Any]:
    """The group's settings (module docstring): ``workloads`` {workload: {block_s, pairs,
    processes, band, predicted_half_width, seconds, measured}}, ``estimated_s``, ``meets_bands``
    and ``start_s``; workloads without a measured A/A are left out (they keep the defaults)."""
    measured = analyse(raw)
    measured["workloads"] = {w: f for w, f in measured["workloads"].items()
                             if f["blocks"] and f["prepare_s"] is not None}
    start_s = measured["start_s"] or plan.START_S.get(group, 18.0)
    best = None
    for processes in range(MIN_PROCESSES, MAX_PROCESSES + 1):
        at_band = _plan(measured, processes, 1.0, configs, start_s)
        if at_band and at_band["estimated_s"] <= call_s:
            key = (0, at_band["estimated_s"])  # meets every band: the cheapest
            candidate = {**at_band, "meets_bands": True, "scale": 1.0}
        else:
            low, high = 1.0, 64.0
            if not (_plan(measured, processes, high, configs, start_s) or {}).get(
                    "estimated_s", math.inf) <= call_s:
                continue
            for _ in range(30):  # the smallest scale of the bands that fits the call
                middle = (low + high) / 2
                fits = _plan(measured, processes, middle, configs, start_s)
                low, high = (low, middle) if fits and fits["estimated_s"] <= call_s else \
                    (middle, high)
            candidate = {**_plan(measured, processes, high, configs, start_s),
                         "meets_bands": False, "scale": round(high, 3)}
            key = (1, high)
        if best is None or key < best[0]:
            best = (key, candidate)
    chosen = best[1] if best else {"workloads": {}, "estimated_s": None, "meets_bands": False}
    for workload, entry in chosen["workloads"].items():
        figures = measured["workloads"][workload]
        entry["measured"] = {
            "within_sd": {b: s["within_sd"] for b, s in figures["blocks"].items()},
            "between_sd": figures["between_sd"], "prepare_s": figures["prepare_s"],
            "pair_s": {b: s["pair_s"] for b, s in figures["blocks"].items()},
            "warm_up_s": {b: s["warm_up_s"] for b, s in figures["blocks"].items()}}
    return {**chosen, "start_s": start_s, "configs": configs, "call_s": call_s}


def update_file(path: Path, chosen: Dict[str, Any], group: str, facts: Dict[str, Any]) -> None:
    """Write the group's chosen settings into the calibration file (others kept)."""
    path = Path(path)
    document = json.loads(path.read_text()) if path.is_file() else {
        "format": FORMAT,
        "about": "Each workload's block length, pairs per process set and process sets, chosen "
                 "by `python3 -m bench calibrate` from the A/A it measured; the run's defaults "
                 "(bench/plan.py). Written by the calibration: do not edit by hand.",
        "workloads": {}, "groups": {}}
    document["facts"] = {k: facts.get(k) for k in ("date", "command", "device")}
    document["workloads"].update(chosen["workloads"])
    document["groups"][group] = {k: chosen.get(k) for k in (
        "start_s", "estimated_s", "meets_bands", "configs", "call_s")}
    document["groups"][group].update(date=facts.get("date"), device=facts.get("device"))
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")


def _percent(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def markdown(document: Dict[str, Any]) -> str:
    """calibration.md: per group, the A/A by block length and by kind of process set, and the
    settings chosen."""
    facts = document["facts"]
    lines = ["# Calibration: A/A (native-aa ÷ native) by process set and block length", "",
             f"{facts.get('device', '?')}; `{facts.get('command', '')}`; {facts.get('date', '')}.",
             "", "within: sd of a pair's log ratio inside a process set; between: sd of the "
             "process sets' own shifts (stats.components). The interval is the run's: by "
             "process set, then pairs."]
    for group, raw in document["groups"].items():
        kinds = sorted({tuple(r["off"]) for r in raw["records"]}, key=len)
        lines += ["", f"## {group}", "",
                  "| workload | sets | block | steps | A/A median (95% interval) | pairs | "
                  "within | between | s a pair |", "|---|---|---|---|---|---|---|---|---|"]
        for kind in kinds:
            label = "all settings" if not kind else "without " + ", ".join(kind)
            for workload, figures in analyse(raw, list(kind))["workloads"].items():
                if not figures["blocks"]:
                    why = "; ".join(f"{k}: {v.splitlines()[-1]}"
                                    for k, v in figures["failed"].items()) or "no pairs"
                    lines.append(f"| `{workload}` | {label} | failed: {why} | | | | | | |")
                for block, s in figures["blocks"].items():
                    interval = "no interval" if s["ci95"] is None else (
                        f"{s['ci95'][0]:.3f}–{s['ci95'][1]:.3f}")
                    lines.append(
                        f"| `{workload}` | {label} ({s['processes']}) | {block} s | "
                        f"{s['steps_per_block']} | {s['ratio']:.3f} ({interval}) | {s['n']} | "
                        f"{_percent(s['within_sd'])} | {_percent(s.get('between_sd'))} | "
                        f"{s['pair_s']:.2f} |")
        chosen = raw.get("chosen")
        if not chosen:
            continue
        estimate = chosen.get("estimated_s")
        lines += ["", f"Chosen for a run of {chosen['configs']} configurations within "
                  f"{chosen['call_s']:g} s: " + (
                      "nothing measured" if estimate is None else
                      f"about {estimate / 60:.1f} min, "
                      + ("every band met (predicted)" if chosen["meets_bands"] else
                         f"no plan meets every band: the best predicts "
                         f"{chosen.get('scale')} × the bands")), "",
                  "| workload | block | pairs × sets | predicted A/A ± | band ± | seconds |",
                  "|---|---|---|---|---|---|"]
        for workload, entry in chosen["workloads"].items():
            lines.append(
                f"| `{workload}` | {entry['block_s']:g} s | {entry['pairs']} × "
                f"{entry['processes']} | {_percent(entry['predicted_half_width'])} | "
                f"{_percent(entry['band'])} | {entry['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def estimate_s(workloads: Sequence[str], blocks_s: Sequence[float], pairs: int,
               processes: int, start_s: float) -> float:
    """Seconds a calibration should take (plan.costs's figures, two workers)."""
    total = processes * start_s
    for workload in workloads:
        for block_s in blocks_s:
            c = plan.costs(workload, block_s)
            total += processes * (2 * c["warm_up_s"] + pairs * c["pair_s"])
        total += processes * 2 * plan.costs(workload, blocks_s[0])["prepare_s"]
    return total

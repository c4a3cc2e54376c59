"""Calibration: the A/A control (native-aa against native) at several block lengths, to choose the
block length of the benchmark and the pairs a precision needs.

For each workload, the two workers prepare it once, then run ``pairs`` ABBA pairs at each block
length in turn. Per (workload, block length): the sd of the paired log ratios, the median and
its interval, the pairs a ±3% and a ±5% interval would need (stats.pairs_needed) and the seconds
those pairs take (pairs × the measured wall time of a pair, overheads included). The block length
to use is the one whose pairs for the workload's A/A target take the least time.
Invariant: every figure comes from pairs measured in this call; nothing is carried over.
"""

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import plan, stats
from .configs import NATIVE, NATIVE_AA

DEFAULT_BLOCKS_S = (0.05, 0.1, 0.2, 0.4)
DEFAULT_WORKLOADS = ("empty_1MiB", "churn", "multistream", "llama_decode", "bert", "gpt2",
                     "resnet50")
# The A/A half-width each workload must reach (targets.json's A/A bands).
HALF_WIDTH = {"churn": 0.05, "multistream": 0.05, "empty_1KiB": 0.05, "empty_1MiB": 0.05,
              "empty_64MiB": 0.05}
DEFAULT_HALF_WIDTH = 0.03


def summarise(pairs: List[Dict[str, Any]], wall_s: float) -> Dict[str, Any]:
    """The figures of one (workload, block length) from its pairs and their wall time."""
    ratios = stats.paired_ratios([p["config_s"] for p in pairs], [p["ref_s"] for p in pairs])
    summary = stats.summarise(ratios)
    pair_s = wall_s / len(pairs) if pairs else None
    summary["pair_s"] = pair_s
    if summary["log_sd"] is not None and pair_s:
        for label, half in (("3", 0.03), ("5", 0.05)):
            needed = stats.pairs_needed(summary["log_sd"], half)
            summary[f"pairs_for_{label}pct"] = needed
            summary[f"seconds_for_{label}pct"] = needed * pair_s
    return summary


def best_block(rows: Dict[str, Dict[str, Any]], workload: str) -> Optional[str]:
    """The block length (key of ``rows``) whose pairs for ``workload``'s A/A band take least
    time."""
    label = "5" if HALF_WIDTH.get(workload, DEFAULT_HALF_WIDTH) == 0.05 else "3"
    timed = {b: r[f"seconds_for_{label}pct"] for b, r in rows.items()
             if r.get(f"seconds_for_{label}pct") is not None}
    return min(timed, key=timed.get) if timed else None


def run(runner, workloads: Sequence[str], blocks_s: Sequence[float],
        clock: Callable[[], float] = time.monotonic,
        on_workload: Optional[Callable[[Dict[str, Any]], None]] = None) -> List[Dict[str, Any]]:
    """The raw calibration records, one per workload."""
    records = []
    for workload in workloads:
        runner.log(f"== calibration: {workload}")
        prepared, failed = runner.prepare(workload, [NATIVE, NATIVE_AA])
        record: Dict[str, Any] = {"workload": workload, "prepare": prepared, "failed": failed,
                                  "blocks": {}}
        for block_s in blocks_s:
            started_s = clock()
            timed = runner.time(workload, [(NATIVE, NATIVE_AA)], prepared, failed, block_s)
            wall_s = clock() - started_s
            if not timed["pairs"]:
                continue
            record["blocks"][f"{block_s:g}"] = {
                "steps_per_block": timed["steps_per_block"],
                "pairs": timed["pairs"],
                "summary": summarise(timed["pairs"], wall_s),
            }
            summary = record["blocks"][f"{block_s:g}"]["summary"]
            runner.log(f"{workload} at {block_s:g} s: A/A sd {100 * summary['log_sd']:.1f}% "
                        f"over {summary['n']} pairs")
        runner.drop_all()
        records.append(record)
        if on_workload is not None:
            on_workload(record)
    return records


def markdown(records: List[Dict[str, Any]], facts: Dict[str, Any]) -> str:
    """calibration.md: per workload and block length, the A/A spread and what precision costs."""
    lines = [
        "# Calibration: A/A (native-aa ÷ native) by block length",
        "",
        f"{facts.get('device', '?')}; `{facts.get('command', '')}`; {facts.get('date', '')}.",
        "",
        "sd: of the paired log ratios. For a 95% interval of the median of about ±3% / ±5%: "
        "pairs needed (z · sqrt(π/2) · sd / log(1 + h))², and the seconds they take at the "
        "measured wall time per pair. ★: the block length whose pairs for the workload's A/A "
        "band (±5% churn, multistream, torch.empty; ±3% the others) take least time.",
        "",
        "| workload | block | steps | pairs | A/A median (95% interval) | sd | ±3%: pairs, s | "
        "±5%: pairs, s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for record in records:
        rows = {b: entry["summary"] for b, entry in record["blocks"].items()}
        best = best_block(rows, record["workload"])
        if not rows:
            why = "; ".join(f"{k}: {v.splitlines()[-1]}" for k, v in record["failed"].items())
            lines.append(f"| `{record['workload']}` | failed: {why} | | | | | | |")
        for block, entry in record["blocks"].items():
            s = entry["summary"]
            star = " ★" if block == best else ""
            interval = "no interval" if s["ci95"] is None else (
                f"{s['ci95'][0]:.3f}–{s['ci95'][1]:.3f}")
            lines.append(
                f"| `{record['workload']}` | {block} s{star} | {entry['steps_per_block']} | "
                f"{s['n']} | {s['ratio']:.3f} ({interval}) | {100 * (s['log_sd'] or 0):.1f}% | "
                f"{s.get('pairs_for_3pct', '—')}, {s.get('seconds_for_3pct', 0):.0f} | "
                f"{s.get('pairs_for_5pct', '—')}, {s.get('seconds_for_5pct', 0):.0f} |"
            )
    return "\n".join(lines) + "\n"


def estimate_s(workloads: Sequence[str], blocks_s: Sequence[float], pairs: int) -> float:
    """Seconds a calibration should take (plan.estimate_s's figures)."""
    start_s = plan.START_S["models"]
    total = start_s
    for workload in workloads:
        prepare_s, step_s = plan.PREPARE_S.get(workload, (5.0, 0.05))
        total += 2 * prepare_s
        for block_s in blocks_s:
            wall_s = max(block_s, step_s) * plan.BLOCK_OVERHEAD
            total += (pairs + 2) * 2 * wall_s
    return total

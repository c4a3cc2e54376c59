"""The markdown report of one run (latest.md, for BENCHMARKS.md), rendered from latest.json alone.

Invariant: every number printed comes from the report document (no recomputation, no numbers of
its own), so re-rendering an old latest.json gives the same text; an interval is always printed
beside its median, and a cell is bold only when its interval lies wholly outside the A/A
interval of the same run (the only differences from native the report claims).
"""

import collections
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .configs import NATIVE, NATIVE_AA
from .schedules import UNIT_SCALE, has_memory_ratio
from .stats import METHOD_REPEATS


def ratio_text(cell: Dict[str, Any], metric: str, digits: int = 3) -> str:
    """``0.973× (0.951–0.990)``: the median and its 95% interval; ``≥`` for a memory ratio that
    is a lower bound; ``—`` when absent."""
    value = cell.get(metric)
    if value is None:
        return "—"
    bound = "≥" if metric == "peak_memory_ratio" and cell.get("peak_memory_lower_bound") else ""
    low, high = cell[f"{metric}_ci95"]
    return f"{bound}{value:.{digits}f}× ({low:.{digits}f}–{high:.{digits}f})"


def claimed_text(cell: Dict[str, Any], clock: str) -> str:
    """``ratio_text`` of a time ratio, bold when it differs from native beyond the A/A interval."""
    text = ratio_text(cell, f"{clock}_ratio")
    return f"**{text}**" if cell.get(f"{clock}_vs_aa") in ("lower", "higher") else text


def spread_text(cell: Dict[str, Any], metric: str) -> str:
    """``1.11× (1.10–1.12)``: median and min–max over repeats (memory)."""
    value = cell.get(metric)
    if value is None:
        return "—"
    bound = "≥" if cell.get("peak_memory_lower_bound") else ""
    low, high = cell[f"{metric}_min"], cell[f"{metric}_max"]
    spread = f" ({low:.2f}–{high:.2f})" if f"{low:.2f}" != f"{high:.2f}" else ""
    return f"{bound}{value:.2f}×{spread}"


def per_unit_text(cell: Dict[str, Any], key: str = "host_time_per_unit_s") -> str:
    factor, unit = UNIT_SCALE[cell["unit"]]
    return f"{cell[key] * factor:.3f} {unit}"


def failure_word(cell: Dict[str, Any]) -> str:
    return "skipped" if cell["error"].startswith("skipped") else "failed"


def _table(
    report: Dict[str, Any],
    workloads: Sequence[str],
    text: Callable[[Dict[str, Any]], str],
    native_text: str = "",
) -> List[str]:
    """One row per workload, one column per configuration; ``not run`` where a configuration
    does not run that workload; ``native_text``, if given, in native's cells (the reference)."""
    configs = report["configs"]
    lines = ["| workload | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for workload in workloads:
        cells = report["workloads"][workload]
        texts = []
        for config in configs:
            cell = cells.get(config)
            if cell is None:
                texts.append("not run")
            elif "error" in cell:
                texts.append(failure_word(cell))
            elif config == NATIVE and native_text:
                texts.append(native_text)
            else:
                texts.append(text(cell))
        lines.append(f"| `{workload}` | " + " | ".join(texts) + " |")
    return lines


def _header(report: Dict[str, Any]) -> List[str]:
    repeats = f"{report['repeats']} repeat(s)"
    if report.get("stop_reason"):
        repeats += f" of {report['repeats_requested']} asked ({report['stop_reason']})"
    if report["repeats"] < METHOD_REPEATS:
        repeats += (
            f" — fewer than the method's {METHOD_REPEATS}: the intervals are coarse, and a target "
            "met here is not established"
        )
    return [
        "# streampool benchmarks",
        "",
        f"- GPU: {report['device']}, driver {report['driver']}",
        f"- torch {report['torch']} (CUDA {report['cuda']}), streampool {report['streampool']}",
        f"- date: {report['date']}",
        f"- command: `{report['command']}`",
        f"- {repeats}; every repeat runs each configuration once, each in a fresh process, the "
        "order rotated by one every repeat. Each workload runs a fixed seeded schedule; its time "
        "is the sum over the schedule's timed steps. A cell is the median over repeats of the "
        "ratio to native in the same repeat, with its 95% bootstrap interval in parentheses. "
        "**Bold**: the interval lies wholly outside the A/A interval (`native-aa`, native run "
        "again as a configuration of its own), both measured in at least 3 repeats: only those "
        "differences are claimed.",
    ]


def _aa_lines(report: Dict[str, Any]) -> List[str]:
    rows = [
        (w, cells[NATIVE_AA])
        for w, cells in report["workloads"].items()
        if NATIVE_AA in cells and "error" not in cells[NATIVE_AA]
    ]
    if not rows:
        return []
    lines = [
        "",
        "## A/A control: native ÷ native in the same repeat",
        "",
        "A ratio whose interval overlaps these is not distinguishable from noise in this run.",
        "",
        "| workload | host time | GPU time |",
        "|---|---|---|",
    ]
    for workload, cell in rows:
        lines.append(
            f"| `{workload}` | {ratio_text(cell, 'time_ratio')} | "
            f"{ratio_text(cell, 'gpu_time_ratio')} |"
        )
    return lines


def _cotenant_lines(report: Dict[str, Any]) -> List[str]:
    cells = report.get("cotenant") or {}
    if not cells:
        return []
    lines = [
        "",
        "## Co-tenant: what a second process gets while this one idles",
        "",
        "Process A (the configuration) trains GPT-2 over every sequence length, synchronises and "
        "idles with its model and optimizer alive; process B (native) then allocates the largest "
        "tensor it can (binary search to 64 MiB) and fills it. Fraction: B's largest allocation "
        "÷ the device's memory, median (min–max) over repeats.",
        "",
        "| A's configuration | A called `empty_cache()` | B's largest allocation "
        "| fraction of device |",
        "|---|---|---|---|",
    ]
    for name, cell in cells.items():
        if "error" in cell:
            lines.append(f"| `{name}` | | {failure_word(cell)} | |")
            continue
        low, high = cell["cotenant_fit_fraction_min"], cell["cotenant_fit_fraction_max"]
        spread = f" ({low:.3f}–{high:.3f})" if low != high else ""
        lines.append(
            f"| `{name}` | {'yes' if cell['empty_cache_called'] else 'no'} | "
            f"{cell['fit_bytes'] / 2**30:.1f} GiB | {cell['cotenant_fit_fraction']:.3f}{spread} |"
        )
    return lines


def _target_lines(report: Dict[str, Any]) -> List[str]:
    rows = report.get("targets") or []
    if not rows:
        return []
    lines = [
        "",
        "## Targets (bench/targets.json): judged by the 95% interval's upper end",
        "",
        "| workload | metric | configuration | target | median (95% interval) | status |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["median"] is None:
            measured = "—"
        elif row["metric"] == "cotenant_fit_fraction":
            low, high = row["ci95"]
            measured = f"{row['median']:.3f} ({low:.3f}–{high:.3f}, min–max)"
        else:
            measured = f"{row['median']:.3f}× ({row['ci95'][0]:.3f}–{row['ci95'][1]:.3f})"
        lines.append(
            f"| `{row['workload']}` | {row['metric']} | `{row['config']}` | {row['target']} | "
            f"{measured} | {row['status']} |"
        )
    return lines


def _failure_lines(report: Dict[str, Any]) -> List[str]:
    """One item per (configuration, error): what failed or was skipped, in which workloads."""
    failed: Dict[Tuple[str, str], List[str]] = collections.defaultdict(list)
    for workload, cells in report["workloads"].items():
        for config, cell in cells.items():
            if "error" in cell:
                failed[(config, " ".join(cell["error"].split()))].append(workload)
            for error in cell.get("repeat_errors", []):
                failed[(config, "in one repeat: " + " ".join(error.split()))].append(workload)
    for name, cell in (report.get("cotenant") or {}).items():
        if "error" in cell:
            failed[(name, " ".join(cell["error"].split()))].append("cotenant")
    lines = [f"- `{c}` ({', '.join(ws)}): {error}" for (c, error), ws in failed.items()]
    return ["", "## Failed or skipped", ""] + lines if lines else []


def markdown(report: Dict[str, Any]) -> str:
    """The whole report (see the module's invariant)."""
    workloads = list(report["workloads"])
    memory_workloads = [w for w in workloads if has_memory_ratio(w)]
    lines = _header(report)
    if workloads:
        lines += [
            "",
            "![ratios](latest.png)",
            "",
            "## Time ×native, host clock (lower is better)",
            "",
            "Host time between synchronisations, summed over the schedule's timed steps.",
            "",
            *_table(report, workloads, lambda cell: claimed_text(cell, "time"), "1 (reference)"),
            "",
            "## Time ×native, GPU clock (CUDA events around each step)",
            "",
            "Elapsed time between two events recorded on the current stream at a step's start and "
            "end, idle gaps included (for a step the host cannot keep the GPU busy in, it "
            "approaches the host time).",
            "",
            *_table(
                report, workloads, lambda cell: claimed_text(cell, "gpu_time"), "1 (reference)"
            ),
            *_aa_lines(report),
            "",
            "## Time per unit on this machine (median over repeats, host clock)",
            "",
            *_table(report, workloads, per_unit_text),
        ]
    if memory_workloads:
        lines += [
            "",
            "## Peak device memory used ÷ native's peak live tensor bytes (lower is better)",
            "",
            "Peak device memory used: the largest drop of free device memory since the workload "
            "started, read after each step; median (min–max) over repeats. `≥`: the configuration "
            "held memory from before the workload that `torch.cuda.empty_cache()` did not return, "
            "so the ratio is a lower bound.",
            "",
            *_table(report, memory_workloads, lambda cell: spread_text(cell, "peak_memory_ratio")),
        ]
    lines += _cotenant_lines(report) + _target_lines(report) + _failure_lines(report)
    return "\n".join(lines) + "\n"


def summary_lines(report: Dict[str, Any]) -> List[str]:
    """The last lines on stdout: per workload, each configuration's host-time ratio with its
    interval and, where reported, the memory ratio; then the co-tenant fractions and targets."""
    lines = [
        f"bench on {report['device']}: time ×native (95% interval) [memory ÷ native peak live], "
        f"{report['repeats']} repeat(s)"
    ]
    width = max([len(w) for w in report["workloads"]] + [8])
    for workload, cells in report["workloads"].items():
        parts = []
        for config, cell in cells.items():
            if "error" in cell:
                parts.append(f"{config} {failure_word(cell)}")
                continue
            low, high = cell["time_ratio_ci95"]
            memory = cell.get("peak_memory_ratio")
            bound = "≥" if cell.get("peak_memory_lower_bound") else ""
            memory_text = f" [{bound}{memory:.2f}]" if memory is not None else ""
            parts.append(f"{config} {cell['time_ratio']:.3f}({low:.3f}-{high:.3f}){memory_text}")
        lines.append(f"{workload:<{width}}  " + "  ".join(parts))
    for name, cell in (report.get("cotenant") or {}).items():
        text = failure_word(cell) if "error" in cell else f"{cell['cotenant_fit_fraction']:.3f}"
        lines.append(f"{'cotenant':<{width}}  {name} {text}")
    for row in report.get("targets") or []:
        lines.append(f"target {row['workload']} {row['metric']} {row['config']}: {row['status']}")
    return lines

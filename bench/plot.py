"""The PNG of one run (latest.png): ratios with error bars, drawn from latest.json alone.

Invariant: a point is the reported median and its whiskers the reported 95% interval (time) or
min–max over repeats (memory, co-tenant); each configuration keeps one colour in every panel;
only matplotlib's Agg canvas is used (no display, no pyplot state).
"""

from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from .schedules import has_memory_ratio


def _whiskers(cell: Dict[str, Any], metric: str, interval: str) -> Tuple[float, float]:
    value = cell[metric]
    if interval == "ci95":
        low, high = cell[f"{metric}_ci95"]
    else:
        low, high = cell[f"{metric}_min"], cell[f"{metric}_max"]
    return max(0.0, value - low), max(0.0, high - value)


def _point_panel(
    axes: Any,
    groups: Sequence[str],
    cells_of: Dict[str, Dict[str, Dict[str, Any]]],
    configs: Sequence[str],
    metric: str,
    interval: str,
    colour_of: Dict[str, int],
) -> None:
    """``metric`` as a point with whiskers per configuration, side by side within a group per name
    in ``groups`` (``cells_of[group][config]`` is the cell), labelled with its value. Points, not
    bars from zero: the axis spans the data, so differences of 1-2% and their intervals show."""
    columns: List[Tuple[int, str, List[Tuple[int, Dict[str, Any]]]]] = []
    for config in configs:
        colour = colour_of[config]
        cells = [
            (position, cells_of[group][config])
            for position, group in enumerate(groups)
            if config in cells_of[group] and cells_of[group][config].get(metric) is not None
        ]
        if cells:
            columns.append((colour, config, cells))
    width = 0.8 / max(1, len(columns))
    for slot, (colour, config, cells) in enumerate(columns):
        xs = [position - 0.4 + width * (slot + 0.5) for position, _ in cells]
        values = [cell[metric] for _, cell in cells]
        low_high = [_whiskers(cell, metric, interval) for _, cell in cells]
        errors = [[low for low, _ in low_high], [high for _, high in low_high]]
        axes.errorbar(
            xs,
            values,
            yerr=errors,
            fmt="o",
            markersize=4,
            capsize=3,
            label=config,
            color=f"C{colour % 10}",
        )
        for x, value in zip(xs, values):
            axes.annotate(
                f"{value:.3f}",
                (x, value),
                xytext=(3, 0),
                textcoords="offset points",
                fontsize=5,
                va="center",
            )
    axes.set_xticks(range(len(groups)), groups, fontsize=7)
    axes.set_xlim(-0.5, max(len(groups), 1) - 0.5)
    axes.grid(axis="y", linewidth=0.3)
    if columns:
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def write_plot(report: Dict[str, Any], path: Path) -> None:
    """Host-time, GPU-time and memory ratios per workload, and the co-tenant fractions."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = list(report["workloads"])
    memory_workloads = [w for w in workloads if has_memory_ratio(w)]
    configs = report["configs"]
    cotenant = report.get("cotenant") or {}
    names = list(cotenant)
    colour_of = {name: i for i, name in enumerate(dict.fromkeys(list(configs) + names))}
    figure = Figure(figsize=(max(10.0, 1.6 * len(workloads)), 14.0), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(4, 1)
    for axes, (metric, title) in zip(
        panels[:2],
        [("time_ratio", "host time ×native"), ("gpu_time_ratio", "GPU time ×native")],
    ):
        _point_panel(axes, workloads, report["workloads"], configs, metric, "ci95", colour_of)
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.set_title(
            f"{title}: median of {report['repeats']} repeat(s), 95% interval", fontsize=9
        )
    _point_panel(
        panels[2],
        memory_workloads,
        report["workloads"],
        configs,
        "peak_memory_ratio",
        "spread",
        colour_of,
    )
    panels[2].axhline(1.0, color="black", linewidth=0.8)
    panels[2].set_title("peak device memory ÷ native peak live: median, min–max", fontsize=9)
    _point_panel(
        panels[3],
        ["cotenant"],
        {"cotenant": cotenant},
        names,
        "cotenant_fit_fraction",
        "spread",
        colour_of,
    )
    panels[3].set_title(
        "co-tenant: B's largest allocation ÷ device memory (higher is better)", fontsize=9
    )
    figure.suptitle(
        f"streampool {report['streampool']} on {report['device']}, torch {report['torch']}",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)

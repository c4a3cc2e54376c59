"""The parts of report.md below the headline: what each number rests on.

Invariant: like markdown.py, every number comes from the report document; a table has a row for
every workload and a column for every configuration that ran in any run.
"""

from typing import Any, Dict, List

from . import markdown, noise, sleep_report
from .configs import CONFIG_NAMES


def _configs(report: Dict[str, Any]) -> List[str]:
    seen = {c for cells in report["workloads"].values() for c in cells}
    known = [c for c in CONFIG_NAMES if c in seen]
    return known + sorted(seen - set(known))


def _table(report: Dict[str, Any], text) -> List[str]:
    configs = _configs(report)
    lines = ["| workload | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for workload, cells in report["workloads"].items():
        row = []
        for config in configs:
            cell = cells.get(config)
            row.append("not run" if not cell else "failed" if cell.get("failed") else text(cell))
        lines.append(f"| `{workload}` | " + " | ".join(row) + " |")
    return lines


def _time(cell: Dict[str, Any]) -> str:
    time = cell.get("time")
    if not time:
        return "reference" if not cell.get("errors") else "—"
    ref = "" if time["ref"] == "native" else f" vs {time['ref']}"
    processes = time.get("processes") or 1
    return f"{markdown.interval_text(time, 3)}, n={time['n']} in {processes} processes{ref}"


def _aa(report: Dict[str, Any]) -> List[str]:
    """The A/A of each workload beside the spread between its processes."""
    lines = ["| workload | A/A (95% interval) | processes | between processes (sd) | "
             "within a process (sd of a pair) | each process's A/A |", "|---|---|---|---|---|---|"]
    for workload, time in report.get("aa", {}).items():
        if not time or time.get("ratio") is None:
            lines.append(f"| `{workload}` | — | | | | |")
            continue
        between = time.get("between_sd")
        within = time.get("within_sd")
        lines.append(
            f"| `{workload}` | {markdown.interval_text(time, 3)} | {time.get('processes', 1)} | "
            f"{'—' if between is None else f'{100 * between:.1f}%'} | "
            f"{'—' if within is None else f'{100 * within:.1f}%'} | "
            + ", ".join(f"{r:.3f}" for r in time.get("process_ratios", [])) + " |"
        )
    return lines


def _per_unit(report: Dict[str, Any]):
    scale = report.get("unit_scale", {})

    def text(cell: Dict[str, Any]) -> str:
        if "per_unit_s" not in cell:
            return "—"
        factor, unit = scale.get(cell.get("unit"), (1.0, "s"))
        gap = cell.get("max_idle_s")
        gap_text = "" if gap is None else f", gap ≤ {gap:.2f} s"
        throttled = cell.get("throttled_pairs") or 0
        return f"{cell['per_unit_s'] * factor:.3f} {unit}{gap_text}" + (
            f", {throttled} throttled" if throttled else ""
        )

    return text


def _memory(cell: Dict[str, Any]) -> str:
    memory = cell.get("memory")
    if not memory:
        return "—"
    during = cell.get("process_bytes_during_timing")
    during_text = "" if during is None else f"; {during / 2**20:.0f} MiB while timed (NVML)"
    return (
        f"{memory['peak_device_bytes'] / 2**20:.0f} MiB ÷ {memory['peak_live_bytes'] / 2**20:.0f}"
        f" = {markdown.memory_text(memory)} ({', '.join(memory['sources'])}{during_text})"
    )


def _targets(report: Dict[str, Any]) -> List[str]:
    lines = [
        "| metric | workload | configuration | target | measured | status |",
        "|---|---|---|---|---|---|",
    ]
    absent = [r for r in report["targets"] if r["status"] == "not measured"]
    for row in [r for r in report["targets"] if r["status"] != "not measured"]:
        if row.get("interval"):
            low, high = row["interval"]
            measured = f"{row['value']:.3f} ({low:.3f}–{high:.3f})"
        elif row.get("value") is not None:
            measured = f"{row['value']:.3f} (n={row.get('n')})"
        else:
            measured = "—"
        lines.append(
            f"| {row['metric']} | `{row['workload']}` | `{row['config']}` | {row['target']} | "
            f"{measured} | {row['status']} |"
        )
    if absent:
        names = sorted({f"{r['metric']} `{r['workload']}`" for r in absent})
        lines += ["", "Not measured in these runs: " + ", ".join(names) + "."]
    return lines


def _cotenant(report: Dict[str, Any]) -> List[str]:
    cells = report.get("cotenant") or {}
    if not cells:
        return []
    lines = [
        "| A's configuration | `empty_cache()` | idle | held beyond live (median, max) | "
        "B's free memory (lowest) | B could use it |",
        "|---|---|---|---|---|---|",
    ]
    for name, cell in cells.items():
        if "error" in cell:
            lines.append(f"| `{name}` | | | failed | | |")
            continue
        for probe in cell["probes"]:
            lines.append(
                f"| `{name}` | {'yes' if cell['empty_cache_called'] else 'no'} | "
                f"{probe['idle_s']:.1f} s | {probe['held_gib_median']:.2f}, "
                f"{probe['held_gib_max']:.2f} GiB | {probe['free_gib_min']:.1f} GiB | "
                f"{'yes' if probe['confirmed'] else 'NO'} |"
            )
    return lines


def _calls(report: Dict[str, Any]) -> List[str]:
    facts = report["facts"]
    lines = []
    for index, command in enumerate(facts["commands"]):
        release = facts["idle_release_s"][index]
        gpu = facts["gpu"][index]
        clocks = "" if not gpu["sm_mhz"] else (
            f"; SM clock {gpu['sm_mhz'][0]}–{gpu['sm_mhz'][1]} MHz, power up to "
            f"{gpu['power_w_max']} W, {gpu['throttled_pairs']} of {gpu['pairs']} pairs throttled"
        )
        lines.append(
            f"- `{command}` ({facts['dates'][index]}; idle release "
            f"{'off' if release is None else f'{release:g} s'}; NVML: "
            f"{facts['nvml'][index] or 'absent'}{clocks})"
        )
    if facts.get("merge_command"):
        lines.append(f"- merged by `{facts['merge_command']}`")
    return lines


def render(report: Dict[str, Any]) -> str:
    """The whole report.md."""
    lines = ["# streampool benchmarks", ""] + markdown.headline(report)
    lines += [
        "",
        "## Time ×native per configuration (median of paired ratios, 95% interval, pairs)",
        "",
        *_table(report, _time),
        "",
        "## A/A and the spread between processes (native-aa ÷ native; one process of each "
        "per process set)",
        "",
        *_aa(report),
        "",
        "## Time per unit, largest idle gap between a worker's blocks, throttled pairs",
        "",
        *_table(report, _per_unit(report)),
        "",
        "## Peak device memory ÷ native's peak live bytes (memory pass, one worker at a time)",
        "",
        "A worker is one process for all the workloads of its run, one after the other (its "
        "tensors freed and its cache emptied in between): a figure can depend on what ran "
        "before it in that process. Memory is read after each synchronised step: a "
        "configuration that gives memory back at each synchronisation (a release threshold) "
        "shows what it holds after that, not its peak within the step.",
        "",
        *_table(report, _memory),
        "",
        "## Targets (`bench/targets.json`): met when the interval's upper end is at or below",
        "",
        *_targets(report),
    ]
    diagnosis = noise.markdown(report.get("aa_noise") or {})
    if diagnosis:
        lines += ["", "## Where the A/A difference comes from (bench/noise.py)", "", *diagnosis]
    cotenant = _cotenant(report)
    if cotenant:
        lines += ["", "## Co-tenant: what B can use while A idles", "", *cotenant]
    slept = report.get("sleep")
    if slept:
        lines += ["", "## Sleep and wake (bench/sleep.py: `sleep/sleep.md` in the sleep group's "
                  "output folder has every figure)", ""] + [f"- {line}" for line in sleep_report.summary_lines(slept)]
    failures = markdown.failure_lines(report)
    if failures:
        lines += ["", "## Failures (last lines of each error)", ""] + [f"- {f}" for f in failures]
    lines += ["", "## Runs", ""] + _calls(report)
    return "\n".join(lines) + "\n"

"""The report in Markdown (report.md): the one-screen headline for the top of BENCHMARKS.md, then
the details it rests on. Rendered from report.json alone.

Invariant: every number printed comes from the report (no recomputation), so re-rendering an old
report gives the same text; a time ratio is always printed with its interval (or "no interval"
below the method's pairs); every configuration that was asked for is in the tables, a failure as
"failed" with the end of its error below, wins and losses alike.
"""

from typing import Any, Dict, List, Optional

from .configs import NATIVE, NATIVE_AA, POOL_THRESHOLD, THRESHOLD, VMM_THRESHOLD
from .stats import MIN_PAIRS

HEADLINE_CONFIGS = (NATIVE, "expandable", "torch-async", "streampool", "streampool-pool",
                    "streampool-vmm")
COTENANT_COLUMNS = {NATIVE: NATIVE, "expandable": "expandable", "torch-async": "torch-async",
                    "streampool": "streampool", "streampool-pool": "streampool-pool",
                    "streampool-vmm": "streampool-vmm"}
HEADLINE_IDLE_S = 3.0
MARKS = {"met": " ✓", "not met": " ✗"}


def interval_text(time: Optional[Dict[str, Any]], digits: int = 2) -> str:
    """``1.01 (0.99–1.03)``, ``1.01 (no interval: 6 pairs)``, or ``—``."""
    if not time or time.get("ratio") is None:
        return "—"
    if time.get("ci95") is None:
        return f"{time['ratio']:.{digits}f} (no interval: {time['n']} pairs)"
    low, high = time["ci95"]
    return f"{time['ratio']:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def memory_text(memory: Optional[Dict[str, Any]]) -> str:
    if not memory:
        return "—"
    low, high = memory["low"], memory["high"]
    spread = f" ({low:.2f}–{high:.2f})" if f"{low:.2f}" != f"{high:.2f}" else ""
    return f"{memory['ratio']:.2f}{spread}"


def _statuses(report: Dict[str, Any]) -> Dict[tuple, str]:
    return {(r["metric"], r["workload"], r["config"]): r["status"] for r in report["targets"]}


def _notes_of(cell: Dict[str, Any]) -> str:
    marks = ""
    if cell.get("gap_over_idle_release"):
        marks += "‡"
    if cell.get("throttled_pairs"):
        marks += "†"
    return marks


def headline_cell(workload: str, config: str, cell: Optional[Dict], status: Dict) -> str:
    if not cell:
        return "not run"
    if cell.get("failed"):
        return "**failed**"
    memory = memory_text(cell.get("memory"))
    memory += MARKS.get(status.get(("memory", workload, config)), "")
    if config == NATIVE:
        return f"{memory} · 1"
    time = interval_text(cell.get("time")) + MARKS.get(status.get(("time", workload, config)), "")
    return f"{memory} · {time}{_notes_of(cell)}"


def pairs_text(cells: Dict[str, Any]) -> str:
    counts = [c["time"]["n"] for c in cells.values() if c.get("time")]
    if not counts:
        return ""
    low, high = min(counts), max(counts)
    return f" ({low} pairs)" if low == high else f" ({low}–{high} pairs)"


def _cotenant_row(report: Dict[str, Any], status: Dict, configs: List[str]) -> List[str]:
    cells = report.get("cotenant") or {}
    if not cells:
        return []

    def held(name: str) -> str:
        cell = cells.get(name)
        if not cell:
            return "not run"
        if "error" in cell:
            return "**failed**"
        probe = [p for p in cell["probes"] if abs(p["idle_s"] - HEADLINE_IDLE_S) < 1.0]
        if not probe:
            return "—"
        mark = MARKS.get(status.get(("cotenant", f"idle {HEADLINE_IDLE_S:g} s", name)), "")
        return f"{probe[0]['held_gib_median']:.2f} GiB{mark}"

    texts = [held(COTENANT_COLUMNS[c]) if c in COTENANT_COLUMNS else "" for c in configs]
    return [f"| co-tenant: held beyond live after {HEADLINE_IDLE_S:g} s idle | | "
            + " | ".join(texts) + " |"]


def headline(report: Dict[str, Any]) -> List[str]:
    """The one screen (module docstring)."""
    facts, status = report["facts"], _statuses(report)
    configs = [c for c in HEADLINE_CONFIGS
               if any(c in cells for cells in report["workloads"].values())] or [NATIVE]
    lines = [
        "## Headline",
        "",
        f"{', '.join(facts['device'])}, driver {', '.join(facts['driver'])}, torch "
        f"{', '.join(facts['torch'])} (CUDA {', '.join(facts['cuda'])}), streampool "
        f"{', '.join(facts['streampool'])}; {', '.join(d for d in facts['dates'] if d)}.",
        "",
        "Each cell: peak device memory ÷ native's peak live tensor bytes · time ×native, the "
        "median of paired ratios (95% interval). ✓ / ✗: target of `bench/targets.json` met / "
        "not met (a time target when the interval's upper end is at or below it; memory at or "
        "below expandable's). A/A: native against itself, the noise of the run. "
        f"No interval from fewer than {MIN_PAIRS} pairs.",
        "",
        "| workload | A/A | " + " | ".join(configs) + " |",
        "|---" * (len(configs) + 2) + "|",
    ]
    for workload, cells in report["workloads"].items():
        aa = cells.get(NATIVE_AA)
        aa_text = "not run" if not aa else "**failed**" if aa.get("failed") else (
            interval_text(aa.get("time")) + MARKS.get(status.get(("aa", workload, NATIVE_AA)), "")
        )
        texts = [headline_cell(workload, c, cells.get(c), status) for c in configs]
        row = f"| `{workload}`{pairs_text(cells)} | {aa_text} | " + " | ".join(texts)
        lines.append(row + " |")
    lines += _cotenant_row(report, status, configs)
    lines += headline_notes(report)
    commands = [f"- `{c}`" for c in facts["commands"] if c]
    if facts.get("merge_command"):
        commands.append(f"- merged: `{facts['merge_command']}`")
    if commands:
        lines += ["", "Commands (one run per group of workloads):", ""] + commands
    return lines


def headline_notes(report: Dict[str, Any]) -> List[str]:
    notes = []
    extra = report.get("cotenant", {}).get("native+empty_cache")
    if extra and "error" not in extra:
        probe = [p for p in extra["probes"] if abs(p["idle_s"] - HEADLINE_IDLE_S) < 1.0]
        if probe:
            notes.append(f"native calling `empty_cache()` holds {probe[0]['held_gib_median']:.2f} "
                         f"GiB beyond live after {HEADLINE_IDLE_S:g} s idle.")
    prices = ((THRESHOLD, "", "price"), (VMM_THRESHOLD, " on vmm", "price_vmm"),
              (POOL_THRESHOLD, " on pool", "price_pool"))
    for name, backend, price in prices:
        threshold = report.get("cotenant", {}).get(name)
        if threshold and "error" not in threshold:
            probe = [p for p in threshold["probes"] if abs(p["idle_s"] - HEADLINE_IDLE_S) < 1.0]
            if probe:
                notes.append(f"streampool{backend} with `STREAMPOOL_RELEASE_THRESHOLD=1GiB` holds "
                             f"{probe[0]['held_gib_median']:.2f} GiB.")
        if report.get(price):
            # Marked where the threshold's worker or its reference idled past the idle-release
            # delay between two blocks: the reference may have paid for memory given back then.
            gpt2 = report["workloads"].get("gpt2", {})
            idled = any("‡" in _notes_of(gpt2.get(n) or {}) for n in (name, report[price]["ref"]))
            notes.append(f"Its price{backend}, GPT-2 training time with the threshold ÷ without "
                         f"(paired): {interval_text(report[price])}{'‡' if idled else ''}.")
    failures = failure_lines(report, last_line_only=True)
    if failures:
        notes.append("Failed: " + "; ".join(failures) + ".")
    marks = {m for cells in report["workloads"].values() for c in cells.values()
             for m in _notes_of(c)}
    if "‡" in marks:
        notes.append("‡ a worker idled longer than the idle-release delay between two of its "
                     "blocks: not a busy loop.")
    if "†" in marks:
        notes.append("† some pairs ran while the GPU reported a power or thermal slowdown.")
    return ["", " ".join(notes)] if notes else []


def failure_lines(report: Dict[str, Any], last_line_only: bool = False) -> List[str]:
    """One entry per failure: ``workload`` × configurations (those failing with the same text
    together), then the co-tenant's, then the sleep group's; the whole end of each error, or its
    last line only."""

    def text(error: str) -> str:
        kept = [line for line in error.splitlines() if line.strip()] or [""]
        return kept[-1] if last_line_only else "\n  ".join(kept)

    grouped: Dict[tuple, List[str]] = {}
    for workload, cells in report["workloads"].items():
        for config, cell in cells.items():
            if cell.get("failed"):
                grouped.setdefault((f"`{workload}`", text(cell["errors"][0])), []).append(config)
    for name, cell in (report.get("cotenant") or {}).items():
        if "error" in cell:
            grouped.setdefault(("co-tenant", text(cell["error"])), []).append(name)
    for failed in (report.get("sleep") or {}).get("failed", []):
        where = f"sleep (stage {failed.get('stage')})"
        grouped.setdefault((where, text(failed.get("error") or "no record")), []).append(
            failed["config"])
    return [
        f"{where} × {', '.join(f'`{c}`' for c in configs)}: {error}"
        for (where, error), configs in grouped.items()
    ]

"""What ``streampool compare`` prints and draws from its runs: the tables, the failed runs, the plot.

Invariant: a figure shown comes from successful runs only, and a ratio is called "same" only when
it lies inside the spread of the native-vs-native runs of the same comparison (at least 3 runs of
the allocator and 2 successful native runs), never from a fixed tolerance.
"""

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ._stats import format_bytes

NATIVE = "native"
EXPANDABLE = "expandable"
MIN_RUNS_FOR_VERDICT = 3
STDERR_TAIL_LINES = 15


@dataclass
class RunResult:
    """One run of the user's command under one allocator. Bytes in bytes, times in seconds."""

    allocator: str
    round_index: int  # 1-based
    exit_status: str  # "0", "1", "SIGKILL", "timeout"
    wall_s: float
    peak_bytes: Optional[int] = None
    series: List[Tuple[float, int]] = field(default_factory=list)  # (seconds since start, bytes)
    source: Optional[str] = None  # which reader measured the memory
    ooms: Optional[int] = None
    peak_tensor_bytes: Optional[int] = None
    failure: Optional[str] = None  # why the run does not count; None for a successful run
    stderr_tail: str = ""
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> Optional[float]:
    """max / min - 1 of the values, or None with fewer than two (or a zero)."""
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values) - 1.0


@dataclass
class Summary:
    """Medians per allocator and the native-vs-native spread per metric."""

    order: List[str]
    runs: Dict[str, List[RunResult]]
    memory: Dict[str, Optional[float]]
    wall: Dict[str, Optional[float]]
    memory_band: Optional[float]
    wall_band: Optional[float]
    runs_per_allocator: int


def summarise(results: Sequence[RunResult], order: Sequence[str], runs_per_allocator: int) -> Summary:
    by_name: Dict[str, List[RunResult]] = {name: [] for name in order}
    for result in results:
        by_name.setdefault(result.allocator, []).append(result)
    ok = {name: [r for r in rs if r.ok] for name, rs in by_name.items()}
    memory = {n: _median([r.peak_bytes for r in rs if r.peak_bytes is not None]) for n, rs in ok.items()}
    wall = {n: _median([r.wall_s for r in rs]) for n, rs in ok.items()}
    natives = ok.get(NATIVE, [])
    return Summary(
        order=list(by_name),
        runs=by_name,
        memory=memory,
        wall=wall,
        memory_band=_spread([r.peak_bytes for r in natives if r.peak_bytes is not None]),
        wall_band=_spread([r.wall_s for r in natives]),
        runs_per_allocator=runs_per_allocator,
    )


def ratio_cell(value: Optional[float], reference: Optional[float], band: Optional[float], verdict: bool) -> str:
    """``value / reference`` as "0.74x", with " same" when inside the native-vs-native ``band``."""
    if value is None or not reference:
        return "-"
    ratio = value / reference
    text = f"{ratio:.2f}x"
    if verdict and band is not None and abs(ratio - 1.0) <= band:
        text += " same"
    return text


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _bytes(value: Optional[float]) -> str:
    return "-" if value is None else format_bytes(int(value))


def _exits(runs: Sequence[RunResult]) -> str:
    statuses = [r.exit_status for r in runs]
    return statuses[0] if statuses and len(set(statuses)) == 1 else ",".join(statuses) or "-"


def _ooms(runs: Sequence[RunResult]) -> str:
    known = [r.ooms for r in runs if r.ooms is not None]
    return str(sum(known)) if known else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def format_report(summary: Summary) -> str:
    """The two tables (memory, time) and the line that says what "same" means here."""
    s = summary
    verdict = s.runs_per_allocator >= MIN_RUNS_FOR_VERDICT
    lines = []
    if not verdict:
        lines.append(f"(fewer than {MIN_RUNS_FOR_VERDICT} runs per allocator: no difference is called \"same\")")
    elif s.memory_band is None or s.wall_band is None:
        lines.append("(fewer than two successful native runs: no difference is called \"same\")")
    else:
        lines.append(
            f"native vs native: peak memory varied by {s.memory_band:.1%}, wall time by {s.wall_band:.1%}; "
            "a ratio inside that spread is marked \"same\""
        )
    peak_tensors = {}
    for name in s.order:
        known = [r.peak_tensor_bytes for r in s.runs[name] if r.ok and r.peak_tensor_bytes is not None]
        peak_tensors[name] = _median(known)
    memory_rows, time_rows = [], []
    for name in s.order:
        runs = s.runs[name]
        ok_count = f"{sum(r.ok for r in runs)}/{len(runs)}"
        memory_rows.append([
            name, ok_count, _bytes(s.memory[name]),
            ratio_cell(s.memory[name], s.memory.get(NATIVE), s.memory_band, verdict),
            ratio_cell(s.memory[name], s.memory.get(EXPANDABLE), s.memory_band, verdict) if EXPANDABLE in s.memory else "-",
            _bytes(peak_tensors[name]),
        ])
        time_rows.append([
            name, ok_count, _seconds(s.wall[name]),
            ratio_cell(s.wall[name], s.wall.get(NATIVE), s.wall_band, verdict),
            ratio_cell(s.wall[name], s.wall.get(EXPANDABLE), s.wall_band, verdict) if EXPANDABLE in s.wall else "-",
            _ooms(runs), _exits(runs),
        ])
    lines += ["", "peak device memory (median of the successful runs)"]
    lines += _table(["allocator", "ok", "median", "vs native", "vs expandable", "peak tensors"], memory_rows)
    lines += ["", "wall time (median of the successful runs)"]
    lines += _table(["allocator", "ok", "median", "vs native", "vs expandable", "OOMs (all runs)", "exit status"], time_rows)
    return "\n".join(lines)


def format_failures(results: Sequence[RunResult]) -> str:
    """Each failed run: what failed, where its logs are, and the end of its stderr."""
    blocks = []
    shown: Dict[str, str] = {}  # stderr tail -> the run that showed it
    for r in results:
        if r.ok:
            continue
        block = [f"FAILED: {r.allocator}, run {r.round_index}: {r.failure} (logs: {r.log_dir})"]
        tail = r.stderr_tail.rstrip("\n")
        if not tail.strip():
            block.append("  (nothing on stderr)")
        elif tail in shown:
            block.append(f"  (the same end of stderr as {shown[tail]})")
        else:
            shown[tail] = f"{r.allocator}, run {r.round_index}"
            block += ["  | " + line for line in tail.splitlines()]
        blocks.append("\n".join(block))
    return "\n\n".join(blocks)


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" if it is missing)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def plot(results: Sequence[RunResult], order: Sequence[str], out: str, title: str, source: str) -> str:
    """Device memory over time, one line per run, one colour per allocator; returns the path.
    Raises ImportError (saying how to install matplotlib) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "--plot needs matplotlib: pip install 'streampool[plot]' (or pip install matplotlib)"
        ) from None
    figure, axes = plt.subplots(figsize=(10, 5))
    colours = plt.get_cmap("tab10")
    for number, name in enumerate(order):
        labelled = False
        for r in results:
            if r.allocator != name or not r.series:
                continue
            times = [t for t, _ in r.series]
            gib = [b / 2**30 for _, b in r.series]
            label = None if labelled else name
            axes.plot(times, gib, color=colours(number % 10), alpha=0.8 if r.ok else 0.3,
                      linestyle="-" if r.ok else ":", linewidth=1.2, label=label)
            labelled = True
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("device memory (GiB)")
    axes.set_title(title, fontsize=10)
    figure.text(0.01, 0.01, f"memory: {source}; dotted: failed runs", fontsize=7)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out

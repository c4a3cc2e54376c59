"""``python3 -m bench headline``: the benchmark's tables in README.md and BENCHMARKS.md, generated
from the committed results of the newest full run.

A full run is a folder ``bench/results/<date>[-label]/`` holding the ``report.json`` that
``python3 -m bench merge`` wrote and a ``run.json`` with what the report cannot know:
``{"commit": "<the commit whose library ran>", "default_backend": "pool" | "vmm"}`` (which backend
the configuration ``streampool``, the library's default, was). The folder whose name sorts last
among those with both files is the headline run: committing a new run's folder with its run.json
is all it takes (``--run DIR`` renders another). ``parity.md``, the PyTorch parity table, comes
from the newest folder that has one and goes into README.md's parity slot as it is.

A document marks each generated block with ``<!-- generated:NAME ... -->`` and
``<!-- /generated:NAME -->``; ``headline`` rewrites what lies between, ``headline --check``
only compares and fails naming the blocks that differ.

Invariant: a block is a function of committed files alone: every number in it comes from
report.json (or parity.md), and every block names the run's folder, date, card and commit. A
configuration that failed reads "fails", one the run did not have "not run", never a blank; a
workload is a row only if the run has it, so a later run with more workloads needs no change here.
"""

import argparse
import json
import re
import runpy
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import markdown, sleep_report, stats
from .configs import NATIVE, NATIVE_AA

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("bench") / "results"
RUN_FILE, REPORT_FILE, PARITY_FILE = "run.json", "report.json", "parity.md"
BACKENDS = ("pool", "vmm")
FAILS, NOT_RUN = "fails", "not run"
# The blocks of each document, in the order they appear there.
DOCUMENTS = {"README.md": ("readme-summary", "readme-table", "parity"),
             "BENCHMARKS.md": ("run-table", "noise")}
BLOCK = re.compile(r"(<!-- generated:(?P<name>[\w-]+)[^>]*-->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)",
                   re.S)
IDLE_S = markdown.HEADLINE_IDLE_S


class Run:
    """One full run: its folder (relative to the repository), report and run.json."""

    def __init__(self, root: Path, folder: Path):
        self.root = root
        self.folder = folder.resolve().relative_to(root.resolve())
        self.name = folder.name
        try:
            self.report = json.loads((folder / REPORT_FILE).read_text())
            meta = json.loads((folder / RUN_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{self.folder}: {exc}") from None
        commit, default = meta.get("commit"), meta.get("default_backend")
        if not isinstance(commit, str) or not commit or default not in BACKENDS:
            raise SystemExit(f"{self.folder}/{RUN_FILE} must say {{\"commit\": \"<hash>\", "
                             f"\"default_backend\": \"pool\" or \"vmm\"}}, not {meta}")
        self.commit, self.default_backend = commit, default
        self.parity: Optional[Tuple[str, str]] = None  # (folder, text) of the newest parity.md
        self.current_default = default  # the library's default backend now (README's label)

    def config_for(self, cells: Dict[str, Any], backend: str) -> Optional[str]:
        """The configuration that measured ``backend`` among ``cells``' names: its own
        ``streampool-BACKEND``, else ``streampool`` if that was the backend it defaulted to."""
        if f"streampool-{backend}" in cells:
            return f"streampool-{backend}"
        if backend == self.default_backend and "streampool" in cells:
            return "streampool"
        return None

    def provenance(self) -> str:
        facts = self.report.get("facts", {})
        days = sorted({d[:10] for d in facts.get("dates", []) if d})
        return (f"Run `{self.folder}/` of {', '.join(days) or 'an unknown date'}: "
                f"{', '.join(facts.get('device', ['an unknown card']))}, driver "
                f"{', '.join(facts.get('driver', ['unknown']))}, torch "
                f"{', '.join(facts.get('torch', ['unknown']))}; library of commit `{self.commit}`, "
                f"whose default backend was `{self.default_backend}`.")


def full_runs(root: Path) -> List[Path]:
    """Folders of bench/results with a report.json and a run.json, oldest name first."""
    base = root / RESULTS
    return sorted(p for p in base.iterdir()
                  if (p / RUN_FILE).is_file() and (p / REPORT_FILE).is_file()) if base.is_dir() else []


def load(root: Path, folder: Optional[Path] = None) -> Run:
    """The run of ``folder``, else the newest full run; with the newest parity table."""
    if folder is None:
        runs = full_runs(root)
        if not runs:
            raise SystemExit(f"no full run in {RESULTS}/: a run's folder needs {REPORT_FILE} "
                             f"(python3 -m bench merge) and {RUN_FILE} (its commit and default backend)")
        folder = runs[-1]
    run = Run(root, folder if folder.is_absolute() else root / folder)
    run.current_default = current_default_backend(root)
    parities = sorted((root / RESULTS).glob(f"*/{PARITY_FILE}"))
    if parities:
        newest = parities[-1]
        run.parity = (str(newest.parent.relative_to(root)), newest.read_text().strip())
    return run


def current_default_backend(root: Path) -> str:
    """The backend the library defaults to now, as the package documents it (tests/tables.rs
    checks that table against the library's own defaults)."""
    config = runpy.run_path(str(root / "python" / "streampool" / "_config.py"))
    return config["VARIABLE_DEFAULTS"]["STREAMPOOL_BACKEND"]


# --- cells ------------------------------------------------------------------------------------


def _time(cell: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    time = cell.get("time")
    return time if time and time.get("ratio") is not None else None


def short_cell(cells: Dict[str, Any], config: Optional[str]) -> str:
    """``memory · time`` without intervals (README), or fails / not run."""
    cell = cells.get(config) if config else None
    if not cell:
        return NOT_RUN
    if cell.get("failed"):
        return FAILS
    memory = cell.get("memory")
    memory_text = f"{memory['ratio']:.2f}" if memory else "—"
    if config == NATIVE:
        return f"{memory_text} · 1"
    time = _time(cell)
    return f"{memory_text} · {time['ratio']:.2f}" if time else f"{memory_text} · —"


def held_gib(report: Dict[str, Any], config: Optional[str]) -> str:
    """GiB held beyond live after IDLE_S idle (co-tenant), or fails / not run."""
    cell = (report.get("cotenant") or {}).get(config) if config else None
    if not cell:
        return NOT_RUN
    if "error" in cell:
        return FAILS
    probe = [p for p in cell.get("probes", []) if abs(p["idle_s"] - IDLE_S) < 1.0]
    return f"{probe[0]['held_gib_median']:.2f}" if probe else "—"


def _aa_text(cells: Dict[str, Any]) -> str:
    cell = cells.get(NATIVE_AA)
    if not cell:
        return NOT_RUN
    return FAILS if cell.get("failed") else markdown.interval_text(_time(cell))


# --- README: against expandable segments ------------------------------------------------------


def _memory_versus(mine: Dict[str, Any], theirs: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """``("less" | "more", "E → S")`` where ``mine`` held less or more memory than ``theirs``
    (their peaks to the MiB where both have one, else their ratios to two decimals), None where
    the same; where the two ratios to two decimals do not show that (the same, or the other way:
    each is a median over process sets, the peaks too), the difference in MiB follows them."""
    a, b = mine.get("memory"), theirs.get("memory")
    if not a or not b:
        return None
    mine_text, their_text = f"{a['ratio']:.2f}", f"{b['ratio']:.2f}"
    text = f"{their_text} → {mine_text}"
    mine_bytes, their_bytes = a.get("peak_device_bytes"), b.get("peak_device_bytes")
    if mine_bytes is None or their_bytes is None:
        if mine_text == their_text:
            return None
        return ("more" if float(mine_text) > float(their_text) else "less"), text
    difference = round((mine_bytes - their_bytes) / 2**20)
    if difference == 0:
        return None
    more = difference > 0
    if (float(mine_text) > float(their_text)) != more or mine_text == their_text:
        text += f" ({difference:+d} MiB)"
    return ("more" if more else "less"), text


def versus_expandable(run: Run, backend: str) -> Dict[str, List[str]]:
    """Workloads where ``backend`` holds less or more memory than expandable segments (to the
    MiB: ``_memory_versus``), is faster or slower (95% intervals apart), or fails."""
    out: Dict[str, List[str]] = {"less": [], "more": [], "faster": [], "slower": [], "fails": []}
    for workload, cells in run.report.get("workloads", {}).items():
        mine, theirs = cells.get(run.config_for(cells, backend) or ""), cells.get("expandable")
        if not mine or not theirs:
            continue
        name = f"`{workload}`"
        if mine.get("failed"):
            if not theirs.get("failed"):
                out["fails"].append(name)
            continue
        versus = _memory_versus(mine, theirs)
        if versus:
            out[versus[0]].append(name)
        a_time, b_time = _time(mine), _time(theirs)
        if a_time and b_time and a_time.get("ci95") and b_time.get("ci95"):
            if a_time["ci95"][1] < b_time["ci95"][0]:
                out["faster"].append(name)
            elif a_time["ci95"][0] > b_time["ci95"][1]:
                out["slower"].append(name)
    return out


def _listing(names: List[str]) -> str:
    return ", ".join(names) if names else "none"


def readme_table(run: Run) -> List[str]:
    report = run.report
    labels = {b: f"streampool `{b}`" + (" (default)" if b == run.current_default else "") for b in BACKENDS}
    lines = [
        run.provenance(),
        "",
        "Each cell: peak device memory ÷ native's peak live tensor bytes · time ×native, the median "
        "of paired blocks (lower is better for both; — where a workload has no memory figure). "
        "A/A: native against itself, the run's noise, with its 95% interval.",
        "",
        "| workload | A/A | native | expandable segments | " + " | ".join(labels[b] for b in BACKENDS)
        + " |",
        "|---" * (4 + len(BACKENDS)) + "|",
    ]
    for workload, cells in report.get("workloads", {}).items():
        columns = [_aa_text(cells), short_cell(cells, NATIVE), short_cell(cells, "expandable")]
        columns += [short_cell(cells, run.config_for(cells, b)) for b in BACKENDS]
        lines.append(f"| `{workload}` | " + " | ".join(columns) + " |")
    cotenant = report.get("cotenant") or {}
    if cotenant:
        idle = [held_gib(report, NATIVE), held_gib(report, "expandable")]
        idle += [held_gib(report, run.config_for(cotenant, b)) for b in BACKENDS]
        lines.append(f"| GiB held beyond live tensors {IDLE_S:g} s after GPT-2 training stops | | "
                     + " | ".join(idle) + " |")
    lines += ["", "Against expandable segments in this run:", ""]
    for backend in BACKENDS:
        v = versus_expandable(run, backend)
        text = (f"- {labels[backend]}: memory: less on {_listing(v['less'])}, more on "
                f"{_listing(v['more'])}; time (95% intervals apart): faster on "
                f"{_listing(v['faster'])}, slower on {_listing(v['slower'])}, the rest within the noise")
        if v["fails"]:
            text += f"; fails on {_listing(v['fails'])}"
        idle = held_gib(report, run.config_for(cotenant, backend)) if cotenant else NOT_RUN
        if idle[0].isdigit():
            text += (f"; held {idle} GiB beyond live tensors {IDLE_S:g} s after training stopped, "
                     f"against {held_gib(report, 'expandable')} GiB")
        lines.append(text + ".")
    return lines


def memory_against_expandable(run: Run, backend: str) -> Dict[str, List[str]]:
    """``workload E → S`` (expandable segments' memory ratio, then ``backend``'s, two decimals,
    and the MiB where those read the same) for the workloads where ``backend`` holds less, and
    where it holds more."""
    out: Dict[str, List[str]] = {"less": [], "more": []}
    for workload, cells in run.report.get("workloads", {}).items():
        mine, theirs = cells.get(run.config_for(cells, backend) or ""), cells.get("expandable")
        if not mine or not theirs or mine.get("failed") or theirs.get("failed"):
            continue
        versus = _memory_versus(mine, theirs)
        if versus:
            out[versus[0]].append(f"`{workload}` {versus[1]}")
    return out


def readme_summary(run: Run) -> List[str]:
    """README's first screen: the idle memory of the co-tenant group where the run has one, then
    each backend's memory against expandable segments, with the figures, and its time where the
    95% intervals are apart (one line a backend, the default first)."""
    facts, cotenant = run.report.get("facts", {}), run.report.get("cotenant") or {}
    order = sorted(BACKENDS, key=lambda b: b != run.current_default)
    labels = {b: f"`{b}`" + (" (default)" if b == run.current_default else "") for b in BACKENDS}
    lines = ["Against expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`) in "
             f"the newest run (`{run.folder}/`, {', '.join(facts.get('device', ['an unknown card']))}, "
             f"commit `{run.commit}`); memory is peak GPU memory ÷ the live tensors' bytes, lower is "
             "better, expandable segments → streampool where they differ:"]
    if cotenant:
        held = [f"native {held_gib(run.report, NATIVE)}",
                f"expandable segments {held_gib(run.report, 'expandable')}"]
        held += [f"{labels[b]} {held_gib(run.report, run.config_for(cotenant, b))}" for b in order]
        lines.append(f"- GiB held beyond live tensors {IDLE_S:g} s after GPT-2 training stops (memory "
                     f"the card's other processes cannot have): {', '.join(held)}.")
    for backend in order:
        memory, versus = memory_against_expandable(run, backend), versus_expandable(run, backend)
        parts = [f"{key} memory on {', '.join(memory[key])}" for key in ("less", "more") if memory[key]]
        text = f"- {labels[backend]}: " + ("; ".join(parts) or "the same memory")
        apart = [f"{key} on {', '.join(versus[key])}" for key in ("faster", "slower") if versus[key]]
        text += ("; time: " + ", ".join(apart) + " (95% intervals apart), the rest within the noise"
                 if apart else "; time: within the noise on every workload")
        if versus["fails"]:
            text += f"; fails on {_listing(versus['fails'])}"
        lines.append(text + ".")
    slept = sleep_report.headline_text(run.report.get("sleep") or {})
    if slept:
        lines.append(f"- {slept}")
    return lines


def parity_block(run: Run) -> List[str]:
    if run.parity is None:
        return []
    folder, text = run.parity
    return [f"From `{folder}/{PARITY_FILE}`:", "", text]


# --- BENCHMARKS.md: the whole run -------------------------------------------------------------


def _column_label(run: Run, config: str) -> str:
    if config == "streampool":
        return f"streampool (default: {run.default_backend})"
    return config


def run_table(run: Run) -> List[str]:
    """Every configuration of the headline, with intervals and target marks (markdown.py)."""
    report = run.report
    status = {(r["metric"], r["workload"], r["config"]): r["status"] for r in report.get("targets", [])}
    configs = [c for c in markdown.HEADLINE_CONFIGS
               if any(c in cells for cells in report.get("workloads", {}).values())] or [NATIVE]
    lines = [
        run.provenance(),
        "Each cell: peak device memory ÷ native's peak live tensor bytes · time ×native, the median "
        "of paired ratios (95% interval). ✓ / ✗: target of `bench/targets.json` met / not met. A/A: "
        f"native against itself. No interval from fewer than {stats.MIN_PAIRS} pairs.",
        "",
        "| workload | A/A | " + " | ".join(_column_label(run, c) for c in configs) + " |",
        "|---" * (len(configs) + 2) + "|",
    ]
    for workload, cells in report.get("workloads", {}).items():
        aa = cells.get(NATIVE_AA)
        aa_text = _aa_text(cells)
        if aa and not aa.get("failed"):
            aa_text += markdown.MARKS.get(status.get(("aa", workload, NATIVE_AA)), "")
        texts = []
        for config in configs:
            cell = cells.get(config)
            text = markdown.headline_cell(workload, config, cell, status)
            texts.append(FAILS if cell and cell.get("failed") else text)
        lines.append(f"| `{workload}`{markdown.pairs_text(cells)} | {aa_text} | " + " | ".join(texts) + " |")
    if report.get("cotenant"):
        held = []
        for config in configs:
            text = held_gib(report, config)
            if text[0].isdigit():
                mark = markdown.MARKS.get(status.get(("cotenant", f"idle {IDLE_S:g} s", config)), "")
                text += " GiB" + mark
            held.append(text)
        lines.append(f"| co-tenant: held beyond live after {IDLE_S:g} s idle | | " + " | ".join(held) + " |")
    notes = markdown.headline_notes(report)
    if report.get("sleep"):
        notes = (notes or []) + ["", f"Sleep and wake (`{sleep_page(run)}`):", ""] + [
            f"- {line}" for line in sleep_report.summary_lines(report["sleep"])]
    if notes:
        lines += notes
    commands = [f"- `{command_text(run, c)}`" for c in report.get("facts", {}).get("commands", []) if c]
    merged = report.get("facts", {}).get("merge_command")
    if merged:
        commands.append(f"- merged: `{command_text(run, merged)}`")
    if commands:
        lines += ["", "The run's commands (`STREAMPOOL_LIBRARY` and `PYTHONPATH` set as in "
                  "\"How to run it\"):", ""] + commands
    return lines


def sleep_page(run: Run) -> str:
    """Where the run's sleep group wrote sleep.md (DIR/sleep/sleep.md for the group's DIR)."""
    found = sorted((run.root / run.folder).glob("**/sleep/sleep.md"))
    return str(found[0].relative_to(run.root)) if found else f"{run.folder}/<sleep group>/sleep/sleep.md"


def command_text(run: Run, command: str) -> str:
    """``command`` with its --out-dir pointing where its results are committed (or DIR)."""

    def where(match: "re.Match[str]") -> str:
        sub = Path(match.group(1)).name
        committed = run.root / run.folder / sub
        if match.group(1).startswith(str(RESULTS)):
            return match.group(0)
        return f"--out-dir {run.folder / sub if committed.is_dir() else 'DIR'}"

    return re.sub(r"--out-dir (\S+)", where, command)


def noise_table(run: Run) -> List[str]:
    """The A/A control per workload: its sd and the pairs a ±3% / ±5% interval would need."""
    lines = [
        run.provenance(),
        "",
        "| workload | A/A: native ÷ native (95% interval) | sd of the paired log ratios | pairs "
        "| pairs a ±3% interval needs | ±5% |",
        "|---|---|---|---|---|---|",
    ]
    for workload, cells in run.report.get("workloads", {}).items():
        aa = cells.get(NATIVE_AA)
        time = _time(aa) if aa and not aa.get("failed") else None
        if not time or time.get("log_sd") is None:
            lines.append(f"| `{workload}` | {_aa_text(cells)} | — | — | — | — |")
            continue
        sd = time["log_sd"]
        lines.append(f"| `{workload}` | {markdown.interval_text(time)} | {100 * sd:.1f}% | {time['n']} | "
                     f"{stats.pairs_needed(sd, 0.03)} | {stats.pairs_needed(sd, 0.05)} |")
    return lines


# --- documents --------------------------------------------------------------------------------

RENDERERS = {"readme-summary": readme_summary, "readme-table": readme_table, "parity": parity_block,
             "run-table": run_table, "noise": noise_table}


def blocks(run: Run) -> Dict[str, str]:
    return {name: "\n".join(render(run)).rstrip() for name, render in RENDERERS.items()}


def apply(text: str, names: Sequence[str], rendered: Dict[str, str], document: str) -> str:
    """``text`` with each named block's body replaced; SystemExit if a marker pair is missing."""
    found = {m.group("name") for m in BLOCK.finditer(text)}
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{document}: no <!-- generated:{missing[0]} --> ... "
                         f"<!-- /generated:{missing[0]} --> block")

    def body(match: "re.Match[str]") -> str:
        name = match.group("name")
        if name not in rendered:
            return match.group(0)
        content = rendered[name]
        return match.group(1) + (content + "\n" if content else "") + match.group(4)

    return BLOCK.sub(body, text)


def stale_blocks(root: Path, run: Run) -> List[str]:
    """``DOCUMENT: block`` for every block that differs from what the results generate."""
    rendered, stale = blocks(run), []
    for document, names in DOCUMENTS.items():
        text = (root / document).read_text()
        wanted = apply(text, names, rendered, document)
        if wanted != text:
            now = {m.group("name"): m.group(0) for m in BLOCK.finditer(text)}
            then = {m.group("name"): m.group(0) for m in BLOCK.finditer(wanted)}
            stale += [f"{document}: {n}" for n in names if now.get(n) != then.get(n)]
    return stale


def main(argv: Optional[Sequence[str]] = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench headline",
        description="Write the benchmark's tables into README.md and BENCHMARKS.md from the "
        f"committed results (the newest {RESULTS}/<date>/ with {REPORT_FILE} and {RUN_FILE}).")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the blocks that differ")
    parser.add_argument("--run", type=Path, help="render this run's folder instead of the newest")
    options = parser.parse_args(argv)
    run = load(root, options.run)
    if options.check:
        stale = stale_blocks(root, run)
        for line in stale:
            print(f"{line} differs from what {run.folder} generates: run python3 -m bench headline",
                  file=sys.stderr)
        return 1 if stale else 0
    rendered = blocks(run)
    for document, names in DOCUMENTS.items():
        path = root / document
        path.write_text(apply(path.read_text(), names, rendered, document))
    print(f"wrote the tables of {', '.join(DOCUMENTS)} from {run.folder}")
    return 0

"""The PyTorch parity table of the docs, from a GPU run's parity outcomes.

``python3 bench/parity_table.py RESULTS_DIR`` reads the ``parity-*.jsonl`` files that
python/tests/test_gpu_parity.py wrote there (one line per case and backend: native, PyTorch's
plain pluggable allocator, streampool; a later line for a case and backend replaces an earlier
one) and writes ``RESULTS_DIR/parity.md`` naming the commit of RESULTS_DIR/run.json, which the docs'
generator (bench/headline.py) puts into README.md as it is.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

# case -> what a user does, in the order the table lists them.
FEATURES = {
    "cudnn_benchmark": "`torch.backends.cudnn.benchmark = True`, conv training",
    "compile_reduce_overhead_training": '`torch.compile(mode="reduce-overhead")` training, shapes changing',
    "compile_reduce_overhead_inference": '`torch.compile(mode="reduce-overhead")` inference, several graphs',
    "compile_max_autotune": '`torch.compile(mode="max-autotune")`',
    "graph_shared_pool": "`torch.cuda.graph` captures sharing a pool (`graph_pool_handle`)",
    "make_graphed_callables": "`torch.cuda.make_graphed_callables` training",
    "mempool": "`torch.cuda.MemPool` + `use_mem_pool` (and `use_on_oom`, `no_split`)",
    "typed_out_of_memory": "`except torch.OutOfMemoryError`, OOM observers",
    "memory_history_snapshot": "`_record_memory_history` → `_snapshot` → memory_viz",
    "accelerator_memory_stats": "`torch.accelerator.memory_*`",
    "memory_fraction_round_trip": "`get_per_process_memory_fraction`",
    "multiprocessing_queue": "`torch.multiprocessing` queue carrying a CUDA tensor, plain `install()`",
    "mempool_own_allocator": "`torch.cuda.MemPool(allocator)`: the pool's memory from its own allocator",
    "memory_history_frames": "`_record_memory_history(stacks=...)`: stack frames in the trace",
    "snapshot_adds_up": "`memory_snapshot()` segments add up to `memory_reserved()`",
    "alloc_conf_environment": "`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` set at start",
    "allocator_backend": "`torch.cuda.get_allocator_backend()`",
    "set_allocator_settings": "`torch.cuda.memory._set_allocator_settings`",
}


def _cell(ok: bool, error: str = "") -> str:
    if ok:
        return "✓"
    return "fails" + (f": {error.strip()}" if error else "")


def _short(text: str, limit: int = 120) -> str:
    """``text`` cut to at most ``limit`` characters at a space, with "…", and never inside a
    `code span` (an unmatched backtick would swallow the rest of the table's row)."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    if cut.count("`") % 2:
        cut = cut[: cut.rindex("`")].rstrip()
    return cut + " …"


def _streampool_cell(run: Dict) -> str:
    """✓ where streampool agreed with native; a documented difference (the GPU test checked what
    streampool does instead) says so; anything else fails."""
    if run["streampool"] and run.get("difference"):
        return f"differs: {_short(run['difference'])}"
    return _cell(run["streampool"] and run["agree"])


def _pluggable_cell(pool: Dict) -> str:
    """PyTorch's plain pluggable allocator: ✓, its error, or "differs from native" where it ran
    and gave another result."""
    error = pool.get("pluggable_error")
    if not pool["pluggable"] and error is None and pool["native"]:
        return "differs from native"
    return _cell(pool["pluggable"], _short(error or "", 90))


def table(lines: List[Dict], commit: str) -> str:
    by_case: Dict[str, Dict[str, Dict]] = {}
    for line in lines:
        by_case.setdefault(line["case"], {})[line["backend"]] = line
    first = lines[0]
    out = [
        f"PyTorch features under `streampool.install()`: GPU tests on {first['device']}, torch "
        f"{first['torch']}, commit {commit} (python/tests/test_gpu_parity.py: each case under native, "
        "then under streampool, must pass and agree; the plain pluggable column is PyTorch's "
        "`CUDAPluggableAllocator` without streampool's wiring).",
        "",
        "| what you do | native | PyTorch's pluggable allocator | streampool `pool` | streampool `vmm` |",
        "|---|---|---|---|---|",
    ]
    for case, feature in FEATURES.items():
        runs = by_case.get(case, {})
        pool, vmm = runs.get("pool"), runs.get("vmm")
        native = all(r["native"] for r in runs.values()) if runs else False
        plain = pool.get("pluggable") if pool else None
        cells = [
            _cell(native) if runs else "not run",
            "not run" if plain is None else _pluggable_cell(pool),
            "not run" if pool is None else _streampool_cell(pool),
            "not run" if vmm is None else _streampool_cell(vmm),
        ]
        out.append(f"| {feature} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _commit(folder: Path) -> str:
    """The commit whose library ran: the folder's run.json says it; else the checkout's HEAD."""
    run = folder / "run.json"
    if run.is_file():
        commit = json.loads(run.read_text()).get("commit")
        if isinstance(commit, str) and commit:
            return commit
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip() or "unknown"


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    folder = Path(argv[0])
    lines = [json.loads(l) for f in sorted(folder.glob("parity-*.jsonl")) for l in f.read_text().splitlines() if l]
    if not lines:
        print(f"no parity-*.jsonl in {folder}", file=sys.stderr)
        return 1
    (folder / "parity.md").write_text(table(lines, _commit(folder)))
    print(f"wrote {folder / 'parity.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The GPU benchmark of this repository: streampool against PyTorch's allocators (and RMM's).

Run from the repository root on the GPU machine (BENCHMARKS.md has the method and the command):
``STREAMPOOL_LIBRARY=... PYTHONPATH=python python3 -m bench --out-dir DIR [--quick]``.

Invariant: the parent process (cli, runner, report, stats, targets, markdown, plot, cotenant)
never imports torch; every measurement is made in a child process of one configuration
(child, cotenant_child, workloads), and the two sides speak only through protocol's marker lines.
Files, one job each:
  cli.py            options, the run from start to end, the files written to --out-dir
  configs.py        the configurations and each child's environment
  runner.py         repeats: a fresh process per configuration, order rotated, time budget
  child.py          a child: install the allocator, run the workloads, time and measure them
  workloads.py      what each workload does, one step at a time (torch, in the child)
  schedules.py      the fixed seeded schedule of every workload (pure Python)
  cotenant.py       the co-tenant workload's parent side (two processes on one GPU)
  cotenant_child.py its two processes: the idle trainer (A) and the prober (B)
  stats.py          medians, bootstrap intervals, the A/A comparison, rotation
  report.py         children's records -> latest.json
  targets.py        targets.json and the verdicts
  markdown.py       latest.json -> latest.md;  plot.py: latest.json -> latest.png
  protocol.py       the marker lines between child and parent
The Rust benches (hot_path.rs, driver_costs.rs) and the diag_*.py scripts beside them are
separate tools (cargo bench, scripts/gpu-diag).
"""

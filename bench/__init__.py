"""The GPU benchmark of this repository: streampool against PyTorch's allocators.

Run from the repository root on a machine with a GPU (BENCHMARKS.md has the method and the
commands):
``STREAMPOOL_LIBRARY=... PYTHONPATH=python python3 -m bench [--group G] --out-dir DIR``, then
``python3 -m bench merge DIR... --out-dir OUT``; ``python3 -m bench calibrate --group G`` measures
the A/A and writes each workload's settings into calibration.json, the run's defaults.

Invariant: the parent process (cli, sets, isolation, affinity, runner, plan, workers, stats,
report, targets, markdown, details, headline, calibrate, cotenant, nvml, noise, portable) never
imports torch; every measurement is made in a worker process of one configuration (worker + engine + workloads,
cotenant_child), set up once and driven over a pipe, and the two sides speak only through
protocol's lines.
Files, one job each:
  cli.py            the run, the calibration, the merge (``noise``, ``headline``); what goes
                    to --out-dir
  configs.py        the configurations, what each is paired with, each worker's environment
  plan.py           groups of workloads per call, each workload's settings (calibration.json),
                    ABBA order, block sizes, stages that fit, time estimates
  sets.py           process sets: a run's workers started afresh several times (the random effect)
  isolation.py      the settings that keep workers alike (CPUs, threads, same start, warm-up,
                    clocks), each of which can be turned off
  affinity.py       each worker's cores on the GPU's NUMA node
  runner.py         the parent's run of workloads over one set of workers (memory passes, pairs)
  workers.py        the parent's handle on a worker process (commands, answers, failures)
  worker.py         a worker: the command loop, the memory pass, timed blocks
  engine.py         the worker's torch side: allocator, CUDA, memory readings
  workloads.py      what each workload does, one step at a time (torch, in the worker)
  schedules.py      the fixed seeded schedule of every workload (pure Python)
  nvml.py           clocks, power, throttle reasons, per-process memory (ctypes)
  stats.py          paired ratios, medians, the two-level bootstrap interval (process sets,
                    pairs), variance components, pairs a precision needs
  noise.py          where the A/A difference comes from: the blocks' GPU time, CPU time, CPUs
                    and clocks against the A/A of each process set (``noise``, report.md)
  portable.py       relative paths in the commands a report records
  report.py         the calls' raw results -> report.json;  targets.py: targets.json's verdicts
  markdown.py       the one-screen headline;  details.py: the rest of report.md
  headline.py       README.md's and BENCHMARKS.md's tables from the committed results (``headline``)
  calibrate.py      the A/A by process set and block length, and the run's settings from it
  cotenant.py       the co-tenant's parent side;  cotenant_child.py: its two processes
  protocol.py       the lines between the parent and its processes
sleep.py (``python3 -m bench.sleep``: sleep and wake against torch_memory_saver;
sleep_report.py its figures and report; sleep_child.py its child and sleep_workload.py the
child's workload, the only parts with torch), the Rust benches (hot_path.rs,
driver_costs.rs) and the diag_*.py scripts beside them are separate tools (cargo bench,
scripts/gpu-diag); hot_path_baseline.json is the instruction counts scripts/hot-path-gate holds
the hot path to in CI (examples/pairs.rs).
"""

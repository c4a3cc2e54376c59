"""The allocators the step and pair diagnostics compare (bench/diag_steps.py, bench/diag_pairs.py),
each the environment of its processes: native, streampool on the pool backend, on the vmm backend;
with ``DIAG_BEFORE_LIBRARY=PATH`` also the vmm backend of the library at PATH ("vmm-before": the
previous commit's, for a before/after comparison in the same ABBA order); "expandable" is
native with expandable segments; ``DIAG_VARIANTS="name:K=V,K=V;name2:K=V"`` adds configurations
of streampool's variables; ``DIAG_CONFIGS=a,b`` keeps only those named, in that order.

Invariant: every configuration but native and expandable loads streampool; a name not defined
here is an error.
"""

import os
import subprocess
import sys

BASE = {
    "native": {},
    "pool": {"STREAMPOOL_BACKEND": "pool"},
    "vmm": {"STREAMPOOL_BACKEND": "vmm"},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
}


def uses_streampool(config: str) -> bool:
    """Whether the configuration's process installs streampool."""
    return config not in ("native", "expandable")


def variants(text: str) -> dict:
    """``name:K=V,K=V;name2:K=V`` -> {name: {K: V}}: every K a STREAMPOOL_ variable, one of them
    STREAMPOOL_BACKEND (else the default backend runs, unnoticed), under a name no other
    configuration has."""
    out = {}
    for item in filter(None, text.split(";")):
        name, _, assignments = item.partition(":")
        pairs = [a.split("=", 1) for a in assignments.split(",")]
        well_formed = all(len(p) == 2 and p[0].startswith("STREAMPOOL_") for p in pairs)
        env = dict(pairs) if well_formed else {}
        if not name or name in BASE or name == "vmm-before" or "STREAMPOOL_BACKEND" not in env:
            raise SystemExit(
                f"DIAG_VARIANTS: {item!r} is not new-name:STREAMPOOL_BACKEND=B[,STREAMPOOL_X=V...]"
            )
        out[name] = env
    return out


def chosen() -> dict:
    """The configurations to run, name -> environment."""
    configs = dict(BASE)
    before = os.environ.get("DIAG_BEFORE_LIBRARY")
    if before:
        configs["vmm-before"] = {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_LIBRARY": before}
    configs.update(variants(os.environ.get("DIAG_VARIANTS", "")))
    names = [n for n in os.environ.get("DIAG_CONFIGS", "").split(",") if n]
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise SystemExit(f"DIAG_CONFIGS: unknown {unknown}; known: {', '.join(configs)}")
    return {n: configs[n] for n in names} if names else configs


def run_child(script: str, config: str, args) -> None:
    """Runs ``script --child CONFIG ARGS...`` in a process of its own with ``config``'s
    environment and the repository root on the path, pinned to the last 4 of this process's
    CPUs (every configuration on the same ones)."""
    cpus = sorted(os.sched_getaffinity(0))[-4:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **chosen()[config])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    argv = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, script, "--child", config]
    subprocess.run(argv + list(args), env=env, check=False)

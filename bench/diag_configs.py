"""The allocators the step and pair diagnostics compare (bench/diag_steps.py, bench/diag_pairs.py),
each the environment of its processes: native, streampool on the pool backend, on the vmm backend;
with ``DIAG_BEFORE_LIBRARY=PATH`` also the vmm backend of the library at PATH ("vmm-before": the
previous commit's, for a before/after comparison in the same ABBA order); ``DIAG_CONFIGS=a,b``
keeps only those named, in that order.

Invariant: every configuration but native loads streampool; a name not defined here is an error.
"""

import os

BASE = {
    "native": {},
    "pool": {"STREAMPOOL_BACKEND": "pool"},
    "vmm": {"STREAMPOOL_BACKEND": "vmm"},
}


def chosen() -> dict:
    """The configurations to run, name -> environment."""
    configs = dict(BASE)
    before = os.environ.get("DIAG_BEFORE_LIBRARY")
    if before:
        configs["vmm-before"] = {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_LIBRARY": before}
    names = [n for n in os.environ.get("DIAG_CONFIGS", "").split(",") if n]
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise SystemExit(f"DIAG_CONFIGS: unknown {unknown}; known: {', '.join(configs)}")
    return {n: configs[n] for n in names} if names else configs

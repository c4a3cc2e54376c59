"""What keeps two worker processes of one configuration alike: the settings that remove a
per-process bias at its source, each of which a run can turn off (``--without``) to show what it
is worth.

- ``pin``: each worker of a process set on whole cores of its own on the GPU's NUMA node, the
  parent on what is left (affinity.py);
- ``rotate``: with ``pin``, the workers' CPU sets rotate among the configurations from one
  process set to the next (set k gives configuration i the CPU set of position (i - k) mod n),
  so that a configuration's CPUs (the first set usually takes the interrupts) are not
  confounded with the configuration; the set's record lists each worker's CPUs;
- ``threads``: torch's intra-op threads (and OpenMP's, MKL's) capped at the worker's cores (without
  pinning: the CPUs this process may use, shared out evenly);
- ``setup``: the same start for every worker: one hash seed (PYTHONHASHSEED=0) and no
  address-space randomisation (``setarch -R``, where this kernel allows it), so that two workers
  lay out their memory alike (the CUDA set-up itself is the same code in every worker,
  engine.CudaEngine.set_up, and its fingerprint is checked: runner.Runner);
- ``settle``: warm-up until block times settle (runner.Runner's rule), instead of the timed
  steps once;
- ``clocks``: GPU clocks, power and throttle reasons read after every block (NVML).
Invariant: ``arrange`` is a pure function of its arguments but for reading sysfs and probing
setarch once; every worker of a process set gets the same settings, and the set's record says
which were on.
"""

import functools
import platform
import shutil
import subprocess
from typing import Dict, List, NamedTuple, Optional, Sequence

from . import affinity

FEATURES = ("pin", "rotate", "threads", "setup", "settle", "clocks")
HASH_SEED = "0"


def parse_without(text: str) -> List[str]:
    """``pin,threads`` -> the features to turn off (ValueError naming an unknown one)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown setting {', '.join(unknown)}; choose from {', '.join(FEATURES)}")
    return [f for f in FEATURES if f in names]


@functools.lru_cache(maxsize=None)
def no_aslr_launcher() -> tuple:
    """``("setarch", ARCH, "-R")`` where it runs here (a container may refuse the personality
    call), else ()."""
    setarch = shutil.which("setarch")
    if setarch is None:
        return ()
    launcher = (setarch, platform.machine(), "-R")
    try:
        done = subprocess.run([*launcher, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return launcher if done.returncode == 0 else ()


class ProcessSet(NamedTuple):
    """How the workers of one process set start: extra environment per worker, the command
    prefix, the parent's CPUs (empty: unchanged) and the facts for the record."""

    env: Dict[str, Dict[str, str]]
    launcher: tuple
    parent_cpus: List[int]
    facts: Dict[str, object]


def arrange(names: Sequence[str], without: Sequence[str], index: int,
            bus_id: Optional[str], allowed: Sequence[int],
            launcher: Optional[tuple] = None, sysfs=affinity.SYSFS) -> ProcessSet:
    """The set-up of process set ``index`` of workers ``names`` with every feature on but
    ``without``; ``bus_id``: the GPU's (NVML), ``allowed``: this process's CPUs."""
    on = [f for f in FEATURES if f not in without]
    env: Dict[str, Dict[str, str]] = {n: {"BENCH_PROCESS": str(index)} for n in names}
    facts: Dict[str, object] = {"index": index, "on": on, "off": list(without)}
    parent: List[int] = []
    if "pin" in on:
        shift = index % len(names) if "rotate" in on and names else 0
        order = list(names[shift:]) + list(names[:shift])  # who takes the first CPU set
        placement = affinity.gpu_placement(order, bus_id, allowed, sysfs)
        for name, cpus in placement.workers.items():
            env[name][affinity.CPUS_VARIABLE] = affinity.format_cpulist(cpus)
        parent = placement.parent
        facts["placement"] = placement.note + (f"; CPU sets rotated by {shift}" if shift else "")
        facts["cpus"] = {n: affinity.format_cpulist(placement.workers[n]) for n in names
                         if n in placement.workers}
        counts = {n: len(c) for n, c in placement.workers.items()}
    else:
        even = max(1, len(allowed) // max(1, len(names)))
        counts = {n: even for n in names}
    if "threads" in on:
        for name in names:
            threads = str(counts.get(name, 1))
            env[name].update({affinity.THREADS_VARIABLE: threads, "OMP_NUM_THREADS": threads,
                              "MKL_NUM_THREADS": threads})
    if "setup" in on:
        for name in names:
            env[name]["PYTHONHASHSEED"] = HASH_SEED
        launcher = no_aslr_launcher() if launcher is None else launcher
        facts["aslr_off"] = bool(launcher)
    else:
        launcher = ()
    return ProcessSet(env, tuple(launcher), parent, facts)

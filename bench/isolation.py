"""What keeps two worker processes of one configuration alike: the settings that remove a
per-process bias at its source, each of which a run can turn off (``--without``) to show what it
is worth.

- ``pin``: each worker of a process set on whole cores of its own on the GPU's NUMA node, the
  parent on what is left (affinity.py);
- ``rotate``: with ``pin``, the workers' CPU sets rotate among the configurations from one
  process set to the next (set k gives configuration i the CPU set of position (i - k) mod n),
  so that a configuration's CPUs (the first set usually takes the interrupts) are not
  confounded with the configuration; the set's record lists each worker's CPUs;
- ``launch``: with ``pin``, every worker's launching thread runs its blocks (warm-up and timed)
  on one CPU shared by all the workers of the set (affinity.Placement.launch, the parent's first:
  the parent waits while a block runs), and goes back to its own CPUs after each: both blocks of
  a pair run on the same CPU, back to back. On the H100 and H200 virtual machines every worker's
  CPU ran at about half speed for seconds at a time, unseen by the guest (the thread on its CPU
  throughout, no context switches), one worker's CPU and not the other's: on CPUs of their own
  that was the A/A's noise and its bias per process set; on one CPU both blocks share it. There
  is no launch CPU when no core is spare for the parent (it would be a worker's);
- ``autograd``: with ``launch``, PyTorch's autograd threads (which launch every backward pass's
  kernels while the launching thread waits) go to the launch CPU for each block too; without it
  they stay on the worker's cores, where a slow CPU slows one side of a pair only (on the H200,
  GPT-2's A/A moved in some process sets while its launching thread's CPU time did not);
- ``threads``: torch's intra-op threads (and OpenMP's, MKL's) capped at the worker's cores (without
  pinning: the CPUs this process may use, shared out evenly);
- ``setup``: the same start for every worker: one hash seed (PYTHONHASHSEED=0) and no
  address-space randomisation (``setarch -R``, where this kernel allows it), so that two workers
  lay out their memory alike (the CUDA set-up itself is the same code in every worker,
  engine.CudaEngine.set_up, and its fingerprint is checked: runner.Runner); whatever the
  settings, every worker's arguments and environment are padded to the same count and bytes
  (``even_environments``, runner.Runner), since where a process's stack begins depends on them
  (without randomisation, native-aa's longer name would move its stack in every set);
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

FEATURES = ("pin", "rotate", "launch", "autograd", "threads", "setup", "settle", "clocks")
HASH_SEED = "0"
# Variables that pad a worker's environment (even_environments): BENCH_PAD, BENCH_PAD0, ...
PAD_VARIABLE = "BENCH_PAD"


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
            launcher: Optional[tuple] = None, sysfs=affinity.SYSFS,
            rotation: Optional[int] = None) -> ProcessSet:
    """The set-up of process set ``index`` of workers ``names`` with every feature on but
    ``without``; ``bus_id``: the GPU's (NVML), ``allowed``: this process's CPUs; ``rotation``:
    the step of ``rotate`` (default ``index``; sets.rotation_in)."""
    on = [f for f in FEATURES if f not in without]
    rotation = index if rotation is None else rotation
    env: Dict[str, Dict[str, str]] = {n: {"BENCH_PROCESS": str(index)} for n in names}
    facts: Dict[str, object] = {"index": index, "on": on, "off": list(without)}
    parent: List[int] = []
    if "pin" in on:
        shift = rotation % len(names) if "rotate" in on and names else 0
        order = list(names[shift:]) + list(names[:shift])  # who takes the first CPU set
        placement = affinity.gpu_placement(order, bus_id, allowed, sysfs)
        for name, cpus in placement.workers.items():
            env[name][affinity.CPUS_VARIABLE] = affinity.format_cpulist(cpus)
        parent = placement.parent
        launch = "launch" in on and placement.launch is not None
        for name in names if launch else ():  # the same CPU for every worker
            env[name][affinity.LAUNCH_VARIABLE] = str(placement.launch)
            if "autograd" in on:
                env[name][affinity.AUTOGRAD_VARIABLE] = "1"
        facts["launch_cpu"] = placement.launch if launch else None
        facts["placement"] = (placement.note + (f"; CPU sets rotated by {shift}" if shift else "")
                              + (f"; every block launched from CPU {placement.launch}"
                                 if launch else "")
                              + ("; autograd's threads with it" if launch and "autograd" in on
                                 else ""))
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


def _stack_bytes(argv: Sequence[str], env: Dict[str, str]) -> int:
    """The bytes ``argv`` and ``env`` take at the top of a new process's stack (NUL-ended)."""
    return (sum(len(a.encode()) + 1 for a in argv)
            + sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items()))


def even_environments(argvs: Dict[str, Sequence[str]],
                      envs: Dict[str, Dict[str, str]]) -> Dict[str, Dict[str, str]]:
    """Each worker's environment with padding variables added (PAD_VARIABLE, then PAD_VARIABLE0,
    ...), so that every worker starts with as many argument and environment strings, of as many
    bytes, as every other (the module's docstring, ``setup``)."""
    padded = {n: {**{k: v for k, v in env.items() if not k.startswith(PAD_VARIABLE)},
                  PAD_VARIABLE: ""} for n, env in envs.items()}
    most = max((len(argvs[n]) + len(env) for n, env in padded.items()), default=0)
    for name, env in padded.items():
        for i in range(most - len(argvs[name]) - len(env)):
            env[f"{PAD_VARIABLE}{i}"] = ""
    size = max((_stack_bytes(argvs[n], env) for n, env in padded.items()), default=0)
    for name, env in padded.items():
        env[PAD_VARIABLE] = "x" * (size - _stack_bytes(argvs[name], env))
    return padded

"""Where the worker processes run: each on cores of its own on the GPU's NUMA node.

The GPU's CPUs are its PCI device's ``local_cpulist`` in sysfs (the bus id from NVML, in the
parent, which never touches CUDA); the CPUs a process may use are ``os.sched_getaffinity``'s
(a container's cpuset); hyperthreads of one core stay together (``thread_siblings_list``).
``place`` gives each worker of a process set whole cores of its own there, the parent what is
left over, and names one *launch CPU* (the parent's first; none when no core is spare): every
worker's launching thread runs its blocks there (``launch_cpus``, worker.Worker.block), so both
blocks of a pair run on the same CPU, whatever that CPU's speed then (a virtual machine's CPU can
run at half speed for seconds while its guest sees it busy). With it go PyTorch's autograd
threads (``autograd_threads``, ``move_threads``: they launch the backward pass's kernels while
the launching thread waits, so a training step runs on both); other threads (OpenMP's, a
library's) stay on the worker's own cores. A worker pins itself (``apply``) before it imports
torch, so every thread it starts inherits its CPUs.
Invariant: pure functions of what they are given (``read_*`` only read sysfs, and say where a
list came from), but ``autograd_threads``, which reads /proc, and ``apply``, ``move_threads``
and ``restore_threads``, which set affinities; a machine with fewer cores than workers shares
cores out in turn and says so, never fails; a thread that ends while it is moved is skipped,
never an error; every thread ``move_threads`` moved goes back with ``restore_threads``.
"""

import os
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

SYSFS = Path("/sys")
CPUS_VARIABLE = "BENCH_CPUS"
LAUNCH_VARIABLE = "BENCH_LAUNCH_CPU"
# Set (to 1) when PyTorch's autograd threads go to the launch CPU with the launching thread.
AUTOGRAD_VARIABLE = "BENCH_LAUNCH_AUTOGRAD"
# The name PyTorch gives each autograd device thread (``pt_autograd_0``, ...): they run every
# backward pass's kernel launches while the launching thread waits.
AUTOGRAD_THREAD_PREFIX = "pt_autograd_"
TASKS = Path("/proc/self/task")
THREADS_VARIABLE = "BENCH_THREADS"


def parse_cpulist(text: str) -> List[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]; raises ValueError on anything else."""
    cpus: List[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"cpu list {text!r}: {part} runs backwards")
        cpus += range(first, last + 1)
    return sorted(set(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpulist, in ranges."""
    ordered, parts = sorted(set(cpus)), []
    for cpu in ordered:
        if parts and parts[-1][1] == cpu - 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:19:00.0`` (8-digit domain, upper case) -> sysfs's ``0000:19:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def read_gpu_cpus(bus_id: Optional[str], sysfs: Path = SYSFS) -> Tuple[Optional[List[int]], str]:
    """The CPUs local to the GPU at ``bus_id`` and where that came from (None: unknown)."""
    if not bus_id:
        return None, "no PCI bus id (NVML absent)"
    path = sysfs / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id) / "local_cpulist"
    try:
        return parse_cpulist(path.read_text()), str(path)
    except (OSError, ValueError) as exc:
        return None, f"{path} unreadable ({exc.__class__.__name__})"


def read_cores(cpus: Sequence[int], sysfs: Path = SYSFS) -> List[List[int]]:
    """``cpus`` grouped by physical core (hyperthread siblings together), in order; a CPU whose
    topology cannot be read is a core of its own."""
    cores: List[List[int]] = []
    seen = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        path = sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / \
            "thread_siblings_list"
        try:
            siblings = [c for c in parse_cpulist(path.read_text()) if c in cpus]
        except (OSError, ValueError):
            siblings = [cpu]
        core = sorted(set(siblings) | {cpu})
        seen.update(core)
        cores.append(core)
    return cores


class Placement(NamedTuple):
    """CPUs per worker, the parent's (empty: left as it is), how it was decided, and the launch
    CPU (None: nothing placed)."""

    workers: Dict[str, List[int]]
    parent: List[int]
    note: str
    launch: Optional[int] = None


def place(names: Sequence[str], cores: Sequence[Sequence[int]], where: str) -> Placement:
    """Whole cores of their own for each of ``names`` (as many each as there are for all, one
    core kept for the parent when there is a spare), in order; fewer cores than workers: each
    worker one core, in turn, shared. ``where``: what the cores are (for the note)."""
    if not names or not cores:
        return Placement({}, [], f"not pinned: no cores known ({where})")
    spare = len(cores) > len(names)
    each = max(1, (len(cores) - (1 if spare else 0)) // len(names))
    if len(cores) < len(names):
        workers = {n: list(cores[i % len(cores)]) for i, n in enumerate(names)}
        return Placement(workers, [], f"{len(names)} workers share {len(cores)} cores ({where}); "
                         "no launch CPU (none is spare)")
    workers = {n: sorted(c for core in cores[i * each:(i + 1) * each] for c in core)
               for i, n in enumerate(names)}
    parent = sorted(c for core in cores[len(names) * each:] for c in core)
    # The parent waits while a block runs; without a spare core, a launch CPU would be one
    # worker's, shared with its other threads: none then.
    launch = parent[0] if parent else None
    return Placement(workers, parent,
                     f"{each} core(s) a worker of {len(cores)} ({where})"
                     + ("; the parent on the rest" if parent else "; no launch CPU (none is spare)"),
                     launch)


def gpu_placement(names: Sequence[str], bus_id: Optional[str],
                  allowed: Optional[Iterable[int]] = None, sysfs: Path = SYSFS) -> Placement:
    """``place`` over the cores of the GPU's node that this process may use (all it may use
    when the node is unknown or none of its CPUs are allowed)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    local, source = read_gpu_cpus(bus_id, sysfs)
    usable = [c for c in (local or []) if c in allowed]
    where = f"the GPU's node, {source}"
    if not usable:
        usable = allowed
        where = f"all CPUs allowed; GPU's node: {source if local is None else 'none allowed'}"
    return place(names, read_cores(usable, sysfs), where)


def launch_cpus(environ: Dict[str, str]) -> Optional[List[int]]:
    """The CPUs a worker's launching thread runs its blocks on (BENCH_LAUNCH_CPU; None: its
    own)."""
    text = environ.get(LAUNCH_VARIABLE)
    return parse_cpulist(text) if text else None


def moves_autograd(environ: Dict[str, str]) -> bool:
    """True if the worker's autograd threads go to the launch CPU with its blocks."""
    return environ.get(AUTOGRAD_VARIABLE) == "1"


def autograd_threads(tasks: Path = TASKS) -> List[int]:
    """The thread ids of this process's autograd threads (by their name; none where /proc
    cannot say)."""
    found: List[int] = []
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(AUTOGRAD_THREAD_PREFIX) and entry.name.isdigit():
            found.append(int(entry.name))
    return sorted(found)


def move_threads(tids: Sequence[int], cpus: Sequence[int]) -> Dict[int, Set[int]]:
    """Moves each thread of ``tids`` (0: the calling one) onto ``cpus``; what each had before,
    for ``restore_threads``. A thread that cannot move (it ended meanwhile) is left out; if the
    calling thread cannot, the threads moved before it go back and the error is raised."""
    before: Dict[int, Set[int]] = {}
    for tid in tids:
        try:
            own = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:
            if tid == 0:
                restore_threads(before)
                raise
            continue
        before[tid] = own
    return before


def restore_threads(before: Dict[int, Set[int]]) -> None:
    """Puts every thread ``move_threads`` moved back on its own CPUs: a thread that ended
    meanwhile is skipped; if the calling thread cannot go back, the others still do, then the
    error is raised."""
    failed: Optional[OSError] = None
    for tid, own in before.items():
        try:
            os.sched_setaffinity(tid, own)
        except OSError as exc:
            if tid == 0:
                failed = exc
    if failed is not None:
        raise failed


def apply(environ: Dict[str, str]) -> Optional[List[int]]:
    """In a worker, before torch: pin this process to BENCH_CPUS if set; the CPUs it runs on."""
    text = environ.get(CPUS_VARIABLE)
    if text:
        os.sched_setaffinity(0, parse_cpulist(text))
    return sorted(os.sched_getaffinity(0))

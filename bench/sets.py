"""Process sets: a run's workers, started afresh several times, one set after the other.

Two processes of one configuration can differ by a few percent for their whole life (their
CPUs, their memory layout, what CUDA chose for them), so a run measures every workload in
several *process sets*, each a fresh worker per configuration (runner.Runner), and the
statistics treat the set as a random effect (stats.py). Each set is arranged by isolation.py
(CPUs, threads, the same start), with every setting on but those turned off: ``without`` for all
sets, and ``ablate`` (settings) for every other set (sets 0, 2, 4, ... without them), so that
one run compares the sets without them with the others; in an ablation both kinds of set take
the CPU sets' rotations alike (``rotation_in``).
Invariant: at most one set's workers are alive at a time; each set's workers are closed and the
parent's CPU affinity restored whatever happens in the caller's loop body.
"""

import os
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import affinity, isolation, nvml, protocol, runner
from .configs import NATIVE
from .schedules import preload_modules


def gpu_bus_id(library: Optional[nvml.Nvml], environ: Dict[str, str],
               uuid: Optional[str] = None) -> Optional[str]:
    """The PCI bus id of the GPU the workers use: the one with ``uuid`` (a worker's, once known),
    else the first of CUDA_VISIBLE_DEVICES (a UUID or an index), else device 0."""
    if library is None:
        return None
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not uuid and visible.startswith(("GPU-", "MIG-")):
        uuid = visible
    index = int(visible) if visible.isdigit() else 0
    device = library.handle(uuid, index)
    return library.pci_bus_id(device) if device is not None else None


def off_in(index: int, without: Sequence[str], ablate: Sequence[str] = ()) -> List[str]:
    """The settings turned off in process set ``index`` (module docstring)."""
    off = set(without) | (set(ablate) if index % 2 == 0 else set())
    return [f for f in isolation.FEATURES if f in off]


def rotation_in(index: int, ablate: Sequence[str] = ()) -> int:
    """The step by which process set ``index`` rotates the CPU sets (isolation's ``rotate``):
    its index, or in an ablation the index of its pair of sets, so that the sets with and
    without the ablated settings take every rotation alike (by index, with an even number of
    workers the sets without them would only take even ones)."""
    return index // 2 if ablate else index


def process_sets(
    count: int,
    names: Sequence[str],
    variants: Dict[str, Dict[str, str]],
    environ: Dict[str, str],
    options: runner.Options,
    workloads_of_set,
    sampler: runner.Sampler,
    engine: Optional[str] = None,
    without: Sequence[str] = (),
    ablate: Sequence[str] = (),
    library: Optional[nvml.Nvml] = None,
    log=protocol.progress,
) -> Iterator[Tuple[int, runner.Runner, Dict[str, Any]]]:
    """``(index, live runner, the set's facts)`` for each of ``count`` sets; ``workloads_of_set``:
    index -> the workloads that set runs (what its workers import while starting)."""
    allowed = sorted(os.sched_getaffinity(0))
    uuid = None
    for index in range(count):
        off = off_in(index, without, ablate)
        bus_id = gpu_bus_id(library, environ, uuid)
        arranged = isolation.arrange(list(names), off, index, bus_id, allowed,
                                     rotation=rotation_in(index, ablate))
        os.sched_setaffinity(0, arranged.parent_cpus or allowed)
        quiet = runner.Sampler() if "clocks" in off else sampler
        preload = preload_modules(workloads_of_set(index)) if engine is None else ()
        log(f"=== process set {index + 1}/{count}" + (f" without {', '.join(off)}" if off else "")
            + (f"; {arranged.facts['placement']}" if "placement" in arranged.facts else ""))
        began_s = time.monotonic()
        live = None
        try:
            settle = options._replace(settle="settle" not in off)
            live = runner.Runner(names, variants, environ, settle, quiet, engine, log=log,
                                 preload=preload, worker_env=arranged.env,
                                 launcher=arranged.launcher)
            uuid = live.infos.get(NATIVE, {}).get("device_uuid") or uuid
            if library is not None and uuid and sampler.nvml is not None:
                sampler.device = library.handle(uuid) or sampler.device
            seen = live.infos.get(NATIVE, {}).get("pci_bus_id")
            if seen and bus_id and affinity.sysfs_bus_id(bus_id) != seen:
                log(f"the workers' GPU is at {seen}, not at {bus_id} whose CPUs they run on")
            facts = {**arranged.facts, "gpu_bus_id": bus_id, "worker_gpu_bus_id": seen,
                     "start_s": round(time.monotonic() - began_s, 2),
                     "workers": {n: live.infos.get(n, {"error": live.dead.get(n)}) for n in names},
                     "setup_differs": live.setup_differs}
            yield index, live, facts
        finally:
            if live is not None:
                live.close()
            os.sched_setaffinity(0, allowed)

"""The configurations the benchmark compares and the environment each worker process gets.

Invariant: a configuration is fully described by its entry here (the allocator its worker
installs, the variables added to the worker's environment, the backend torch must then report,
and the configuration its time is paired with); the parent never touches CUDA, and a worker's
environment differs from the parent's only by these settings and PYTHONPATH.
"""

import argparse
import os
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent

NATIVE = "native"
NATIVE_AA = "native-aa"
VARIANT_PREFIX = "streampool:"
PLUGGABLE = "pluggable"
RELEASE_THRESHOLD = "1GiB"
THRESHOLD = f"streampool-threshold-{RELEASE_THRESHOLD}"
VMM_THRESHOLD = f"streampool-vmm-threshold-{RELEASE_THRESHOLD}"
POOL_THRESHOLD = f"streampool-pool-threshold-{RELEASE_THRESHOLD}"


class Config(NamedTuple):
    """``base``: the allocator the worker installs (native, streampool, floor, rmm-pool, rmm-async);
    ``alloc_conf``: PYTORCH_CUDA_ALLOC_CONF (None: unset); ``env``: variables added;
    ``backend``: what torch.cuda.get_allocator_backend() must say; ``reference``: the
    configuration each of its blocks is paired with (its time ratio is to that one)."""

    base: str
    alloc_conf: Optional[str] = None
    env: Tuple[Tuple[str, str], ...] = ()
    backend: str = "native"
    reference: str = NATIVE


CONFIGS: Dict[str, Config] = {
    NATIVE: Config("native", reference=""),
    # The A/A control: native again, as a worker of its own, paired with native like any other.
    NATIVE_AA: Config("native"),
    "expandable": Config("native", alloc_conf="expandable_segments:True"),
    "torch-async": Config(
        "native", alloc_conf="backend:cudaMallocAsync", backend="cudaMallocAsync"
    ),
    # streampool at its defaults, whatever backend the library defaults to; then each backend.
    "streampool": Config("streampool", backend=PLUGGABLE),
    "streampool-pool": Config(
        "streampool", env=(("STREAMPOOL_BACKEND", "pool"),), backend=PLUGGABLE
    ),
    "streampool-vmm": Config("streampool", env=(("STREAMPOOL_BACKEND", "vmm"),), backend=PLUGGABLE),
    # The price of a release threshold: paired with streampool at its default (threshold max).
    THRESHOLD: Config(
        "streampool",
        env=(("STREAMPOOL_RELEASE_THRESHOLD", RELEASE_THRESHOLD),),
        backend=PLUGGABLE,
        reference="streampool",
    ),
    # The same price on each backend named: paired with that backend at its defaults.
    VMM_THRESHOLD: Config(
        "streampool",
        env=(("STREAMPOOL_BACKEND", "vmm"), ("STREAMPOOL_RELEASE_THRESHOLD", RELEASE_THRESHOLD)),
        backend=PLUGGABLE,
        reference="streampool-vmm",
    ),
    POOL_THRESHOLD: Config(
        "streampool",
        env=(("STREAMPOOL_BACKEND", "pool"), ("STREAMPOOL_RELEASE_THRESHOLD", RELEASE_THRESHOLD)),
        backend=PLUGGABLE,
        reference="streampool-pool",
    ),
    # PyTorch's pluggable path with an allocator behind it that does next to nothing
    # (bench/floor/floor.c): what no allocator loaded this way can beat. Single-stream
    # workloads only; BENCH_FLOOR_LIBRARY names its library.
    "pluggable-floor": Config("floor", backend=PLUGGABLE),
    "rmm-pool": Config("rmm-pool", backend=PLUGGABLE),
    "rmm-async": Config("rmm-async", backend=PLUGGABLE),
}
CONFIG_NAMES = tuple(CONFIGS)
# What a run compares unless --configs says otherwise (RMM only where its wheels are carried;
# streampool-vmm is streampool at its default backend, vmm, so it is not run twice). The co-tenant
# and the threshold's price run fixed lists (COTENANT_NAMES, PRICE_CONFIGS), made for a library
# whose default is vmm.
DEFAULT_CONFIGS = (
    NATIVE,
    NATIVE_AA,
    "expandable",
    "torch-async",
    "streampool",
    "streampool-pool",
)
# The price of the threshold (the co-tenant call): GPT-2 with and without it, paired, on both
# backends (the default's, vmm, and the pool).
PRICE_CONFIGS = (NATIVE, NATIVE_AA, "streampool", THRESHOLD, "streampool-pool", POOL_THRESHOLD)


def parse_variant(text: str) -> Tuple[str, Dict[str, str]]:
    """``LABEL:VAR=VALUE[,VAR=VALUE]`` -> (label, {VAR: VALUE}); only STREAMPOOL_* variables."""
    label, sep, settings = text.partition(":")
    env = dict(item.partition("=")[::2] for item in settings.split(",") if item)
    bad = [v for v in env if not v.startswith("STREAMPOOL_") or not env[v]]
    if not sep or not label or not env or bad:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: expected LABEL:STREAMPOOL_VAR=VALUE[,STREAMPOOL_VAR=VALUE...]"
        )
    return label, env


def resolve(name: str, variants: Dict[str, Dict[str, str]]) -> Config:
    """The Config of ``name``: a fixed configuration or a ``streampool:LABEL`` variant."""
    if name.startswith(VARIANT_PREFIX):
        settings = variants[name[len(VARIANT_PREFIX) :]]
        return Config("streampool", env=tuple(sorted(settings.items())), backend=PLUGGABLE)
    return CONFIGS[name]


def pairs_of(names: Sequence[str], variants: Dict[str, Dict[str, str]]) -> List[Tuple[str, str]]:
    """``(reference, config)`` for every configuration in ``names`` but native, in that order.
    Raises ValueError when a configuration's reference is not among ``names``."""
    pairs = []
    for name in names:
        if name == NATIVE:
            continue
        reference = resolve(name, variants).reference
        if reference not in names:
            raise ValueError(f"configuration {name} is paired with {reference}: select it too")
        pairs.append((reference, name))
    return pairs


def worker_environment(config: Config, environ: Dict[str, str]) -> Dict[str, str]:
    """``environ`` with ``config``'s allocator settings and this repository on PYTHONPATH.
    Allocator variables of the parent are dropped: a worker must not measure an allocator other
    than its configuration's."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    }
    if config.alloc_conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = config.alloc_conf
    env.update(dict(config.env))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"  # models are built from configs; never reach for the network
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- the co-tenant's configurations of process A ----------------------------------------------


class CotenantConfig(NamedTuple):
    """Process A of the co-tenant workload: a Config, and whether A calls empty_cache() before
    idling."""

    config: Config
    empty_cache: bool = False


COTENANT_CONFIGS: Dict[str, CotenantConfig] = {
    NATIVE: CotenantConfig(CONFIGS[NATIVE]),
    "native+empty_cache": CotenantConfig(CONFIGS[NATIVE], empty_cache=True),
    "expandable": CotenantConfig(CONFIGS["expandable"]),
    "torch-async": CotenantConfig(CONFIGS["torch-async"]),
    "streampool": CotenantConfig(CONFIGS["streampool"]),
    THRESHOLD: CotenantConfig(CONFIGS[THRESHOLD]),
    "streampool-pool": CotenantConfig(CONFIGS["streampool-pool"]),
    POOL_THRESHOLD: CotenantConfig(CONFIGS[POOL_THRESHOLD]),
}
# What the co-tenant call runs as A (every one, whatever --configs says): streampool at its
# defaults (vmm) and on the pool, each with and without a threshold.
COTENANT_NAMES = tuple(COTENANT_CONFIGS)

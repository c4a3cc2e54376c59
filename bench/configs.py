"""The configurations the benchmark compares and the environment each child process gets.

Invariant: a configuration is fully described by its entry here (the allocator its child installs,
the variables added to the child's environment, the backend torch must then report, and the
workloads it runs); the parent never touches CUDA, and a child's environment differs from the
parent's only by these settings and PYTHONPATH.
"""

import argparse
import os
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent

NATIVE = "native"
NATIVE_AA = "native-aa"
VARIANT_PREFIX = "streampool:"


class Config(NamedTuple):
    """``base``: the allocator the child installs (native, streampool, rmm-pool, rmm-async);
    ``alloc_conf``: PYTORCH_CUDA_ALLOC_CONF (None: unset); ``env``: variables added;
    ``backend``: what torch.cuda.get_allocator_backend() must say; ``workloads``: the only timed
    workloads it runs (None: all that were selected)."""

    base: str
    alloc_conf: Optional[str] = None
    env: Tuple[Tuple[str, str], ...] = ()
    backend: str = "native"
    workloads: Optional[Tuple[str, ...]] = None


STREAMPOOL_BACKEND = "pluggable"
CONFIGS: Dict[str, Config] = {
    NATIVE: Config("native"),
    # The A/A control: native again, as a configuration of its own in every repeat.
    NATIVE_AA: Config("native"),
    "expandable": Config("native", alloc_conf="expandable_segments:True"),
    "torch-async": Config(
        "native", alloc_conf="backend:cudaMallocAsync", backend="cudaMallocAsync"
    ),
    "streampool": Config("streampool", backend=STREAMPOOL_BACKEND),
    # The virtual-memory backend; a library that rejects the value fails this child's set-up.
    "streampool-vmm": Config(
        "streampool", env=(("STREAMPOOL_BACKEND", "vmm"),), backend=STREAMPOOL_BACKEND
    ),
    # The pool alone, no cache: which layer costs memory on churn and multistream.
    "streampool-nocache": Config(
        "streampool",
        env=(("STREAMPOOL_CACHE_MAX_BLOCK", "0"),),
        backend=STREAMPOOL_BACKEND,
        workloads=("churn", "multistream"),
    ),
    "rmm-pool": Config("rmm-pool", backend=STREAMPOOL_BACKEND),
    "rmm-async": Config("rmm-async", backend=STREAMPOOL_BACKEND),
}
CONFIG_NAMES = tuple(CONFIGS)


def parse_variant(text: str) -> Tuple[str, Dict[str, str]]:
    """``LABEL:VAR=VALUE[,VAR=VALUE]`` -> (label, {VAR: VALUE}); only STREAMPOOL_* variables."""
    label, sep, settings = text.partition(":")
    env = dict(item.partition("=")[::2] for item in settings.split(",") if item)
    bad = [v for v in env if not v.startswith("STREAMPOOL_") or not env[v]]
    if not sep or not label or not env or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected LABEL:STREAMPOOL_VAR=VALUE[,STREAMPOOL_VAR=VALUE...]"
        )
    return label, env


def variant_config(settings: Dict[str, str]) -> Config:
    """streampool with ``settings`` added, on every selected workload."""
    return Config("streampool", env=tuple(sorted(settings.items())), backend=STREAMPOOL_BACKEND)


def resolve(name: str, variants: Dict[str, Dict[str, str]]) -> Config:
    """The Config of ``name``: a fixed configuration or a ``streampool:LABEL`` variant."""
    if name.startswith(VARIANT_PREFIX):
        return variant_config(variants[name[len(VARIANT_PREFIX) :]])
    return CONFIGS[name]


def workloads_of(config: Config, selected: Sequence[str]) -> List[str]:
    """The selected timed workloads that ``config`` runs, in the selected order."""
    if config.workloads is None:
        return list(selected)
    return [w for w in selected if w in config.workloads]


def child_environment(config: Config, environ: Dict[str, str]) -> Dict[str, str]:
    """``environ`` with ``config``'s allocator settings and this repository on PYTHONPATH (the
    child runs ``python3 -m bench.child``). Allocator variables of the parent are dropped: a
    child must not measure an allocator other than its configuration's."""
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


RELEASE_THRESHOLD = "1GiB"
COTENANT_CONFIGS: Dict[str, CotenantConfig] = {
    NATIVE: CotenantConfig(CONFIGS[NATIVE]),
    "native+empty_cache": CotenantConfig(CONFIGS[NATIVE], empty_cache=True),
    "expandable": CotenantConfig(CONFIGS["expandable"]),
    "torch-async": CotenantConfig(CONFIGS["torch-async"]),
    "streampool": CotenantConfig(CONFIGS["streampool"]),
    f"streampool-threshold-{RELEASE_THRESHOLD}": CotenantConfig(
        Config(
            "streampool",
            env=(("STREAMPOOL_RELEASE_THRESHOLD", RELEASE_THRESHOLD),),
            backend=STREAMPOOL_BACKEND,
        )
    ),
    "streampool-vmm": CotenantConfig(CONFIGS["streampool-vmm"]),
}
# Which of the main run's configurations brings which co-tenant configurations along.
COTENANT_FOR = {
    NATIVE: (NATIVE, "native+empty_cache"),
    "expandable": ("expandable",),
    "torch-async": ("torch-async",),
    "streampool": ("streampool", f"streampool-threshold-{RELEASE_THRESHOLD}"),
    "streampool-vmm": ("streampool-vmm",),
}
COTENANT_QUICK = (NATIVE, "streampool", f"streampool-threshold-{RELEASE_THRESHOLD}")


def cotenant_configs(configs: Sequence[str], quick: bool) -> List[str]:
    """The co-tenant configurations of A for the selected main configurations."""
    names = [name for config in configs for name in COTENANT_FOR.get(config, ())]
    return [name for name in names if not quick or name in COTENANT_QUICK]

"""Made-up raw results of calls for the report tests (never written outside a test's tmp_path)."""

import numpy

from bench import configs

GIB = 2**30


def memory_pass(peak_gib, live_gib=None, source="mem_get_info"):
    return {
        "build_s": 1.0,
        "step_s": 0.05,
        "timed_steps": 10,
        "units_per_cycle": 10,
        "unit": "step",
        "memory_source": source,
        "peak_device_bytes": int(peak_gib * GIB),
        "peak_live_bytes": None if live_gib is None else int(live_gib * GIB),
        "settled_bytes": GIB,
    }


def pairs(config, ratio, n, seed, sd=0.01, ref="native", throttled=0):
    rng = numpy.random.default_rng(seed)
    out = []
    for r in range(n):
        ref_s = 0.2 * (1 + 0.1 * r)  # drift: paired ratios do not see it
        out.append({
            "config": config, "ref": ref, "ref_first": r % 2 == 0, "round": r, "stage": 0,
            "config_s": ref_s * ratio * float(numpy.exp(rng.normal(0, sd))), "ref_s": ref_s,
            "config_idle_s": 0.3, "ref_idle_s": 0.1, "units": 4, "gpu": [None, None],
            "throttled": r < throttled,
        })
    return out


def workload(name, ratios, memory, failed=None, n=20, seed=0, live_gib=10.0):
    """``ratios``: {config: time ratio}; ``memory``: {config: peak GiB} (native's live
    ``live_gib``); ``failed``: {config: error}."""
    prepared = {c: memory_pass(m, live_gib if c == "native" else None) for c, m in memory.items()}
    record = {"workload": name, "prepare": prepared, "failed": dict(failed or {}), "pairs": [],
              "stages": [], "steps_per_block": 4, "block_s": 0.2}
    for index, (config, ratio) in enumerate(ratios.items()):
        known = configs.CONFIGS.get(config)
        ref = known.reference if known is not None and known.reference else "native"
        record["pairs"] += pairs(config, ratio, n, seed + index, ref=ref)
    return record


def call(workloads, command="python3 -m bench --group models", cotenant=(), release_s=2.0):
    return {
        "facts": {"command": command, "date": "2026-11-25 10:00 UTC", "driver": "580.65.06",
                  "block_s": 0.2, "pairs": 20, "idle_release_s": release_s,
                  "nvml": "clocks and power"},
        "workers": {"native": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                               "cuda": "13.0"},
                    "streampool": {"device": "NVIDIA H100 80GB HBM3",
                                   "streampool_version": "0.1.0"}},
        "workloads": list(workloads),
        "cotenant": list(cotenant),
    }


def trial(config, held_gib, live_gib=1.5, confirmed=True, empty_cache=False, error=None):
    if error:
        return {"config": config, "round": 0, "error": error}
    start = 70 * GIB
    probes = [
        {"idle_s": at, "free_bytes": int(start - (held_gib + live_gib) * GIB),
         "tried_bytes": int(start - (held_gib + live_gib + 0.25) * GIB), "confirmed": confirmed,
         "error": None, "held_beyond_live_bytes": int(held_gib * GIB)}
        for at in (0.5, 3.0, 10.0)
    ]
    return {"config": config, "round": 0, "probes": probes, "live_bytes": int(live_gib * GIB),
            "free_before_bytes": 75 * GIB, "free_bytes_at_start": start,
            "empty_cache_called": empty_cache, "wall_s": 20.0}

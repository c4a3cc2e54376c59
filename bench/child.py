"""A child process: one configuration's allocator, every selected workload, results on stdout.

``python3 -m bench.child --base streampool --backend pluggable --workloads churn,gpt2``
(the parent starts it; the allocator's settings come in the environment).

Invariant: the allocator is installed before CUDA starts and checked (torch must report the
configuration's backend; a streampool child refuses STREAMPOOL_* variables its library does not
read, so a misspelt or not-yet-supported setting fails instead of measuring the default); each
workload is measured on its fixed schedule, host time and GPU time summed over the timed steps
only, memory read after every step; one workload failing loses no other.
"""

import argparse
import gc
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import protocol, workloads
from . import schedules as s
from .configs import CONFIGS

RMM_BASES = ("rmm-pool", "rmm-async")


class Skipped(Exception):
    """The configuration cannot run on this machine (its package is not installed)."""


def unknown_streampool_variables(environ: Dict[str, str], known: Iterable[str]) -> List[str]:
    """The STREAMPOOL_* variables in ``environ`` neither in ``known`` nor the library path."""
    known = set(known) | {"STREAMPOOL_LIBRARY"}
    return sorted(n for n in environ if n.startswith("STREAMPOOL_") and n not in known)


def check_streampool_variables(environ: Dict[str, str]) -> None:
    """Raise RuntimeError naming any STREAMPOOL_* variable in ``environ`` that the streampool
    package does not list as one its library reads (``_config.VARIABLE_DEFAULTS``)."""
    try:
        from streampool._config import VARIABLE_DEFAULTS
    except ImportError:  # a package without the table: nothing to check against
        return
    unknown = unknown_streampool_variables(environ, VARIABLE_DEFAULTS)
    if unknown:
        raise RuntimeError(
            f"this streampool does not read {', '.join(unknown)}: the run would measure its "
            "default instead"
        )


def _rmm_resource(rmm: Any, base: str) -> Any:
    if base == "rmm-pool":
        return rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())
    return rmm.mr.CudaAsyncMemoryResource()


def install_allocator(base: str) -> Callable[[], None]:
    """Make ``base``'s allocator PyTorch's, before CUDA starts. Returns what must run once the
    CUDA context exists (RMM's memory resource is created then, so that the memory it takes up
    front counts as held by it). Raises Skipped when RMM is not installed."""
    if base == "streampool":
        check_streampool_variables(dict(os.environ))
        import streampool

        streampool.install()
    if base not in RMM_BASES:
        return lambda: None
    try:
        import rmm
    except ImportError as exc:
        raise Skipped(f"rmm is not importable ({exc})") from exc
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    if rmm_torch_allocator is None:
        raise RuntimeError(
            "rmm.allocators.torch.rmm_torch_allocator is None (rmm sees no CUDA torch)"
        )
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    return lambda: rmm.mr.set_current_device_resource(_rmm_resource(rmm, base))


def warm_up_libraries(torch: Any) -> None:
    """Create the cuBLAS and cuDNN handles (device memory outside any allocator) before the first
    workload, so that no workload's memory includes them."""
    matrix = torch.randn(256, 256, device="cuda")
    images = torch.randn(2, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    torch.mm(matrix, matrix)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.mm(matrix, matrix)
        torch.nn.functional.conv2d(images, torch.randn(8, 3, 3, 3, device="cuda"))
    torch.mm(matrix.half(), matrix.half())
    torch.cuda.synchronize()


def release_memory(torch: Any) -> None:
    """Drop garbage and return cached memory, as between workloads."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def child_info(torch: Any, base: str) -> Dict[str, Any]:
    info = {
        "device": torch.cuda.get_device_name(0),
        "device_total_bytes": torch.cuda.mem_get_info()[1],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "streampool_variables": {
            k: v
            for k, v in os.environ.items()
            if k.startswith("STREAMPOOL_") and k != "STREAMPOOL_LIBRARY"
        },
    }
    if base == "streampool":
        import streampool

        info["streampool_version"] = streampool.__version__
        info["streampool_library"] = streampool.library_path()
    return info


def set_up(base: str, backend: str) -> Tuple[Any, int, Dict[str, Any]]:
    """Install the allocator, start CUDA, check the backend, warm the libraries up. Returns torch,
    the free device memory (bytes) before the allocator took any, and the child's facts."""
    finish = install_allocator(base)
    import torch

    baseline_free_bytes = torch.cuda.mem_get_info()[0]
    finish()
    info = child_info(torch, base)
    if info["allocator_backend"] != backend:
        raise RuntimeError(
            f"allocator backend is {info['allocator_backend']!r}, expected {backend!r}"
        )
    warm_up_libraries(torch)
    release_memory(torch)
    return torch, baseline_free_bytes, info


def time_schedule(
    torch: Any, step: workloads.Step, schedule: s.Schedule, device: str, start_free_bytes: int
) -> Dict[str, Any]:
    """Run every step of ``schedule``, each between two synchronisations, with CUDA events around
    it on the current stream. Returns the timed steps' summed host and GPU times (seconds) and the
    peak device memory used since the start (bytes), read after every step, warm-up included.
    On the CPU (smoke tests) GPU time is host time and memory is not read."""
    on_cuda = device == "cuda"
    synchronize = torch.cuda.synchronize if on_cuda else (lambda: None)
    if on_cuda:
        start_event = torch.cuda.Event(enable_timing=True)
        end_event = torch.cuda.Event(enable_timing=True)
    host_time_s = gpu_time_s = 0.0
    peak_device_bytes = 0
    synchronize()
    for index, params in enumerate(schedule.steps):
        started_s = time.perf_counter()
        if on_cuda:
            start_event.record()
        step(params)
        if on_cuda:
            end_event.record()
        synchronize()
        elapsed_s = time.perf_counter() - started_s
        if index >= schedule.warmup:
            host_time_s += elapsed_s
            gpu_time_s += start_event.elapsed_time(end_event) / 1e3 if on_cuda else elapsed_s
        if on_cuda:
            peak_device_bytes = max(
                peak_device_bytes, start_free_bytes - torch.cuda.mem_get_info()[0]
            )
    return {
        "host_time_s": host_time_s,
        "gpu_time_s": gpu_time_s,
        "peak_device_bytes": peak_device_bytes,
        "timed_steps": len(schedule.steps) - schedule.warmup,
        "units": schedule.timed_units,
        "unit": schedule.unit,
    }


STREAMPOOL_COUNTERS = (
    "allocation.all.allocated",
    "cache_hits",
    "num_device_alloc",
    "num_growth_syncs",
    "num_alloc_retries",
    "num_ooms",
)


def streampool_record(before: Dict[str, int]) -> Dict[str, Any]:
    """streampool's own view of a workload since ``before`` (its memory_stats() at the start):
    peak live bytes above the start (a cross-check of native's), counters, what it held at the
    end. A counter the library no longer has is left out, not fatal."""
    import streampool

    after = streampool.memory_stats()
    record = {k: after[k] - before[k] for k in STREAMPOOL_COUNTERS if k in after and k in before}
    if "allocated_bytes.all.peak" in after:
        record["peak_live_bytes"] = (
            after["allocated_bytes.all.peak"] - before["allocated_bytes.all.current"]
        )
    for key, name in (
        ("reserved_bytes.all.current", "reserved_bytes_at_end"),
        ("cached_bytes", "cached_bytes_at_end"),
    ):
        if key in after:
            record[name] = after[key]
    return record


def start_live_tracking(torch: Any, base: str, backend: str) -> Callable[[], Dict[str, Any]]:
    """Reset the allocator's peak statistics where it keeps them (PyTorch's caching allocator,
    streampool); returns what gives the workload's record fields from them at its end. Only
    native's peak live bytes enter a ratio; torch's cudaMallocAsync backend is left alone."""
    if base == "native" and backend == "native":
        torch.cuda.reset_peak_memory_stats()
        live_at_start_bytes = torch.cuda.memory_allocated()
        return lambda: {"peak_live_bytes": torch.cuda.max_memory_allocated() - live_at_start_bytes}
    if base == "streampool":
        import streampool

        streampool.reset_peak_memory_stats()
        before = streampool.memory_stats()
        return lambda: {"streampool": streampool_record(before)}
    return lambda: {}


def run_workload(
    torch: Any, base: str, backend: str, workload: str, baseline_free_bytes: int
) -> Dict[str, Any]:
    """Measure one workload in this (already set up) child process."""
    start_free_bytes = torch.cuda.mem_get_info()[0]
    record: Dict[str, Any] = {"held_at_start_bytes": baseline_free_bytes - start_free_bytes}
    live_fields = start_live_tracking(torch, base, backend)
    built_s = time.perf_counter()
    step = workloads.build(torch, workload, "cuda")
    record["build_s"] = time.perf_counter() - built_s
    record.update(time_schedule(torch, step, s.build_schedule(workload), "cuda", start_free_bytes))
    record.update(live_fields())
    return record


def record_text(record: Dict[str, Any]) -> str:
    if "error" in record:
        return f"failed: {record['error']}"
    per_unit = record["host_time_s"] / record["units"]
    factor, text = s.UNIT_SCALE[record["unit"]]
    return (
        f"{per_unit * factor:.3f} {text} "
        f"(GPU {record['gpu_time_s'] / record['units'] * factor:.3f}), "
        f"peak device used {record['peak_device_bytes'] / 2**20:.1f} MiB"
    )


def child_main(base: str, backend: str, names: Sequence[str]) -> int:
    """Measure ``base`` on ``names``; one message per workload on stdout."""
    try:
        torch, baseline_free_bytes, info = set_up(base, backend)
    except Skipped as exc:
        protocol.emit("skipped", reason=str(exc))
        return 0
    except Exception as exc:  # reported to the parent, which goes on with other configurations
        traceback.print_exc()
        protocol.emit("setup_error", reason=protocol.exception_text(exc))
        return 0
    protocol.emit("info", info=info)
    for workload in names:
        protocol.progress(f"{workload}: running")
        try:
            record = run_workload(torch, base, backend, workload, baseline_free_bytes)
        except Exception as exc:  # one workload failing (OOM, ...) must not lose the others
            traceback.print_exc()
            record = {"error": protocol.exception_text(exc)}
        protocol.progress(f"{workload}: {record_text(record)}")
        protocol.emit("workload", workload=workload, record=record)
        release_memory(torch)  # raises if the CUDA context died: the parent blames the rest
    return 0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m bench.child")
    parser.add_argument("--base", required=True, choices=sorted({c.base for c in CONFIGS.values()}))
    parser.add_argument("--backend", required=True)
    parser.add_argument("--workloads", required=True, type=lambda t: [w for w in t.split(",") if w])
    options = parser.parse_args(argv)
    unknown = [w for w in options.workloads if w not in s.TIMED_WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}")
    return options


def command(base: str, backend: str, names: Sequence[str]) -> list:
    """argv of the child that measures ``base`` (expecting ``backend``) on ``names``."""
    return [
        sys.executable,
        "-m",
        "bench.child",
        "--base",
        base,
        "--backend",
        backend,
        "--workloads",
        ",".join(names),
    ]


if __name__ == "__main__":
    options = parse_args(sys.argv[1:])
    sys.exit(child_main(options.base, options.backend, options.workloads))

"""The worker's torch side: install the allocator, start CUDA, build workloads, read memory.

Invariant: the allocator is installed before CUDA starts and checked (torch must report the
configuration's backend; a streampool worker refuses STREAMPOOL_* variables its package does not
list, so a misspelt or unsupported setting fails instead of measuring the default). Memory is
read two ways after every step of a memory pass: free device memory (``mem_get_info``, which sees
every process) and this process's own use from NVML where the driver lists it (absent in many
containers); the worker says which one its figures come from. Every worker sets CUDA up the same
way, in the same order (``set_up``): its intra-op threads capped where BENCH_THREADS says, the
device chosen explicitly, cuDNN's benchmark mode off, the libraries' handles created;
``settings`` lists what is in force, for the set-up fingerprint. A block's GPU time comes from
CUDA events recorded around each step (``block_timer``; made once per worker, reused).
"""

import gc
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import nvml, workloads
from . import schedules as s
from .worker import Skipped

RMM_BASES = ("rmm-pool", "rmm-async")
THREADS_VARIABLE = "BENCH_THREADS"
# The floor allocator's library (bench/floor/floor.c, built by bench/floor/build).
FLOOR_VARIABLE = "BENCH_FLOOR_LIBRARY"


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


def install_allocator(base: str) -> Callable[[], None]:
    """Make ``base``'s allocator PyTorch's, before CUDA starts. Returns what must run once the
    CUDA context exists (RMM's memory resource). Raises Skipped when RMM is not installed."""
    if base == "streampool":
        check_streampool_variables(dict(os.environ))
        import streampool

        streampool.install()
    if base == "floor":
        install_floor()
    if base not in RMM_BASES:
        return lambda: None
    try:
        import rmm
    except ImportError as exc:
        raise Skipped(f"rmm is not importable ({exc})") from exc
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    if base == "rmm-pool":
        resource = lambda: rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())  # noqa: E731
    else:
        resource = rmm.mr.CudaAsyncMemoryResource
    return lambda: rmm.mr.set_current_device_resource(resource())


def install_floor() -> None:
    """The floor allocator through PyTorch's CUDAPluggableAllocator, from BENCH_FLOOR_LIBRARY.
    Raises Skipped when the variable is unset or names no file."""
    path = os.environ.get(FLOOR_VARIABLE, "")
    if not path or not os.path.isfile(path):
        raise Skipped(f"{FLOOR_VARIABLE} names no library ({path!r}): run bench/floor/build")
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "floor_malloc", "floor_free")
    torch.cuda.memory.change_current_allocator(allocator)


def fixed_settings(torch: Any, threads: Optional[str]) -> Dict[str, Any]:
    """Before CUDA starts: cap the intra-op threads at ``threads`` (None: torch's default), choose
    device 0, turn cuDNN's benchmark mode off (its default, set so that nothing inherited can
    differ); what is in force, for the set-up fingerprint (the TF32 flags are read, not set:
    newer torch refuses a mix of their old and new settings)."""
    if threads:
        torch.set_num_threads(int(threads))
    torch.cuda.set_device(0)
    torch.backends.cudnn.benchmark = False

    def read(get: Callable[[], Any]) -> Any:
        try:
            return get()
        except Exception as exc:  # a setting this torch does not have, or will not say
            return f"unreadable: {exc.__class__.__name__}"

    return {
        "intra_op_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_precision": read(torch.get_float32_matmul_precision),
        "cudnn": read(torch.backends.cudnn.version),
    }


def pci_address(properties: Any) -> Optional[str]:
    """``0000:19:00.0`` from torch's device properties (None where torch does not say)."""
    parts = [getattr(properties, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(p is None for p in parts):
        return None
    return f"{parts[0]:04x}:{parts[1]:02x}:{parts[2]:02x}.0"


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
    torch.empty(16, dtype=torch.uint8, device="cuda").fill_(1)  # load the fill kernel
    torch.cuda.synchronize()


class EventTimer:
    """The GPU time of a block's steps: a pair of CUDA events (timing on) around each step's
    launch, on the current stream, read once the block has synchronised. The events are made
    once per worker and reused (``events``), so a block creates none."""

    def __init__(self, events: List[Tuple[Any, Any]], count: int) -> None:
        self.pairs = events[:count]

    def start(self, k: int) -> None:
        self.pairs[k][0].record()

    def stop(self, k: int) -> None:
        self.pairs[k][1].record()

    def seconds(self) -> float:
        """Sum over steps of start -> stop on the GPU (the stream's work of the step, and any
        wait in it for the host's launches)."""
        return sum(start.elapsed_time(stop) for start, stop in self.pairs) / 1000.0


class CudaEngine:
    """What a worker needs from torch (worker.py calls these)."""

    def __init__(self, base: str, backend: str) -> None:
        self.base, self.backend = base, backend
        self.torch: Any = None
        self.nvml: Optional[nvml.Nvml] = None
        self.device: Any = None
        self.compiled = False
        self.events: List[Tuple[Any, Any]] = []

    def set_up(self) -> Dict[str, Any]:
        finish = install_allocator(self.base)
        import torch

        self.torch = torch
        settings = fixed_settings(torch, os.environ.get(THREADS_VARIABLE))
        free_bytes, total_bytes = torch.cuda.mem_get_info()  # starts CUDA
        finish()
        properties = torch.cuda.get_device_properties(0)
        uuid = str(getattr(properties, "uuid", "") or "")
        self.nvml = nvml.Nvml.open()
        self.device = self.nvml.handle(uuid) if self.nvml else None
        info = {
            "device": properties.name,
            "device_uuid": uuid,
            "device_total_bytes": total_bytes,
            "free_bytes_at_start": free_bytes,
            "pid": os.getpid(),
            "baseline_process_bytes": self.memory()["process_bytes"],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "allocator_backend": torch.cuda.get_allocator_backend(),
            "settings": settings,
            "pci_bus_id": pci_address(properties),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "streampool_variables": {
                k: v
                for k, v in os.environ.items()
                if k.startswith("STREAMPOOL_") and k != "STREAMPOOL_LIBRARY"
            },
        }
        if info["allocator_backend"] != self.backend:
            raise RuntimeError(
                f"allocator backend is {info['allocator_backend']!r}, expected {self.backend!r}"
            )
        if self.base == "streampool":
            import streampool

            info["streampool_version"] = streampool.__version__
            info["streampool_library"] = os.path.relpath(streampool.library_path())
        warm_up_libraries(torch)
        self.settle()
        return info

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def block_timer(self, count: int) -> EventTimer:
        """A timer of the GPU time of ``count`` steps (worker.Worker.block)."""
        event = self.torch.cuda.Event
        while len(self.events) < count:
            self.events.append((event(enable_timing=True), event(enable_timing=True)))
        return EventTimer(self.events, count)

    def memory(self) -> Dict[str, Optional[int]]:
        """Free device memory, and this process's device memory where NVML lists it."""
        process_bytes = None
        if self.nvml is not None and self.device is not None:
            used = self.nvml.process_used_bytes(self.device)
            process_bytes = None if used is None else used.get(os.getpid())
        return {"free_bytes": self.torch.cuda.mem_get_info()[0], "process_bytes": process_bytes}

    def allocator_stats(self) -> Any:
        """The module whose ``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``
        and ``reset_peak_memory_stats`` describe the worker's allocator: ``torch.cuda`` under
        PyTorch's own caching allocator (expandable segments or not), ``streampool`` under it;
        None for the others (cudaMallocAsync, RMM), whose figures are not read."""
        if self.base == "native" and self.backend == "native":
            return self.torch.cuda
        if self.base == "streampool":
            import streampool

            return streampool
        return None

    def idle_reserved_bytes(self) -> Optional[int]:
        """What the allocator holds beyond its live bytes now (None where it is not read)."""
        stats = self.allocator_stats()
        return None if stats is None else stats.memory_reserved() - stats.memory_allocated()

    def track_live(self) -> Callable[[], Optional[int]]:
        """Resets the peak of live tensor bytes where the allocator keeps it (PyTorch's caching
        allocator; streampool, as a cross-check); returns what reads the peak above now."""
        stats = self.allocator_stats()
        if stats is None:
            return lambda: None
        stats.reset_peak_memory_stats()
        start = stats.memory_allocated()
        return lambda: stats.max_memory_allocated() - start

    def build(self, workload: str) -> Tuple[Any, s.Schedule]:
        self.compiled = self.compiled or workload == "compiled"
        return workloads.build(self.torch, workload, "cuda"), s.build_schedule(workload)

    def forget(self) -> None:
        """torch.compile keeps compiled code and CUDA-graph memory past the step function."""
        if self.compiled:
            self.torch._dynamo.reset()
            self.compiled = False

    def settle(self) -> None:
        """Drop garbage and return cached memory (the workload's live tensors stay)."""
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        self.torch.cuda.synchronize()

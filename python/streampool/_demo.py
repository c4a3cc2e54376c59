"""``python -m streampool demo``: one sequence of allocations, on a GPU through PyTorch when there
is one, otherwise through the simulated driver via ctypes (host memory stands in for the GPU's).

On the GPU: tensors from 1 B to 4 GiB on the default stream and on a side stream, each filled with
a known pattern and every byte checked (sizes that do not fit are skipped with a note); a tensor
used on a side stream, kept alive there by record_stream, freed early and its memory reused; a few
training steps of a small MLP; a 10 TB request that must raise "CUDA out of memory.", then one
more checked tensor. The simulated driver runs the same allocation pattern without the data
checks and the out-of-memory step, on the pool backend unless STREAMPOOL_BACKEND names one (the
first lines say so: a simulated GPU finishes its work only when the program synchronises, which
the default backend's idle release waits for and never does). Statistics are printed while each
phase holds its memory.
Then the idle release: every tensor freed, the memory streampool keeps for reuse is shown, and
the demo makes no call but reading statistics until it goes back to the device, about
STREAMPOOL_IDLE_RELEASE (2 s) after the last free; a memory summary ends it.
Invariant: the exit status is 0 only if the memory held after the last free was given back
within IDLE_GRACE_S of the idle-release delay (or idle release is off, which the demo says).
"""

import os
import time
from typing import Any, Callable, List, Optional, Tuple

import streampool

from . import _lib
from ._config import VARIABLE_DEFAULTS
from ._stats import format_bytes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TENSOR_SIZES = (512, 1 * MiB, 64 * MiB, 256 * MiB)  # bytes, simulated driver
GPU_CHECKED_SIZES = (1, 511, 4 * KiB, 1 * MiB, 64 * MiB, 1 * GiB, 4 * GiB)  # bytes
PATTERN_PERIOD = 251  # byte i of a checked tensor holds i % 251
PATTERN_CHUNK = PATTERN_PERIOD << 18  # bytes filled and compared at a time: whole periods, ~63 MiB
HEADROOM_BYTES = 512 * MiB  # kept free when deciding whether a size fits
AFTER_OOM_BYTES = 64 * MiB
OOM_REQUEST_BYTES = 10 * 10**12  # 10 TB
SIDE_STREAM_TENSOR_BYTES = 32 * MiB
MLP_BATCH, MLP_IN, MLP_HIDDEN, MLP_OUT = 256, 1024, 4096, 1024
TRAINING_STEPS = 5
FLOAT_BYTES = 4
SIM_SIDE_STREAM = 0x5151  # an arbitrary non-zero stream handle for the simulated driver
IDLE_RELEASE_DEFAULT_S = 2.0  # STREAMPOOL_IDLE_RELEASE's default
# The backend of the demo on the simulated driver where STREAMPOOL_BACKEND is not set: see
# simulated_vmm for why not the default.
SIM_DEMO_BACKEND = "pool"
IDLE_GRACE_S = 3.0  # beyond the delay: the background thread's tick, a synchronisation
IDLE_POLL_S = 0.25
# A release may come in steps (blocks that waited for another stream come back at the background
# thread's next tick, 50 ms later): the demo reports it once the reserved bytes are 0 or have not
# moved for this long.
IDLE_SETTLE_S = 0.5


def _print_phase(name: str) -> None:
    """One line of statistics, read while the phase holds its memory."""
    s = streampool.memory_stats()
    print(
        f"{name:<30} allocated {format_bytes(s['allocated_bytes.all.current']):>10}"
        f"  reserved {format_bytes(s['reserved_bytes.all.current']):>10}"
        f"  cached {format_bytes(s['cached_bytes']):>10}"
        f"  cache hits {s['cache_hits']}"
    )


def idle_release_s(environ=os.environ) -> Optional[float]:
    """STREAMPOOL_IDLE_RELEASE in seconds (None: off). The library has checked the value
    (check_config) before this reads it."""
    text = environ.get("STREAMPOOL_IDLE_RELEASE", "").strip().lower()
    if not text:
        return IDLE_RELEASE_DEFAULT_S
    if text in ("off", "never", "0"):
        return None
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.rstrip("s"))


def simulated_vmm() -> bool:
    """The vmm backend on the simulated driver, whose work completes only at a synchronisation:
    the vmm backend's idle release never makes one (a GPU's work completes by itself), so there
    it gives nothing back."""
    backend = os.environ.get("STREAMPOOL_BACKEND", VARIABLE_DEFAULTS["STREAMPOOL_BACKEND"])
    return _lib.driver_name() == "sim" and backend.strip().lower() == "vmm"


def show_idle_release(settle: Callable[[], None] = lambda: None,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> bool:
    """Every tensor is freed: print what streampool still holds, then wait without an allocation
    or a free (reading statistics is neither) until it goes back to the device; True if it did
    within the delay and IDLE_GRACE_S (or idle release is off, or cannot show here:
    simulated_vmm). ``settle``: what must run first (the GPU's synchronisation)."""
    settle()
    _lib.check_config()
    delay_s = idle_release_s()
    held = streampool.memory_reserved()
    _print_phase("every tensor freed")
    if delay_s is None:
        print("idle release is off (STREAMPOOL_IDLE_RELEASE): streampool keeps "
              f"{format_bytes(held)} until empty_cache() or the end of the process")
        return True
    if simulated_vmm():
        print("the idle release is not shown on the simulated driver with the vmm backend:\n"
              "  a simulated GPU finishes its work only when the program synchronises, and vmm's\n"
              "  idle release never does (a GPU finishes by itself); the pool backend shows it")
        return True
    if held == 0:
        print("nothing held after the last free: nothing to give back")
        return True
    print(f"waiting with no allocation and no free: streampool gives what it holds back to the "
          f"device after {delay_s:g} s idle (STREAMPOOL_IDLE_RELEASE)")
    start = clock()
    next_line_s = 0.5
    while True:
        sleep(IDLE_POLL_S)
        idle_s = clock() - start
        reserved = streampool.memory_reserved()
        if reserved < held:
            reserved = _settled(reserved, clock, sleep, start + delay_s + IDLE_GRACE_S)
            idle_s = clock() - start
            print(f"  idle {idle_s:4.1f} s: reserved {format_bytes(reserved)}: "
                  f"{format_bytes(held - reserved)} given back to the device, with no call")
            return True
        if idle_s >= delay_s + IDLE_GRACE_S:
            print(f"  idle {idle_s:4.1f} s: still {format_bytes(reserved)} reserved: "
                  "not given back in time")
            return False
        if idle_s >= next_line_s:
            print(f"  idle {idle_s:4.1f} s: reserved {format_bytes(reserved)}")
            next_line_s += 0.5


def _settled(reserved: int, clock: Callable[[], float], sleep: Callable[[float], None],
             deadline: float) -> int:
    """The reserved bytes once a release that began has run its course: 0, or unchanged for
    IDLE_SETTLE_S, or whatever they are at ``deadline`` (a ``clock`` reading)."""
    steady_since = clock()
    while reserved > 0 and clock() - steady_since < IDLE_SETTLE_S and clock() < deadline:
        sleep(IDLE_POLL_S / 5)
        now = streampool.memory_reserved()
        if now != reserved:
            reserved, steady_since = now, clock()
    return reserved


class DemoError(Exception):
    """The demo cannot run as asked (the message says why and what to do)."""


def gpu_unavailable_reason() -> Optional[str]:
    """Why the demo runs on the simulated driver, or None if it runs on the GPU. Without
    STREAMPOOL_DRIVER the GPU is used where there is one; STREAMPOOL_DRIVER=cuda insists on it
    (DemoError naming what is missing), =sim never uses it, anything else is the library's
    ConfigError. Does not initialise CUDA."""
    choice = os.environ.get("STREAMPOOL_DRIVER", "").strip().lower()
    if choice == "sim":
        return "STREAMPOOL_DRIVER=sim"
    if choice not in ("", "cuda"):
        _lib.check_config()  # raises ConfigError naming the variable, its value and what is accepted
    try:
        import torch
    except ImportError:
        if choice == "cuda":
            raise DemoError(
                "STREAMPOOL_DRIVER=cuda: the demo runs on the GPU through PyTorch, which is not "
                "installed (pip install torch), or unset STREAMPOOL_DRIVER for the simulated driver"
            ) from None
        return "no CUDA GPU found: PyTorch is not installed"
    if not torch.cuda.is_available():
        if choice == "cuda":
            raise DemoError(
                "STREAMPOOL_DRIVER=cuda: PyTorch finds no CUDA GPU (torch.cuda.is_available() is False)"
            )
        return "no CUDA GPU found"
    return None


def run() -> int:
    """Run the demo; returns the exit status (failures raise; 1: the memory held after the last
    free was not given back in time)."""
    reason = gpu_unavailable_reason()
    if reason is None:
        released = _run_gpu()
    else:
        released = _run_sim(reason)
    return 0 if released else 1


# --- GPU, through PyTorch ---------------------------------------------------------------------


def _run_gpu() -> bool:
    import torch

    streampool.install()
    print(f"streampool demo on GPU: {torch.cuda.get_device_name()}")
    pattern = _gpu_pattern(torch)
    _gpu_tensor_sizes(torch, pattern)
    _gpu_side_stream(torch)
    _gpu_training(torch)
    _gpu_out_of_memory(torch, pattern)
    del pattern
    released = show_idle_release(settle=torch.cuda.synchronize)
    print(streampool.memory_summary())
    return released


def _gpu_pattern(torch: Any) -> Any:
    """PATTERN_CHUNK bytes holding i % PATTERN_PERIOD, on the GPU."""
    indices = torch.arange(PATTERN_CHUNK, dtype=torch.int32, device="cuda")
    return (indices % PATTERN_PERIOD).to(torch.uint8)


def _gpu_checked_tensor(torch: Any, size: int, pattern: Any) -> None:
    """Allocate ``size`` bytes on the current stream, write byte i = i % PATTERN_PERIOD, then
    compare every byte with the pattern (chunk starts are whole periods, so chunks line up)."""
    tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
    for start in range(0, size, PATTERN_CHUNK):
        piece = tensor[start : start + PATTERN_CHUNK]
        piece.copy_(pattern[: piece.numel()])
    for start in range(0, size, PATTERN_CHUNK):
        piece = tensor[start : start + PATTERN_CHUNK]
        if not torch.equal(piece, pattern[: piece.numel()]):
            raise RuntimeError(f"{size} B tensor: wrong values in bytes {start}..{start + piece.numel()}")


def _gpu_available_bytes(torch: Any) -> int:
    """Bytes a new tensor can get: free device memory plus what streampool's pool holds unused."""
    free, _ = torch.cuda.mem_get_info()
    return free + max(0, streampool.memory_reserved() - streampool.memory_allocated())


def _gpu_tensor_sizes(torch: Any, pattern: Any) -> None:
    side = torch.cuda.Stream()
    for size in GPU_CHECKED_SIZES:
        available = _gpu_available_bytes(torch)
        if size + HEADROOM_BYTES > available:
            print(f"  {format_bytes(size):>10}: skipped, only {format_bytes(available)} free on the device")
            continue
        _gpu_checked_tensor(torch, size, pattern)
        side.wait_stream(torch.cuda.current_stream())  # the pattern is ready before the side stream reads it
        with torch.cuda.stream(side):
            _gpu_checked_tensor(torch, size, pattern)
        torch.cuda.current_stream().wait_stream(side)
        print(f"  {format_bytes(size):>10}: every byte checked, on the default stream and a side stream")
    side.synchronize()
    _print_phase("tensors of several sizes, freed")


def _gpu_out_of_memory(torch: Any, pattern: Any) -> None:
    """A 10 TB request raises PyTorch's out-of-memory RuntimeError; allocation works afterwards."""
    try:
        torch.empty(OOM_REQUEST_BYTES, dtype=torch.uint8, device="cuda")
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError too
        message = str(exc)
    else:
        raise RuntimeError("a 10 TB tensor was allocated: expected CUDA out of memory")
    if not message.startswith("CUDA out of memory."):
        raise RuntimeError(f"a 10 TB request failed with an unexpected message: {message}")
    print(f"10 TB request: RuntimeError: {message.splitlines()[0]}")
    _gpu_checked_tensor(torch, AFTER_OOM_BYTES, pattern)
    print(f"after the error: a {format_bytes(AFTER_OOM_BYTES)} tensor allocated and every byte checked")
    _print_phase("after out of memory")


def _gpu_side_stream(torch: Any) -> None:
    side = torch.cuda.Stream()
    count = SIDE_STREAM_TENSOR_BYTES // FLOAT_BYTES
    produced = torch.full((count,), 3.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        consumed = produced * 2
    produced.record_stream(side)  # keeps the memory from reuse until the side stream is done
    del produced
    reused = torch.zeros(count, device="cuda")  # may take the freed memory, safely
    side.synchronize()
    assert bool((consumed == 6.0).all()) and bool((reused == 0.0).all())
    _print_phase("side stream + record_stream")


def _gpu_training(torch: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(MLP_IN, MLP_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(MLP_HIDDEN, MLP_OUT)
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(MLP_BATCH, MLP_IN, device="cuda")
    targets = torch.randn(MLP_BATCH, MLP_OUT, device="cuda")
    for step in range(TRAINING_STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        print(f"  step {step}: loss {loss.item():.4f}")
    _print_phase("MLP training steps")  # the model, its optimizer state and its batch live


# --- simulated driver, through ctypes --------------------------------------------------------


def _run_sim(reason: str) -> bool:
    os.environ["STREAMPOOL_DRIVER"] = "sim"  # before the library's first use
    chosen = os.environ.get("STREAMPOOL_BACKEND", "").strip()
    if not chosen:
        os.environ["STREAMPOOL_BACKEND"] = SIM_DEMO_BACKEND
    print(f"streampool demo on the simulated driver ({reason}): host memory stands in for a "
          "GPU's, the allocations are the same")
    if not chosen:
        print(f"backend: {SIM_DEMO_BACKEND}, whose idle release a simulated GPU can show (the "
              "default, vmm, waits for\n  the GPU to finish its work, which a simulated GPU does "
              "only when the program synchronises)")
    _sim_tensor_sizes()
    _sim_side_stream()
    _sim_training()
    released = show_idle_release()
    print(streampool.memory_summary())
    return released


def _sim_tensor_sizes() -> None:
    """Tensors of every size held together, freed, then allocated again (from the cache)."""
    for round_ in range(2):
        blocks = _sim_allocate(list(TENSOR_SIZES))
        if round_ == 0:
            _print_phase("tensors of several sizes")
        _sim_free(blocks)
    _print_phase("the same sizes again, freed")


def _sim_side_stream() -> None:
    size = SIDE_STREAM_TENSOR_BYTES
    produced = _lib.malloc(size, 0)
    _lib.library().streampool_record_stream(produced, SIM_SIDE_STREAM)
    _lib.free(produced, size, 0)
    reused = _lib.malloc(size, 0)
    _print_phase("side stream + record_stream")
    _lib.free(reused, size, 0)


def _mlp_parameter_sizes() -> List[int]:
    """Bytes of the MLP's weights and biases (float32)."""
    shapes = [MLP_IN * MLP_HIDDEN, MLP_HIDDEN, MLP_HIDDEN * MLP_OUT, MLP_OUT]
    return [n * FLOAT_BYTES for n in shapes]


def _mlp_activation_sizes() -> List[int]:
    """Bytes of the tensors one forward pass creates: input, hidden, ReLU output, output."""
    widths = [MLP_IN, MLP_HIDDEN, MLP_HIDDEN, MLP_OUT]
    return [MLP_BATCH * w * FLOAT_BYTES for w in widths]


def _sim_training() -> None:
    """The allocation pattern of the GPU demo's training loop: parameters live throughout; each
    step allocates activations, then gradients, and frees both."""
    parameters = _sim_allocate(_mlp_parameter_sizes())
    for step in range(TRAINING_STEPS):
        activations = _sim_allocate(_mlp_activation_sizes())
        gradients = _sim_allocate(_mlp_parameter_sizes())
        if step == TRAINING_STEPS - 1:
            _print_phase("MLP training steps")  # parameters, activations and gradients live
        _sim_free(gradients)
        _sim_free(activations)
    _sim_free(parameters)


def _sim_allocate(sizes: List[int]) -> List[Tuple[int, int]]:
    return [(_lib.malloc(size, 0), size) for size in sizes]


def _sim_free(blocks: List[Tuple[int, int]]) -> None:
    for ptr, size in reversed(blocks):
        _lib.free(ptr, size, 0)


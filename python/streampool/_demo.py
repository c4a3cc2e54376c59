"""``python -m streampool demo``: one sequence of allocations, on a GPU through PyTorch when there
is one, otherwise through the simulated driver via ctypes.

The sequence: tensors of several sizes on the default stream, twice; a tensor used on a side
stream, kept alive there by record_stream, freed early and its memory reused; a few training steps
of a small MLP. Statistics are printed after each phase, a memory summary at the end.
"""

import os
from typing import Any, List, Optional, Tuple

import streampool

from . import _lib
from ._stats import format_bytes

MiB = 1 << 20
TENSOR_SIZES = (512, 1 * MiB, 64 * MiB, 256 * MiB)  # bytes
SIDE_STREAM_TENSOR_BYTES = 32 * MiB
MLP_BATCH, MLP_IN, MLP_HIDDEN, MLP_OUT = 256, 1024, 4096, 1024
TRAINING_STEPS = 5
FLOAT_BYTES = 4
SIM_SIDE_STREAM = 0x5151  # an arbitrary non-zero stream handle for the simulated driver


def _print_phase(name: str) -> None:
    s = streampool.memory_stats()
    print(
        f"{name:<28} allocated {format_bytes(s['allocated_bytes.all.current']):>10}"
        f"  reserved {format_bytes(s['reserved_bytes.all.current']):>10}"
        f"  cached {format_bytes(s['cached_bytes']):>10}"
        f"  cache hits {s['cache_hits']}"
    )


def gpu_unavailable_reason() -> Optional[str]:
    """Why the demo cannot use a GPU, or None if it can. Does not initialise CUDA."""
    if os.environ.get("STREAMPOOL_DRIVER", "").strip().lower() == "sim":
        return "STREAMPOOL_DRIVER=sim"
    try:
        import torch
    except ImportError:
        return "no CUDA GPU found: PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU found"
    return None


def run() -> int:
    """Run the demo; returns the exit status (failures raise)."""
    reason = gpu_unavailable_reason()
    if reason is None:
        _run_gpu()
    else:
        _run_sim(reason)
    return 0


# --- GPU, through PyTorch ---------------------------------------------------------------------


def _run_gpu() -> None:
    import torch

    streampool.install()
    print(f"streampool demo on GPU: {torch.cuda.get_device_name()}")
    _gpu_tensor_sizes(torch)
    _print_phase("tensors of several sizes")
    _gpu_side_stream(torch)
    _print_phase("side stream + record_stream")
    _gpu_training(torch)
    _print_phase("MLP training steps")
    print(streampool.memory_summary())


def _gpu_tensor_sizes(torch: Any) -> None:
    for _ in range(2):
        for size in TENSOR_SIZES:
            tensor = torch.ones(size, dtype=torch.uint8, device="cuda")
            assert int(tensor[-1]) == 1
            del tensor


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


# --- simulated driver, through ctypes --------------------------------------------------------


def _run_sim(reason: str) -> None:
    os.environ["STREAMPOOL_DRIVER"] = "sim"  # before the library's first use
    print(f"streampool demo on the simulated driver ({reason})")
    _sim_tensor_sizes()
    _print_phase("tensors of several sizes")
    _sim_side_stream()
    _print_phase("side stream + record_stream")
    _sim_training()
    _print_phase("MLP training steps")
    print(streampool.memory_summary())


def _sim_tensor_sizes() -> None:
    for _ in range(2):
        for size in TENSOR_SIZES:
            ptr = _lib.malloc(size, 0)
            _lib.free(ptr, size, 0)


def _sim_side_stream() -> None:
    size = SIDE_STREAM_TENSOR_BYTES
    produced = _lib.malloc(size, 0)
    _lib.library().streampool_record_stream(produced, SIM_SIDE_STREAM)
    _lib.free(produced, size, 0)
    reused = _lib.malloc(size, 0)
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
    for _ in range(TRAINING_STEPS):
        activations = _sim_allocate(_mlp_activation_sizes())
        gradients = _sim_allocate(_mlp_parameter_sizes())
        _sim_free(gradients)
        _sim_free(activations)
    _sim_free(parameters)


def _sim_allocate(sizes: List[int]) -> List[Tuple[int, int]]:
    return [(_lib.malloc(size, 0), size) for size in sizes]


def _sim_free(blocks: List[Tuple[int, int]]) -> None:
    for ptr, size in reversed(blocks):
        _lib.free(ptr, size, 0)


"""torch.cuda: availability from FAKE_TORCH_GPU; initialised by init() or FAKE_TORCH_CUDA_INITIALISED."""

import os

from . import memory
from .memory import (  # noqa: F401  (torch.cuda re-exports them, as PyTorch's does)
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)


def is_available():
    return os.environ.get("FAKE_TORCH_GPU") == "1"


_initialised = os.environ.get("FAKE_TORCH_CUDA_INITIALISED") == "1"


def init():
    global _initialised
    if not is_available():
        raise RuntimeError("Found no NVIDIA driver on your system.")
    _initialised = True


def is_initialized():
    return _initialised


def device_count():
    return 1 if is_available() else 0


def current_device():
    import torch

    return torch._C._cuda_getDevice()


def mem_get_info(device=None):
    """(free, total) bytes: 16 GiB of which FAKE_TORCH_USED_BYTES are in use."""
    total = 16 << 30
    return total - int(os.environ.get("FAKE_TORCH_USED_BYTES", "0")), total


def _get_device_index(device, optional=False):
    if device is None:
        return current_device()
    if isinstance(device, str):
        return int(device.partition(":")[2] or 0)
    return int(device)


def synchronize(device=None):
    """As PyTorch's: the current device's synchronisation, through torch._C."""
    import torch

    return torch._C._cuda_synchronize()

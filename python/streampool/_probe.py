"""Whether this machine has a usable CUDA GPU, asked of the driver (``libcuda.so.1``) through
ctypes: no PyTorch, no libstreampool, no CUDA context created.

Invariant: nothing here changes the process's CUDA state beyond ``cuInit``, which PyTorch and
streampool call anyway, so the answer can be asked for before either starts.
"""

import ctypes
from typing import Optional

CUDA_LIBRARY = "libcuda.so.1"
CUDA_ERROR_NO_DEVICE = 100


def cuda_unavailable_reason() -> Optional[str]:
    """None if the CUDA driver loads and sees at least one device, else why not, in a few words."""
    try:
        cuda = ctypes.CDLL(CUDA_LIBRARY)
    except OSError:
        return f"{CUDA_LIBRARY} not found (no NVIDIA driver)"
    status = cuda.cuInit(0)
    if status == CUDA_ERROR_NO_DEVICE:
        return "the NVIDIA driver sees no CUDA device"
    if status != 0:
        return f"cuInit failed with CUDA error {status}"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return f"cuDeviceGetCount failed with CUDA error {status}"
    if count.value == 0:
        return "the NVIDIA driver sees no CUDA device"
    return None

"""torch._C's memory-statistics entry points, as PyTorch has them (see torch/__init__.py here)."""

import json
import os

pluggable_allocator_current = False


def _native_stats(device):
    return json.loads(os.environ.get("FAKE_TORCH_STATS", '{"num_ooms": 0}'))


def _cuda_memoryStats(device):
    if pluggable_allocator_current:
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats. If you need it, please file an issue describing your use case.")
    return _native_stats(device)


def _cuda_resetPeakMemoryStats(device):
    if pluggable_allocator_current:
        raise RuntimeError("CUDAPluggableAllocator does not yet support resetPeakStats. If you need it, please file an issue describing your use case.")


def _cuda_resetAccumulatedMemoryStats(device):
    if pluggable_allocator_current:
        raise RuntimeError("CUDAPluggableAllocator does not yet support resetAccumulatedStats. If you need it, please file an issue describing your use case.")


synchronize_calls = 0


def _cuda_synchronize():
    """PyTorch's device synchronisation (counted, for the tests)."""
    global synchronize_calls
    synchronize_calls += 1


# The current device (a test sets it, as torch.cuda.set_device would).
current_device_index = 0


def _cuda_getDevice():
    """The current device's index (what torch.cuda.current_device() returns)."""
    return current_device_index

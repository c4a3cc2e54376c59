"""torch.cuda.memory: PyTorch 2.11's memory functions over torch._C (their logic, shortened)."""

import collections

import torch


def memory_stats(device=None):
    result = []

    def _recurse_add_to_result(prefix, obj):
        if isinstance(obj, dict):
            if len(prefix) > 0:
                prefix += "."
            for k, v in obj.items():
                _recurse_add_to_result(prefix + (k if isinstance(k, str) else str(k)), v)
        else:
            result.append((prefix, obj))

    _recurse_add_to_result("", memory_stats_as_nested_dict(device=device))
    result.sort()
    return collections.OrderedDict(result)


def memory_stats_as_nested_dict(device=None):
    if not torch.cuda.is_initialized():
        return {}
    return torch._C._cuda_memoryStats(torch.cuda._get_device_index(device, optional=True))


def reset_accumulated_memory_stats(device=None):
    return torch._C._cuda_resetAccumulatedMemoryStats(torch.cuda._get_device_index(device, optional=True))


def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(torch.cuda._get_device_index(device, optional=True))


def memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)


def memory_summary(device=None, abbreviated=False):
    stats = memory_stats(device=device)
    # PyTorch's table indexes these without a default: a key streampool does not fill is a KeyError.
    return "PyTorch summary: segments {}".format(stats["segment.all.current"])


class _RawAllocator:
    def __init__(self):
        self.hooks = {}

    def __getattr__(self, name):
        if name.startswith("set_"):
            return lambda address: self.hooks.__setitem__(name, address)
        raise AttributeError(name)


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        self.path, self.alloc_fn_name, self.free_fn_name = path, alloc_fn_name, free_fn_name
        self._raw = _RawAllocator()

    def allocator(self):
        return self._raw


def change_current_allocator(allocator):
    torch._C.pluggable_allocator_current = True

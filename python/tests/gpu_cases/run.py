"""Runs GPU test cases in this (fresh) process: ``python run.py --allocator MODE CASE [CASE ...]``.

A process can install a CUDA allocator only once, so test_gpu.py starts one process per case (or
per group of cases sharing a mode). Cases assert inside; a failure exits non-zero with the
traceback. Modes:

- ``streampool``: streampool.install() before any CUDA work;
- ``streampool-no-record-stream-hook``: the same without the record_stream hook (for comparison);
- ``streampool-no-torch-stats``: ``install(torch_stats=False)``: PyTorch's memory functions left alone;
- ``native``: PyTorch's own caching allocator;
- ``pluggable``: streampool's library as PyTorch's ``CUDAPluggableAllocator`` alone, none of
  install()'s wiring (what any pluggable allocator gets from PyTorch as shipped);
- ``scoped``: no install; cases use ``streampool.mempool()`` regions.
"""

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

import streampool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import basic  # noqa: E402  (case modules sit next to this file)
import graphs  # noqa: E402
import multigpu  # noqa: E402
import parity  # noqa: E402
import parity_snapshots  # noqa: E402
import stress  # noqa: E402
import timeline  # noqa: E402
import torch_stats  # noqa: E402
import training  # noqa: E402
import vmm  # noqa: E402

MODES = (
    "streampool",
    "streampool-no-record-stream-hook",
    "streampool-no-torch-stats",
    "native",
    "pluggable",
    "scoped",
)

MiB = 1 << 20
# Device memory a case may take outside any allocator: CUDA loads kernels on first use
# (CUDA_MODULE_LOADING=LAZY, the default) and cuBLAS/cuDNN make handles per thread and stream.
# The driver-level leak check allows this much; the pool-level checks are exact.
UNTRACKED_DEVICE_BYTES = 256 * MiB
# Where streampool and PyTorch's own allocator put blocks (PyTorch's pluggable-allocator contract).
ALIGNMENT_BYTES = 512


@dataclass
class Baseline:
    """What a case must return to (bytes). The driver-level figures are taken only when streampool
    is the global allocator, after ``torch.cuda.empty_cache()``; None otherwise."""

    allocated: int
    pool_used: Optional[int] = None
    pool_reserved: Optional[int] = None
    device_free: Optional[int] = None


class Context:
    """What a case needs to know about the allocator under test. Byte counts are bytes."""

    def __init__(self, mode: str, quick: bool):
        self.mode = mode
        self.quick = quick

    @property
    def streampool_is_global(self) -> bool:
        return self.mode.startswith("streampool")

    def allocated(self) -> int:
        """Bytes of live tensors, by the statistics of the allocator in charge."""
        if self.streampool_is_global:
            return streampool.memory_allocated()
        return torch.cuda.memory_allocated()

    def max_allocated(self) -> int:
        if self.streampool_is_global:
            return streampool.max_memory_allocated()
        return torch.cuda.max_memory_allocated()

    def max_reserved(self) -> int:
        if self.streampool_is_global:
            return streampool.max_memory_reserved()
        return torch.cuda.max_memory_reserved()

    def reset_peak(self) -> None:
        if self.streampool_is_global:
            streampool.reset_peak_memory_stats()
        else:
            torch.cuda.reset_peak_memory_stats()

    def baseline(self) -> Baseline:
        """Live bytes now; with streampool global, also its pools' used and reserved bytes and the
        device's free memory once its cache is returned and its pools trimmed."""
        self.settle()
        base = Baseline(allocated=self.allocated())
        if self.streampool_is_global:
            base.pool_used, base.pool_reserved, base.device_free = self._driver_level()
        return base

    def assert_back_to(self, base: Baseline, when: str, device_shared: bool = False) -> None:
        """Live bytes are back to ``base``; with streampool global, the pools' used and reserved
        bytes too (a block lost after free() lowered the live bytes shows only there), and the
        device's free memory within UNTRACKED_DEVICE_BYTES of it, unless ``device_shared`` (another
        process allocates on the device meanwhile, so its free memory says nothing of ours)."""
        self.settle()
        allocated = self.allocated()
        assert allocated == base.allocated, f"{when}: allocated {allocated} B, baseline {base.allocated} B"
        if base.pool_used is None:
            return
        used, reserved, free = self._driver_level()
        assert used == base.pool_used, f"{when}: the pools use {used} B, at the start {base.pool_used} B"
        assert reserved == base.pool_reserved, (
            f"{when}: the pools reserve {reserved} B after empty_cache, at the start {base.pool_reserved} B"
        )
        if device_shared:
            return
        lost = base.device_free - free
        assert lost <= UNTRACKED_DEVICE_BYTES, (
            f"{when}: the device has {lost} B less free memory than at the start after empty_cache"
        )

    @staticmethod
    def _driver_level():
        """(pools' used, reserved, device free) bytes after empty_cache: streampool returns its
        cache, synchronises the device and trims its pools to 0 (reserved: memory_reserved(), the
        shareable pool and graph memory included)."""
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        stats = streampool.memory_stats()
        free, _ = torch.cuda.mem_get_info()
        return stats["pool_used_bytes"], stats["reserved_bytes.all.current"], free

    @staticmethod
    def check_aligned(*tensors) -> None:
        """Every tensor's memory starts on a 512-byte boundary (size-0 tensors have none)."""
        for tensor in tensors:
            ptr = tensor.data_ptr()
            assert ptr % ALIGNMENT_BYTES == 0, f"a {tensor.numel()}-element tensor at {ptr:#x} is not 512-byte aligned"

    @staticmethod
    def settle() -> None:
        """Finish GPU work and drop garbage and cuBLAS workspaces (which PyTorch allocates
        through the allocator and keeps per thread), so live bytes are only the tensors held."""
        gc.collect()
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()


def find_cases():
    """name -> function, from every ``case_<name>`` in the case modules."""
    cases = {}
    for module in (basic, graphs, multigpu, parity, parity_snapshots, stress, timeline, torch_stats, training, vmm):
        for attribute in dir(module):
            if attribute.startswith("case_"):
                cases[attribute[len("case_"):]] = getattr(module, attribute)
    return cases


def main(argv=None) -> int:
    cases = find_cases()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allocator", choices=MODES, default="streampool")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer steps (for sanitizers)")
    parser.add_argument("cases", nargs="+", choices=sorted(cases))
    options = parser.parse_args(argv)

    if options.allocator == "streampool":
        streampool.install()
    elif options.allocator == "streampool-no-record-stream-hook":
        from streampool import _torch

        _torch._wire_record_stream = False  # the test hook (no install() option: not public)
        streampool.install()
    elif options.allocator == "streampool-no-torch-stats":
        streampool.install(torch_stats=False)
    elif options.allocator == "pluggable":
        plain = torch.cuda.memory.CUDAPluggableAllocator(streampool.library_path(), "my_malloc", "my_free")
        torch.cuda.memory.change_current_allocator(plain)
    context = Context(options.allocator, options.quick)
    for name in options.cases:
        start = time.perf_counter()
        cases[name](context)
        print(f"CASE {name} ({options.allocator}) passed in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

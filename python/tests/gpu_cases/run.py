"""Runs GPU test cases in this (fresh) process: ``python run.py --allocator MODE CASE [CASE ...]``.

A process can install a CUDA allocator only once, so test_gpu.py starts one process per case (or
per group of cases sharing a mode). Cases assert inside; a failure exits non-zero with the
traceback. Modes:

- ``streampool``: streampool.install() before any CUDA work;
- ``streampool-no-record-stream-hook``: the same without the record_stream hook (for comparison);
- ``native``: PyTorch's own caching allocator;
- ``scoped``: no install; cases use ``streampool.mempool()`` regions.
"""

import argparse
import gc
import os
import sys
import time

import torch

import streampool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import basic  # noqa: E402  (case modules sit next to this file)
import graphs  # noqa: E402
import multigpu  # noqa: E402
import stress  # noqa: E402
import timeline  # noqa: E402
import training  # noqa: E402
import vmm  # noqa: E402

MODES = ("streampool", "streampool-no-record-stream-hook", "native", "scoped")


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
    for module in (basic, graphs, multigpu, stress, timeline, training, vmm):
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
        streampool.install(_wire_record_stream=False)
    context = Context(options.allocator, options.quick)
    for name in options.cases:
        start = time.perf_counter()
        cases[name](context)
        print(f"CASE {name} ({options.allocator}) passed in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

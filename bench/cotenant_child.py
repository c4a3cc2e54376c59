"""The co-tenant's two processes on one GPU: the holder (A) and the prober (B).

``python3 -m bench.cotenant_child holder --base B --backend K [--empty-cache]``: installs its
configuration's allocator, trains GPT-2 over every sequence length of the gpt2 schedule's
warm-up, drops everything but the model and optimizer, synchronises (and calls empty_cache() only
if told), says ``ready`` and idles until its stdin closes.
``python3 -m bench.cotenant_child prober``: native allocator; starts CUDA, says ``ready``, waits
for a line on stdin, then binary-searches the largest tensor it can allocate, fills it (it keeps
working with it), and says ``fit``.

Invariant: A's model and optimizer stay referenced while B searches (A is an idle trainer, not
a finished one); B's search is between a size known to fit and one known not to, to
PROBE_RESOLUTION_BYTES, releasing its own cache after every try so that only A's holdings and B's
context limit it.
"""

import argparse
import gc
import sys
import traceback
from typing import Any, Callable

from . import protocol, workloads
from . import schedules as s
from .child import Skipped, set_up

PROBE_RESOLUTION_BYTES = 64 * 2**20
PROBE_ALIGN_BYTES = 2 * 2**20


def hold(base: str, backend: str, empty_cache: bool) -> int:
    """Process A (see the module docstring)."""
    try:
        torch, _, info = set_up(base, backend)
        step = workloads.build_gpt2(torch, "cuda")
        lengths = sorted(s.GPT2_SEQ_LENGTHS, reverse=True)  # the largest first: the pool's peak
        for length in lengths:
            step(length)
        gc.collect()
        torch.cuda.synchronize()  # a stream-ordered pool applies its release threshold here
        if empty_cache:
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
        free_bytes, total_bytes = torch.cuda.mem_get_info()
    except Skipped as exc:
        protocol.emit("skipped", reason=str(exc))
        return 0
    except Exception as exc:
        traceback.print_exc()
        protocol.emit("setup_error", reason=protocol.exception_text(exc))
        return 0
    protocol.emit(
        "ready",
        info=info,
        trained_steps=len(lengths),
        empty_cache_called=empty_cache,
        free_bytes_when_idle=free_bytes,
        device_total_bytes=total_bytes,
    )
    sys.stdin.read()  # idle, model and optimizer alive, until the parent closes our stdin
    del step
    return 0


def largest_fit_bytes(fits: Callable[[int], bool], high_bytes: int) -> int:
    """The largest multiple of PROBE_ALIGN_BYTES up to ``high_bytes`` for which ``fits`` is true,
    to within PROBE_RESOLUTION_BYTES (0 if none fits), assuming that whatever fits, less fits too.
    """
    low, high = 0, high_bytes  # low fits (nothing), high is not known to
    if fits(high):
        return high
    while high - low > PROBE_RESOLUTION_BYTES:
        middle = (low + high) // 2 // PROBE_ALIGN_BYTES * PROBE_ALIGN_BYTES
        if middle <= low:
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def probe() -> int:
    """Process B (see the module docstring)."""
    import torch

    torch.empty(1, device="cuda")  # start the context now, while A trains
    total_bytes = torch.cuda.mem_get_info()[1]
    protocol.emit("ready", device_total_bytes=total_bytes)
    if not sys.stdin.readline():
        return 1  # the parent gave up before asking
    free_bytes_before = torch.cuda.mem_get_info()[0]

    def fits(size_bytes: int) -> bool:
        try:
            block = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
            del block
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()

    fit_bytes = largest_fit_bytes(fits, total_bytes)
    if fit_bytes:  # keep working: the memory must be usable, not only mapped
        block = torch.empty(fit_bytes, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.synchronize()
        del block
        torch.cuda.empty_cache()
    protocol.emit(
        "fit",
        fit_bytes=fit_bytes,
        device_total_bytes=total_bytes,
        free_bytes_before=free_bytes_before,
    )
    return 0


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.cotenant_child")
    roles = parser.add_subparsers(dest="role", required=True)
    holder = roles.add_parser("holder")
    holder.add_argument("--base", required=True)
    holder.add_argument("--backend", required=True)
    holder.add_argument("--empty-cache", action="store_true")
    roles.add_parser("prober")
    options = parser.parse_args(argv)
    if options.role == "holder":
        return hold(options.base, options.backend, options.empty_cache)
    return probe()


if __name__ == "__main__":
    sys.exit(main())

"""The co-tenant's two processes on one GPU: the holder (A) and the prober (B).

``python3 -m bench.cotenant_child holder --base B --backend K [--empty-cache]``: installs its
configuration's allocator and imports torch and transformers, says ``loaded`` and waits for a
line on stdin; then starts CUDA, reads free memory once its libraries are set up
(``free_bytes_at_start``), trains GPT-2 over every sequence length of the gpt2 schedule (largest
first, twice), drops everything but the model and optimizer, synchronises (and calls
empty_cache() only if told), says ``idle`` with its live tensor bytes, and idles until its
stdin closes.
``python3 -m bench.cotenant_child prober``: native allocator; starts CUDA and loads the fill
kernel, says ``ready``, then answers commands on stdin: ``free`` (free device memory now) and
``probe`` (free device memory now, then an allocation of that much less PROBE_HEADROOM_BYTES,
filled and synchronised: what B can really use).

Invariant: A's model and optimizer stay referenced while B probes (A is an idle trainer, not a
finished one); A's live bytes are the storage of its parameters, buffers and optimizer state
(the same whichever allocator), so held beyond live = A's free memory at start - B's free
memory now - live bytes; B returns every byte it took before answering.
"""

import argparse
import gc
import json
import sys
from typing import Any

from . import protocol, workloads
from . import schedules as s
from .engine import install_allocator, warm_up_libraries
from .worker import Skipped

PROBE_HEADROOM_BYTES = 256 * 2**20
PROBE_ALIGN_BYTES = 2 * 2**20
TRAINING_PASSES = 2


def live_tensor_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of the distinct storages of ``model``'s parameters and buffers and ``optimizer``'s
    state tensors."""
    import torch

    storages = {}
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        if tensor.is_cuda:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def hold(base: str, backend: str, empty_cache: bool) -> int:
    """Process A (see the module docstring)."""
    try:
        finish = install_allocator(base)
        import torch
        import transformers  # noqa: F401  (imported now: loading is not part of the trial)
    except Skipped as exc:
        protocol.emit("skipped", reason=str(exc))
        return 0
    except Exception as exc:
        protocol.emit("setup_error", reason=protocol.error_text(exc))
        return 0
    protocol.emit("loaded")
    if not sys.stdin.readline():
        return 0  # the parent gave up before the trial
    try:
        torch.cuda.mem_get_info()
        finish()
        if torch.cuda.get_allocator_backend() != backend:
            raise RuntimeError(f"allocator backend is {torch.cuda.get_allocator_backend()!r}")
        warm_up_libraries(torch)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        free_bytes_at_start = torch.cuda.mem_get_info()[0]
        step = workloads.build_gpt2(torch, "cuda")
        lengths = sorted(s.GPT2_SEQ_LENGTHS, reverse=True)  # the largest first: the peak
        for _ in range(TRAINING_PASSES):
            for length in lengths:
                step(length)
        gc.collect()
        torch.cuda.synchronize()  # a stream-ordered pool applies its release threshold here
        if empty_cache:
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
        live_bytes = live_tensor_bytes(step.model, step.optimizer)
    except Exception as exc:
        protocol.emit("setup_error", reason=protocol.error_text(exc))
        return 0
    protocol.emit(
        "idle",
        free_bytes_at_start=free_bytes_at_start,
        live_bytes=live_bytes,
        empty_cache_called=empty_cache,
        trained_steps=TRAINING_PASSES * len(lengths),
        device=torch.cuda.get_device_name(0),
    )
    sys.stdin.read()  # idle, model and optimizer alive, until the parent closes our stdin
    del step
    return 0


def probe_once(torch: Any) -> dict:
    """Free memory now, and whether B can really allocate and fill that much less headroom."""
    free_bytes = torch.cuda.mem_get_info()[0]
    size = max(0, free_bytes - PROBE_HEADROOM_BYTES) // PROBE_ALIGN_BYTES * PROBE_ALIGN_BYTES
    answer = {"free_bytes": free_bytes, "tried_bytes": size, "confirmed": False, "error": None}
    block = None
    try:
        block = torch.empty(size, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.synchronize()
        answer["confirmed"] = True
    except RuntimeError as exc:  # torch.OutOfMemoryError and AcceleratorError among them
        answer["error"] = protocol.error_text(exc)
    finally:
        del block
        gc.collect()
        torch.cuda.empty_cache()
    return answer


def probe() -> int:
    """Process B (see the module docstring)."""
    import torch

    torch.empty(16, dtype=torch.uint8, device="cuda").fill_(1)  # context and fill kernel now
    torch.cuda.synchronize()
    protocol.emit("ready", info={"device_total_bytes": torch.cuda.mem_get_info()[1]})
    for line in sys.stdin:
        command = json.loads(line).get("command")
        try:
            if command == "free":
                result = {"free_bytes": torch.cuda.mem_get_info()[0]}
            elif command == "probe":
                result = probe_once(torch)
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception as exc:
            protocol.emit("reply", ok=False, error=protocol.error_text(exc))
            continue
        protocol.emit("reply", ok=True, result=result)
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

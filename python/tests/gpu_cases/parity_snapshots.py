"""GPU cases of the parity suite (``case_<name>(ctx)``, as in parity.py): PyTorch's memory snapshots
and history under install(): the snapshot's segments add up to ``memory_reserved()``, and the
history's frames name the allocating code.
"""

import torch

from parity import MiB, _result


def case_snapshot_adds_up(ctx) -> None:
    """The segments of ``torch.cuda.memory_snapshot()`` add up to ``memory_reserved()`` at every
    moment: tensors of 1, 5, 33 and 130 MiB live, some freed, a ``MemPool``'s blocks and a CUDA
    graph's pool live, after ``empty_cache()``."""

    def check(when: str) -> int:
        torch.cuda.synchronize()
        total = sum(s["total_size"] for s in torch.cuda.memory_snapshot() if s["device"] == torch.cuda.current_device())
        reserved = torch.cuda.memory_reserved()
        assert total == reserved, f"{when}: the segments add up to {total} B, memory_reserved() is {reserved} B"
        return reserved

    live = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (1, 5, 33, 130)]
    check("four tensors live")
    del live[1:3]
    check("two freed")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        pooled = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (3, 17)]
    check("a MemPool's blocks live")
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(MiB, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (x * 2).sum()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        y = x * 2
    graph.replay()
    check("a CUDA graph's pool live")
    del pooled, y, graph
    check("the pools' blocks freed")
    del pool
    torch.cuda.empty_cache()
    check("after empty_cache")
    del live
    torch.cuda.empty_cache()
    check("nothing live")
    _result("snapshot_adds_up", True)


def _allocate_for_history(n: int):
    """Allocations whose frames the history must show (this function's name)."""
    return torch.empty(n * MiB, dtype=torch.uint8, device="cuda")


def case_memory_history_frames(ctx) -> None:
    """``_record_memory_history`` with its defaults (stacks "all", context "all"), then
    ``stacks="python"``, ``context="alloc"``, ``context="state"`` and ``max_entries``: trace
    entries and live blocks carry the frames PyTorch says they do."""
    device = torch.cuda.current_device()

    def snap():
        s = torch.cuda.memory._snapshot()
        live = {b["address"]: b for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
        return s["device_traces"][device], live

    def names(frames):
        return [f["name"] for f in frames]

    figures = {}
    torch.cuda.memory._record_memory_history()  # enabled="all", context="all", stacks="all"
    kept = _allocate_for_history(3)
    gone = _allocate_for_history(5)
    gone_at = gone.data_ptr()
    del gone
    trace, live = snap()
    alloc = next(e for e in trace if e["action"] == "alloc" and e["addr"] == kept.data_ptr())
    figures["alloc_frames_name_the_python_function"] = "_allocate_for_history" in names(alloc["frames"])
    figures["alloc_frames_have_native_frames"] = any(
        not f["filename"].endswith(".py") and not f["filename"].startswith("<") for f in alloc["frames"]
    )
    frees = [e for e in trace if e["action"].startswith("free") and e["addr"] == gone_at]
    figures["free_frames_name_the_python_function"] = bool(frees) and all(
        "case_memory_history_frames" in names(e["frames"]) for e in frees
    )
    figures["live_block_frames"] = "_allocate_for_history" in names(live[kept.data_ptr()]["frames"])
    torch.cuda.memory._record_memory_history(enabled=None)

    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", clear_history=True)
    x = _allocate_for_history(1)
    del x
    trace, _ = snap()
    alloc = [e for e in trace if e["action"] == "alloc"][-1]
    figures["python_stacks_only_python"] = bool(alloc["frames"]) and all(
        f["filename"].endswith(".py") or f["filename"].startswith("<") for f in alloc["frames"]
    )
    # PyTorch: with context "alloc", a free carries its allocation's frames, not its own.
    figures["alloc_context_frees_carry_the_allocations_frames"] = all(
        "_allocate_for_history" in names(e["frames"]) and "case_memory_history_frames" not in names(e["frames"][:1])
        for e in trace if e["action"].startswith("free")
    )
    torch.cuda.memory._record_memory_history(enabled=None)

    torch.cuda.memory._record_memory_history(context="state", stacks="python", clear_history=True)
    y = _allocate_for_history(2)
    trace, live = snap()
    # PyTorch's trace entries under context "state" carry no "frames" key at all.
    figures["state_context_trace_without_frames"] = all(not e.get("frames") for e in trace)
    figures["state_context_live_block_frames"] = "_allocate_for_history" in names(live[y.data_ptr()]["frames"])
    del y
    torch.cuda.memory._record_memory_history(enabled=None)

    torch.cuda.memory._record_memory_history(max_entries=5, stacks="python", clear_history=True)
    z = [_allocate_for_history(1) for _ in range(10)]
    trace, _ = snap()
    figures["max_entries_5_trace_length"] = len(trace)
    del z
    torch.cuda.memory._record_memory_history(enabled=None)
    del kept
    assert all(v for k, v in figures.items() if k != "max_entries_5_trace_length"), figures
    _result("memory_history_frames", figures)


# A counting allocator for MemPool(allocator), built by the case with the system's C compiler:
# cuMemAlloc/cuMemFree of the driver (libcuda.so.1, loaded at run time: no CUDA headers needed),
# with counters, a table of the blocks out, and a switch that makes malloc return NULL.

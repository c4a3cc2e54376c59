"""New physical handles and pages mapped each step, on the GPU (a diagnostic).

``python3 bench/diag_play.py play TRACE`` plays a trace's allocations (bench/traces format: ``a``,
``f``, ``s``, ``x`` lines) through the library's C entry points, ``my_malloc`` and ``my_free``, on
the legacy stream, with ``torch.cuda.synchronize()`` at each ``s``: the allocator sees the trace's
sequence on the real driver, with no kernels. ``python3 bench/diag_play.py workload NAME`` runs the
benchmark's workload with its schedule (bench/schedules.py), synchronised after each step.
``DOUBLE_SYNC=1`` synchronises twice instead. Either prints, for each step, the new handles
(``num_mem_creates``) and the pages mapped (``num_maps``) of ``streampool.memory_stats()``.
Settings come from the environment (``STREAMPOOL_BACKEND=vmm``, a release threshold, ...).

Invariant: every figure is read in this process, after the step's synchronisation.
"""

import ctypes
import gzip
import os
import sys


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import streampool

    streampool.install()
    import torch
    from streampool import _lib

    torch.empty(1, device="cuda")
    lib = _lib.library()
    malloc, free = lib.my_malloc, lib.my_free
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def synchronize() -> None:
        torch.cuda.synchronize()
        if os.environ.get("DOUBLE_SYNC") == "1":
            torch.cuda.synchronize()

    def counts():
        stats = streampool.memory_stats()
        return stats["num_mem_creates"], stats["num_maps"]

    per_step, last = [], counts()

    def step_done() -> None:
        nonlocal last
        now = counts()
        per_step.append((now[0] - last[0], now[1] - last[1]))
        last = now

    mode, what = sys.argv[1], sys.argv[2]
    if mode == "play":
        live = {}
        with gzip.open(what, "rt") as trace:
            for line in trace:
                fields = line.split()
                if not fields or fields[0].startswith("#"):
                    continue
                if fields[0] == "a":
                    size = int(fields[2])
                    live[fields[1]] = (malloc(size, 0, None), size)
                elif fields[0] == "f":
                    ptr, size = live.pop(fields[1])
                    free(ptr, size, 0, None)
                elif fields[0] == "s":
                    synchronize()
                elif fields[0] == "x":
                    step_done()
        for ptr, size in live.values():
            free(ptr, size, 0, None)
    else:
        from bench import schedules, workloads

        schedule = schedules.build_schedule(what)
        body = workloads.build(torch, what)
        for params in schedule.steps:
            body(params)
            synchronize()
            step_done()
    print(f"PLAY {mode} {what}: (new handles, pages mapped) a step: {per_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

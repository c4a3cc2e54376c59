"""What a shareable CUDA pool costs on the pool backend (a GPU diagnostic: ``scripts/gpu-diag
shareable``): device memory kept after the program frees everything, and the time of an
allocation, for PyTorch's native allocator, ``streampool.install()`` (ordinary pools) and
``streampool.install(ipc=True)`` (every pool created exportable to POSIX file descriptors, so
that any tensor can be sent to another process).

Each configuration runs in a process of its own: it allocates BURST_BYTES in 64 MiB tensors,
frees them all and synchronises, then reads the device's used memory (``mem_get_info``, less
what it was before the burst) after the free, after ``torch.cuda.empty_cache()``, and
IDLE_S seconds later (streampool gives idle memory back after 2 s); then times PAIRS pairs of
``torch.empty(1 MiB)`` + ``del``.

Invariant: every figure of a line is read in that configuration's own process.
"""

import os
import subprocess
import sys
import time

MIB = 2**20
BURST_BYTES = 4096 * MIB
IDLE_S = 3.0
PAIRS = 20_000
CONFIGS = {
    "native": None,
    "pool": {},
    "pool-ipc": {"ipc": True},
}


def child(config: str) -> None:
    options = CONFIGS[config]
    if options is not None:
        import streampool

        streampool.install(backend="pool", **options)
    import torch

    torch.ones(1, device="cuda")
    torch.cuda.synchronize()

    def used() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    start = used()
    burst = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
             for _ in range(BURST_BYTES // (64 * MIB))]
    torch.cuda.synchronize()
    held = used() - start
    shareable = "n/a"
    if options is not None:  # streampool's own reading: the bytes of its shareable pool
        shareable = f"{streampool.memory_stats()['ipc_reserved_bytes'] / MIB:.0f} MiB"
    del burst
    torch.cuda.synchronize()
    after_free = used() - start
    torch.cuda.empty_cache()
    after_empty = used() - start
    time.sleep(IDLE_S)
    after_idle = used() - start
    for _ in range(1000):  # warm-up
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        del x
    began = time.perf_counter()
    for _ in range(PAIRS):
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        del x
    pair_us = (time.perf_counter() - began) / PAIRS * 1e6
    print(f"SHAREABLE {config}: burst {held / MIB:.0f} MiB (in a shareable pool: {shareable}); "
          f"kept after the free "
          f"{after_free / MIB:.0f} MiB, after empty_cache() {after_empty / MIB:.0f} MiB, "
          f"{IDLE_S:g} s idle later {after_idle / MIB:.0f} MiB; torch.empty(1 MiB) + del "
          f"{pair_us:.2f} us", flush=True)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    for config in CONFIGS:
        argv = [sys.executable, os.path.abspath(__file__), "--child", config]
        subprocess.run(argv, check=False, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())

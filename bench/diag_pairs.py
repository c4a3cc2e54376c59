"""Where the time of a ``torch.empty`` + ``del`` pair goes, per allocator (a GPU diagnostic:
``scripts/gpu-diag pairs``).

Each configuration runs in a process of its own, pinned to the same CPU, one after another and
again in the opposite order (ABBA), so that neither the CPU nor the order favours one: native,
streampool on the pool backend, streampool on the vmm backend. Each process times ROUNDS rounds
of PAIRS pairs per size and prints the median microseconds per pair, and the same for a loop of
``time.monotonic_ns()`` (the clock the library reads at every vmm free) and of an empty Python
loop (the floor of any pair). Then the same pairs cold: before each, EVICT_BYTES of host memory
are written (more than a core's L2 cache), as a workload's own host code between two allocations
evicts the allocator's data, and the median of COLD_PAIRS single pairs is printed beside the
timer's own median.

Invariant: a configuration's figure comes only from its own process's timed loops; nothing is
averaged across processes here (the caller reads every line).
"""

import os
import statistics
import subprocess
import sys
import time

import diag_configs  # (run as a file: bench/ is on the path)

SIZES = (1024, 1 << 20, 64 << 20)
PAIRS = 20000
ROUNDS = 7
COLD_PAIRS = 3000
EVICT_BYTES = 8 << 20


def child(config: str) -> None:
    if diag_configs.uses_streampool(config):
        import streampool

        streampool.install()
    import torch

    torch.cuda.init()
    x = torch.empty(1, device="cuda")
    del x
    torch.cuda.synchronize()

    def timed(body) -> float:
        rounds = []
        for _ in range(ROUNDS):
            began = time.perf_counter()
            body()
            rounds.append((time.perf_counter() - began) / PAIRS * 1e6)
        return statistics.median(rounds)

    for size in SIZES:

        def loop(size=size):
            for _ in range(PAIRS):
                y = torch.empty(size, dtype=torch.uint8, device="cuda")
                del y

        loop()
        torch.cuda.synchronize()
        print(f"PAIRS {config} {size} {timed(loop):.3f} us/pair", flush=True)

    def clock():
        for _ in range(PAIRS):
            time.monotonic_ns()

    def empty():
        for _ in range(PAIRS):
            pass

    # Cold: the host's caches evicted before each pair (EVICT_BYTES written, more than a core's
    # L2, less than a shared L3), as a workload's own host code between two allocations does.
    import ctypes

    evict = ctypes.create_string_buffer(EVICT_BYTES)

    def cold(make) -> float:
        times = []
        for i in range(COLD_PAIRS):
            ctypes.memset(evict, i & 0xFF, EVICT_BYTES)
            began = time.perf_counter_ns()
            make()
            times.append(time.perf_counter_ns() - began)
        return statistics.median(times) / 1e3

    floor = cold(lambda: None)
    for size in SIZES:
        pair = cold(lambda size=size: torch.empty(size, dtype=torch.uint8, device="cuda"))
        print(f"PAIRS {config} {size} cold {pair:.3f} us/pair (the timer alone {floor:.3f})",
              flush=True)

    print(f"PAIRS {config} monotonic_ns {timed(clock):.3f} us/call", flush=True)
    print(f"PAIRS {config} empty_loop {timed(empty):.3f} us/iteration", flush=True)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            print(f"PAIRS clocksource {f.read().strip()}")
    except OSError as exc:
        print(f"PAIRS clocksource unknown ({exc})")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    configs = diag_configs.chosen()
    order = list(configs) + list(reversed(configs))
    for config in order:
        env = dict(os.environ, **configs[config])
        argv = ["taskset", "-c", str(cpu), sys.executable, __file__, "--child", config]
        subprocess.run(argv, env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

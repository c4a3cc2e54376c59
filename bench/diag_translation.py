"""Whether kernels run slower on memory made of many small physical handles (a GPU diagnostic:
``scripts/gpu-diag translation``).

vmm maps one 2 MiB handle a page unless memory cycles (then spans of up to 256 MiB); native and
expandable segments map 20 MiB or more at a time. If the GPU's address translation covers a
contiguous mapping of one handle better than many adjacent handles, kernels that touch memory
widely run slower on vmm whatever the allocator's own time. Each configuration runs in a process
of its own (``diag_configs``, ABBA order): it allocates TENSOR_BYTES as one tensor and as
SMALL_TENSORS tensors of 2 MiB, then times on the GPU (CUDA events, median of ROUNDS):
- ``gather``: GATHER random 4-byte reads across the tensor (translation-bound);
- ``sum``: a streaming read of the tensor (bandwidth-bound);
- ``matmul``: BERT-sized GEMMs (4096x1024 by 1024x4096) whose operands lie in the memory;
- ``small adds``: one add per 2 MiB tensor, SMALL_TENSORS launches (host- and launch-bound;
  milliseconds of wall time, synchronised at the end).

Invariant: a figure comes only from its own process's timed loops; each line names its
configuration and the handles' size in force (the variables it ran with).
"""

import os
import statistics
import sys
import time

import diag_configs  # (run as a file: bench/ is on the path)

TENSOR_BYTES = 1 << 30
SMALL_TENSORS = 256
GATHER = 1 << 24
ROUNDS = 21


def child(config: str) -> None:
    if diag_configs.uses_streampool(config):
        import streampool

        streampool.install()
    import torch

    torch.cuda.init()
    torch.manual_seed(0)
    big = torch.ones(TENSOR_BYTES // 4, device="cuda")
    small = [torch.ones((2 << 20) // 4, device="cuda") for _ in range(SMALL_TENSORS)]
    idx = torch.randint(0, big.numel(), (GATHER,), device="cuda")
    a = big[: 4096 * 1024].view(4096, 1024)
    b = big[4096 * 1024 : 4096 * 1024 + 1024 * 4096].view(1024, 4096)
    torch.cuda.synchronize()

    def gpu_ms(body) -> float:
        times = []
        for _ in range(ROUNDS):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            body()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def wall_ms(body) -> float:
        times = []
        for _ in range(ROUNDS):
            torch.cuda.synchronize()
            began = time.perf_counter()
            body()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - began) * 1e3)
        return statistics.median(times)

    def small_adds():
        for t in small:
            t.add_(1.0)

    figures = {
        "gather": gpu_ms(lambda: big[idx]),
        "sum": gpu_ms(lambda: big.sum()),
        "matmul": gpu_ms(lambda: [a @ b for _ in range(4)]),
        "small adds (wall)": wall_ms(small_adds),
        "small adds (GPU)": gpu_ms(small_adds),
    }
    knobs = {k: v for k, v in os.environ.items() if k.startswith(("STREAMPOOL_", "PYTORCH_CUDA"))}
    shown = ", ".join(f"{k} {v:.3f} ms" for k, v in figures.items())
    print(f"{config}: {shown}  [{' '.join(f'{k}={v}' for k, v in sorted(knobs.items()))}]")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    configs = list(diag_configs.chosen())
    for config in configs + configs[::-1]:
        diag_configs.run_child(__file__, config, [])
    return 0


if __name__ == "__main__":
    sys.exit(main())

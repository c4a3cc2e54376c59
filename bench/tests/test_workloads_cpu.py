"""Opt-in smoke test of the workload builders on the CPU (torch, torchvision and transformers
needed; not run in CI): ``BENCH_CPU_SMOKE=1 python3 -m pytest bench/tests/test_workloads_cpu.py``.
Each builder runs one small step of its own kind, so an API mistake (a renamed transformers
argument, a wrong cache attribute) shows here rather than on the GPU. multistream needs CUDA
streams and compiled CUDA graphs: they are left out."""

import os

import pytest

from bench import workloads
from bench import schedules as s

pytestmark = pytest.mark.skipif(
    os.environ.get("BENCH_CPU_SMOKE") != "1", reason="opt-in: set BENCH_CPU_SMOKE=1"
)

# Small parameters of each workload's own kind (the schedules' shapes are too big for a CPU).
SMALL_STEPS = {
    "empty_1KiB": 100,
    "empty_64MiB": 2,
    "churn": (4096, 2**20, 512) * 30,
    "llama_decode": (2, 8),
    "bert": (2, 16),
    "gpt2": 16,
    "resnet50": 2,
    "vision_sizes": (2, 96, 64),
}


@pytest.mark.parametrize("workload", sorted(SMALL_STEPS))
def test_builder_runs_a_small_step_on_the_cpu(workload):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    step = workloads.build(torch, workload, "cpu")
    for _ in range(2):
        step(SMALL_STEPS[workload])


def test_llama_decode_grows_the_kv_cache_every_token():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    seen = []
    original = torch.cat

    def recording_cat(tensors, *args, **kwargs):
        result = original(tensors, *args, **kwargs)
        if result.dim() == 4:  # (batch, kv heads, positions, head dim)
            seen.append(result.shape[2])
        return result

    step = workloads.build(torch, "llama_decode", "cpu")
    torch.cat = recording_cat
    try:
        step((1, 8))
    finally:
        torch.cat = original
    # every decode token concatenates one position onto each layer's keys and values
    assert max(seen) == 8 + s.LLAMA_NEW_TOKENS - 1
    assert set(range(9, 8 + s.LLAMA_NEW_TOKENS)) <= set(seen)

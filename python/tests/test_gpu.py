"""GPU tests: PyTorch on a CUDA device with streampool installed.

A process can install an allocator only once, so every case runs in a fresh process through
gpu_cases/run.py, which asserts inside; here we check its exit status and compare runs. The
subprocesses get the real CUDA driver: the simulated-driver settings of conftest are removed.
"""

import json
import math
import os
from typing import Optional

import pytest
from helpers import describe, run_python

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_cases", "run.py")


def _missing_gpu() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


MISSING = _missing_gpu()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"GPU tests need PyTorch and a CUDA GPU: {MISSING}")


def gpu_env():
    """The real CUDA driver (no STREAMPOOL_DRIVER=sim) and deterministic cuBLAS for training."""
    env = {name: None for name in os.environ if name.startswith("STREAMPOOL_") and name != "STREAMPOOL_LIBRARY"}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return env


def run_case(name: str, allocator: str = "streampool") -> str:
    """Runs one case in a fresh process; fails the test with its output if it fails. Returns stdout."""
    proc = run_python(args=[RUNNER, "--allocator", allocator, name], env=gpu_env(), timeout=600)
    assert proc.returncode == 0, describe(proc)
    assert f"CASE {name} ({allocator}) passed" in proc.stdout, describe(proc)
    return proc.stdout


def tagged_line(stdout: str, tag: str) -> str:
    """The text after ``tag`` on the line that starts with it."""
    lines = [line[len(tag):].strip() for line in stdout.splitlines() if line.startswith(tag)]
    assert len(lines) == 1, f"expected one {tag!r} line in:\n{stdout}"
    return lines[0]


@pytest.mark.parametrize(
    "case",
    [
        "tensor_sizes",
        "empty_cache",
        "memory_fraction",
        "out_of_memory",
        "threads",
        "backward",
        "graph_whole_network",
        "graph_make_graphed_callables",
        "install_twice",
    ],
)
def test_case_under_streampool(case):
    run_case(case)


def test_scoped_mempool_without_install():
    run_case("scoped_mempool", allocator="scoped")


def test_install_after_cuda_initialisation_is_refused_with_advice():
    run_case("install_after_cuda_init", allocator="native")


def test_record_stream_hook_keeps_side_stream_data_correct(capsys):
    with_hook = run_case("record_stream")
    assert "corrupted=0/20" in with_hook
    without_hook = run_case("record_stream", allocator="streampool-no-record-stream-hook")
    with capsys.disabled():  # information, not an assertion: the hazard the hook prevents
        print(f"\nwithout the record_stream hook: {tagged_line(without_hook, 'RECORD_STREAM')}")


def test_peak_allocated_bytes_match_native():
    native = int(tagged_line(run_case("peak_workload", allocator="native"), "PEAK_BYTES"))
    ours = int(tagged_line(run_case("peak_workload"), "PEAK_BYTES"))
    assert ours == native > 0


@pytest.mark.parametrize("model", ["resnet18", "gpt2"])
def test_training_losses_match_native(model, capsys):
    native = json.loads(tagged_line(run_case(model, allocator="native"), "LOSSES"))
    ours = json.loads(tagged_line(run_case(model), "LOSSES"))
    assert len(ours) == len(native) == 200
    assert all(math.isfinite(x) for x in ours)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, native))
    with capsys.disabled():
        print(f"\n{model}: 200 steps, largest relative loss difference to native {worst:.2e}")
    assert worst <= 1e-3, list(zip(ours, native))


def test_demo_runs_on_the_gpu():
    proc = run_python(args=["-m", "streampool", "demo"], env=gpu_env(), timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.startswith("streampool demo on GPU: "), describe(proc)
    assert "streampool memory summary, device 0 (driver cuda)" in proc.stdout

"""GPU tests for sharing CUDA tensors between processes: each scenario of
gpu_cases/ipc_procs.py runs as a producer process that spawns its consumers."""

import os

import pytest
from helpers import describe, run_python
from test_gpu import MISSING, gpu_env, tagged_line

pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"GPU tests need PyTorch and a CUDA GPU: {MISSING}")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_cases", "ipc_procs.py")


@pytest.mark.parametrize("scenario", ["queue", "hogwild", "many", "errors"])
def test_sharing_cuda_tensors_between_processes(scenario, capsys):
    proc = run_python(args=[SCRIPT, scenario], env=gpu_env(), timeout=600)
    assert proc.returncode == 0, describe(proc)
    line = tagged_line(proc.stdout, f"IPC {scenario}:")
    for bad in ("Traceback", "panicked", "[ERROR"):
        assert bad not in proc.stderr, describe(proc)
    with capsys.disabled():
        print(f"\nipc {scenario}: {line}")

"""GPU tests: PyTorch's memory functions under install() in a training loop that logs them, and
``streampool compare`` on a small training script (DataLoader workers started with spawn)."""

import json
import os
import sys

import pytest
from helpers import describe, run_python
from test_gpu import MISSING, gpu_env, run_case

pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"GPU tests need PyTorch and a CUDA GPU: {MISSING}")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_cases", "train_gpt2.py")


def test_pytorch_memory_functions_log_streampools_figures(capsys):
    out = run_case("torch_memory_functions")
    steps = [line for line in out.splitlines() if line.startswith("TORCH_STATS")]
    assert len(steps) == 5, out
    with capsys.disabled():
        print(f"\ntorch stats: {steps[-1]}")


def test_pytorch_memory_functions_opted_out_raise_as_pytorch_has_them():
    run_case("torch_memory_functions_opted_out", allocator="streampool-no-torch-stats")


def test_compare_on_a_training_script(tmp_path, capsys):
    pytest.importorskip("transformers")
    plot, results = tmp_path / "compare.png", tmp_path / "compare.json"
    command = [sys.executable, SCRIPT, "--model", "tiny", "--steps", "12"]
    proc = run_python(
        args=["-m", "streampool", "compare", "--allocators", "native,expandable,streampool", "--plot", str(plot),
              "--json", str(results), "--log-dir", str(tmp_path / "logs"), "--", *command],
        env=gpu_env(), timeout=540,
    )
    assert proc.returncode == 0, describe(proc)
    assert plot.read_bytes()[:4] == b"\x89PNG"
    runs = json.loads(results.read_text())["runs"]
    assert len(runs) == 12 and all(r["failure"] is None for r in runs), describe(proc)
    assert all(r["peak_bytes"] and r["peak_tensor_bytes"] for r in runs), describe(proc)
    assert all(r["source"] == runs[0]["source"] for r in runs)
    # Every streampool run's processes that used CUDA had streampool installed (else it fails).
    stdout = proc.stdout
    with capsys.disabled():
        print("\ncompare on train_gpt2.py --model tiny:\n" + stdout[stdout.index("memory: "):])

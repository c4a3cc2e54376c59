"""GPU tests: PyTorch features that depend on the allocator keep working under install(), on
the backend under test, and give what they give under PyTorch's native allocator.

Each case (gpu_cases/parity.py) runs in a fresh process under native, then under streampool; both
must pass and their printed figures agree. On the pool backend each case also runs under
streampool's library as a plain CUDAPluggableAllocator (what PyTorch gives any pluggable
allocator), for the record only. Where STREAMPOOL_TEST_PARITY_RESULTS names a file, each
outcome is added to it as a JSON line (scripts/gpu-check keeps them with the run's logs; the
parity table of the docs is made from them).
"""

import json
import math
import os
import subprocess
import time

import pytest
from test_gpu import MISSING, RUNNER, gpu_env, TEST_BACKEND
from helpers import describe, run_python

pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"GPU tests need PyTorch and a CUDA GPU: {MISSING}")

# case -> relative tolerance between native's and streampool's figures (None: equal).
CASES = {
    "cudnn_benchmark": 2e-2,  # cuDNN may pick other algorithms on another run
    "typed_out_of_memory": None,
    "memory_fraction_round_trip": None,
    "accelerator_memory_stats": None,
    "memory_history_snapshot": None,
    "mempool": None,
    "graph_shared_pool": 1e-4,
    "make_graphed_callables": 1e-4,
    "compile_reduce_overhead_inference": 1e-3,
    "compile_reduce_overhead_training": 1e-3,
    "compile_max_autotune": 2e-2,  # autotuning may pick other kernels on another run
}


def _run(case: str, allocator: str, timeout: float = 900):
    """(passed, figures or the failure's output tail, seconds)."""
    start = time.perf_counter()
    try:
        proc = run_python(args=[RUNNER, "--allocator", allocator, case], env=gpu_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    tag = f"RESULT {case} "
    lines = [l[len(tag):] for l in proc.stdout.splitlines() if l.startswith(tag)]
    if proc.returncode != 0 or len(lines) != 1:
        return False, describe(proc)[-3000:], seconds
    return True, json.loads(lines[0]), seconds


def _agree(a, b, rtol) -> bool:
    if rtol is None or not isinstance(a, list):
        return a == b
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rtol, abs_tol=rtol) for x, y in zip(a, b))


def _record(case: str, outcome: dict) -> None:
    path = os.environ.get("STREAMPOOL_TEST_PARITY_RESULTS")
    if path:
        import torch

        where = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, "backend": TEST_BACKEND or "pool", **where, **outcome}) + "\n")


@pytest.mark.parametrize("case", list(CASES))
def test_feature_under_install_works_and_matches_native(case, capsys):
    native_ok, native, native_s = _run(case, "native")
    streampool_ok, ours, ours_s = _run(case, "streampool")
    agree = native_ok and streampool_ok and _agree(native, ours, CASES[case])
    outcome = {"native": native_ok, "streampool": streampool_ok, "agree": agree,
               "native_s": round(native_s, 1), "streampool_s": round(ours_s, 1)}
    if (TEST_BACKEND or "pool") == "pool":
        plain_ok, plain, _ = _run(case, "pluggable", timeout=240)
        outcome["pluggable"] = plain_ok and _agree(native, plain, CASES[case])
        outcome["pluggable_error"] = None if plain_ok else str(plain).strip().splitlines()[-1][:200]
    _record(case, outcome)
    with capsys.disabled():
        print(f"\nPARITY {case} backend={TEST_BACKEND or 'pool'} native={native_ok} "
              f"streampool={streampool_ok} agree={agree}")
    assert native_ok, f"{case} fails under PyTorch's native allocator:\n{native}"
    assert streampool_ok, f"{case} fails under streampool:\n{ours}"
    assert agree, f"{case}: native gave {native}, streampool {ours}"

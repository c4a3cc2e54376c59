"""GPU tests: PyTorch features that depend on the allocator keep working under install(), on
the backend under test, and give what they give under PyTorch's native allocator.

Each case (gpu_cases/parity.py, parity_snapshots.py) runs in a fresh process under native, then under streampool; both
must pass and their printed figures agree, unless streampool's result is a difference docs/parity.md
documents (KNOWN_DIFFERENCES: the case asserts what streampool must do instead, and the table shows
the difference, not a tick). On the pool backend each case also runs under
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
from typing import Optional

import pytest
from conftest import BACKEND
from test_gpu import MISSING, RUNNER, gpu_env
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
    # Second round (issue 40).
    "multiprocessing_queue": None,
    "alloc_conf_environment": None,
    "allocator_backend": None,
    "set_allocator_settings": None,
    "snapshot_adds_up": None,
    "memory_history_frames": None,
    "mempool_own_allocator": None,
}

# Environment a case needs from the start of its process (under every allocator alike).
CASE_ENV = {
    "alloc_conf_environment": {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,pinned_use_cuda_host_register:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True,garbage_collection_threshold:0.8",
    },
}


def _refused_at_put(ours) -> Optional[str]:
    """On the pool backend the plain install() cannot share a tensor of an ordinary pool: what is
    wanted then is the refusal raised by put itself (the case asserts it came at once, in the
    caller). On the vmm backend every tensor shares (its pages are exportable): no difference."""
    if BACKEND == "vmm":
        return None
    if isinstance(ours, dict) and ours.get("delivered") is False and ours.get("refused_at_put"):
        return f"raises at `put`: {ours['refused_at_put']}"
    return None


def _pluggable_name(ours) -> Optional[str]:
    if ours == {"backend": "pluggable"}:
        return "returns `pluggable`, PyTorch's name for every pluggable allocator"
    return None


# case -> what streampool gives instead of native's result where that difference is known and
# documented (docs/parity.md): a function of streampool's result returning the difference's
# description, or None if the result is not that difference. The table shows the description.
KNOWN_DIFFERENCES = {
    "multiprocessing_queue": _refused_at_put,
    "allocator_backend": _pluggable_name,
}


def _run(case: str, allocator: str, timeout: float = 900):
    """(passed, figures or the failure's output tail, seconds)."""
    start = time.perf_counter()
    env = {**gpu_env(), **CASE_ENV.get(case, {})}
    try:
        proc = run_python(args=[RUNNER, "--allocator", allocator, case], env=env, timeout=timeout)
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
            f.write(json.dumps({"case": case, "backend": BACKEND, **where, **outcome}) + "\n")


@pytest.mark.parametrize("case", list(CASES))
def test_feature_under_install_works_and_matches_native(case, capsys):
    native_ok, native, native_s = _run(case, "native")
    streampool_ok, ours, ours_s = _run(case, "streampool")
    agree = native_ok and streampool_ok and _agree(native, ours, CASES[case])
    known = KNOWN_DIFFERENCES.get(case)
    difference = known(ours) if known is not None and streampool_ok and not agree else None
    outcome = {"native": native_ok, "streampool": streampool_ok, "agree": agree,
               "native_s": round(native_s, 1), "streampool_s": round(ours_s, 1)}
    if difference is not None:
        outcome["difference"] = difference
    if BACKEND == "pool":
        plain_ok, plain, _ = _run(case, "pluggable", timeout=240)
        outcome["pluggable"] = plain_ok and _agree(native, plain, CASES[case])
        outcome["pluggable_error"] = None if plain_ok else str(plain).strip().splitlines()[-1][:200]
    _record(case, outcome)
    with capsys.disabled():
        print(f"\nPARITY {case} backend={BACKEND} native={native_ok} "
              f"streampool={streampool_ok} agree={agree}" + (f" difference={difference}" if difference else ""))
    assert native_ok, f"{case} fails under PyTorch's native allocator:\n{native}"
    assert streampool_ok, f"{case} fails under streampool:\n{ours}"
    assert agree or difference is not None, f"{case}: native gave {native}, streampool {ours}"

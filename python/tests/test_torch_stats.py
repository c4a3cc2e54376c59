"""PyTorch's memory functions under install(): torch.cuda.memory_stats() and the functions over
it read streampool's statistics (simulated driver, the stand-in torch of stand_ins/ in a
subprocess: it runs PyTorch's own logic over torch._C, which raises for pluggable allocators)."""

import json

import pytest
from helpers import describe, run_python, stand_in_torch_env

# Routes PyTorch's functions to streampool on the simulated driver (install() refuses it, so the
# routing is called as install() calls it) and prints what they return, as JSON.
ROUTED = """
import json, torch, streampool
from streampool import _lib, _torch_stats
_torch_stats.route(torch)
out = {}
def record(name, value):
    out[name] = value
BODY
print(json.dumps(out))
"""


def routed(body: str) -> dict:
    proc = run_python(ROUTED.replace("BODY", body), env=stand_in_torch_env(FAKE_TORCH_CUDA_INITIALISED="1"))
    assert proc.returncode == 0, describe(proc)
    return json.loads(proc.stdout.splitlines()[-1])


def test_pytorch_functions_follow_allocations_with_pytorch_meanings():
    out = routed(
        """
a = _lib.malloc(3000, 0)
b = _lib.malloc(1 << 20, 0)
record("allocated", torch.cuda.memory_allocated())
record("reserved", torch.cuda.memory_reserved())
_lib.free(b, 1 << 20, 0)
record("after_free", torch.cuda.memory_allocated())
record("peak", torch.cuda.max_memory_allocated())
record("max_reserved", torch.cuda.max_memory_reserved())
torch.cuda.reset_peak_memory_stats()
record("peak_after_reset", torch.cuda.max_memory_allocated("cuda:0"))
record("own", {k: v for k, v in streampool.memory_stats().items()})
record("torch", dict(torch.cuda.memory_stats()))
"""
    )
    assert out["allocated"] == 3000 + (1 << 20)
    assert out["after_free"] == 3000
    assert out["peak"] == 3000 + (1 << 20)
    assert out["peak_after_reset"] == 3000
    assert out["reserved"] > 0 and out["max_reserved"] >= out["reserved"]
    own, torch_keys = out["own"], out["torch"]
    # Every PyTorch key streampool fills carries streampool's counter of the same meaning.
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
                "reserved_bytes.all.current", "active_bytes.all.current", "allocation.all.current",
                "allocation.all.allocated", "num_ooms", "num_alloc_retries", "num_device_alloc"):
        assert torch_keys[key] == own[key], key
    # PyTorch's requested_bytes is what callers asked for: streampool's allocated figure.
    for part in ("current", "peak", "allocated", "freed"):
        assert torch_keys[f"requested_bytes.all.{part}"] == own[f"allocated_bytes.all.{part}"]
    assert torch_keys["streampool.cached_bytes"] == own["cached_bytes"]


def test_keys_streampool_cannot_know_are_absent_not_zero():
    out = routed('record("keys", sorted(torch.cuda.memory_stats()))')
    keys = out["keys"]
    for prefix in ("segment.", "inactive_split", "oversize_", "active.", "num_sync_all_streams", "max_split_size"):
        assert not any(k.startswith(prefix) for k in keys), prefix
    assert not any(".large_pool." in k or ".small_pool." in k for k in keys)
    assert "reserved_bytes.all.allocated" not in keys and "active_bytes.all.freed" not in keys
    assert "allocated_bytes.all.peak" in keys and "num_ooms" in keys


def test_each_device_has_its_own_figures():
    out = routed(
        """
a = _lib.malloc(4096, 1)
record("zero", torch.cuda.memory_allocated(0))
record("one", torch.cuda.memory_allocated(1))
"""
    )
    assert out == {"zero": 0, "one": 4096}


def test_reset_accumulated_restarts_pytorch_totals_only():
    out = routed(
        """
a = _lib.malloc(4096, 0); _lib.free(a, 4096, 0)
torch.cuda.reset_accumulated_memory_stats()
b = _lib.malloc(512, 0)
record("torch", dict(torch.cuda.memory_stats()))
record("own", streampool.memory_stats())
"""
    )
    assert out["torch"]["allocated_bytes.all.allocated"] == 512
    assert out["torch"]["allocation.all.allocated"] == 1
    assert out["torch"]["allocated_bytes.all.freed"] == 0
    assert out["torch"]["allocated_bytes.all.current"] == 512  # current figures are not totals
    assert out["own"]["allocated_bytes.all.allocated"] == 4096 + 512


def test_memory_summary_is_streampools_table():
    out = routed('record("summary", torch.cuda.memory_summary()); record("module", torch.cuda.memory.memory_summary(0, abbreviated=True))')
    for text in out.values():
        assert "streampool memory summary, device 0 (driver sim)" in text
        assert "Allocated memory" in text


def test_a_bad_device_names_the_index():
    out = routed(
        """
try:
    torch.cuda.memory_stats(7)
except streampool.StreampoolError as exc:
    record("error", str(exc))
"""
    )
    assert "device index 7 is out of range" in out["error"]


# install() with the stand-in torch and the CUDA driver named (never loaded: nothing here needs it).
INSTALL = """
import torch, streampool
from streampool import _torch_stats
allocator = streampool.install(OPTIONS)
torch.cuda.init()
print(streampool.is_installed(), allocator is not None)
print(torch._C._cuda_memoryStats is _torch_stats.memory_stats_nested,
      torch._C._cuda_resetPeakMemoryStats is _torch_stats.reset_peak,
      torch.cuda.memory_summary.__module__, torch.cuda.memory.memory_summary.__module__)
if not _torch_stats._saved:
    try:
        torch.cuda.max_memory_allocated()
    except RuntimeError as exc:
        print(str(exc).split(".")[0])
"""


@pytest.mark.parametrize("options, routes", [("", True), ("torch_stats=True", True), ("torch_stats=False", False)])
def test_install_routes_pytorch_statistics_unless_told_not_to(options, routes):
    env = stand_in_torch_env(FAKE_TORCH_GPU="1", STREAMPOOL_DRIVER=None)
    proc = run_python(INSTALL.replace("OPTIONS", options), env=env)
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == "True True", describe(proc)
    if routes:
        assert lines[1] == "True True streampool._torch_stats streampool._torch_stats", describe(proc)
    else:
        assert lines[1] == "False False torch.cuda.memory torch.cuda.memory", describe(proc)
        assert lines[2] == "CUDAPluggableAllocator does not yet support getDeviceStats", describe(proc)


def test_install_without_a_gpu_says_so_in_one_line_and_leaves_pytorch_and_the_environment_alone():
    code = (
        "import os, torch, streampool\n"
        "print(streampool.install(backend='pool', release_threshold='1GiB'), streampool.is_installed(), "
        "torch._C.pluggable_allocator_current)\n"
        "print(os.environ.get('STREAMPOOL_BACKEND'), os.environ.get('STREAMPOOL_RELEASE_THRESHOLD'))\n"
    )
    env = stand_in_torch_env(FAKE_TORCH_GPU=None, STREAMPOOL_DRIVER=None, STREAMPOOL_BACKEND="vmm")
    proc = run_python(code, env=env)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["None", "False", "False", "vmm", "None"], describe(proc)
    assert proc.stderr.strip().splitlines() == [
        "streampool.install(): PyTorch finds no CUDA GPU (torch.cuda.is_available() is False), "
        "so nothing was installed; CPU tensors are unaffected"
    ], describe(proc)

"""The virtual-memory backend as Python sees it (STREAMPOOL_BACKEND=vmm, simulated driver, no
torch): the install option, `info`, statistics, and the timeline's mappings as PyTorch segments.
Each case runs in a fresh process, since the backend is read once per process."""

from helpers import describe, run_python

VMM = {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_SIM_MEMORY": "1GiB"}

CYCLE = """
import streampool
from streampool import _lib
MiB = 1 << 20
streampool.record_history(True)
a = _lib.malloc(5 * MiB, 0, 7)
_lib.free(a, 5 * MiB, 0, 7)
streampool.empty_cache()
"""


def test_install_option_sets_the_backend_variable():
    from streampool._config import option_environment

    assert option_environment({"backend": "vmm", "vmm_page_size": "20MiB"}) == {
        "STREAMPOOL_BACKEND": "vmm",
        "STREAMPOOL_VMM_PAGE_SIZE": "20MiB",
    }


def test_a_large_block_is_mapped_in_pages_counted_and_released_by_empty_cache():
    code = CYCLE + """
s = streampool.memory_stats(0)
assert (s["num_maps"], s["num_unmaps"]) == (3, 3), s
assert s["reserved_bytes.all.current"] == 0, s
print("ok")
"""
    proc = run_python(code, env=VMM)
    assert proc.returncode == 0 and "ok" in proc.stdout, describe(proc)


def test_snapshots_show_mappings_as_pytorch_segment_maps():
    code = CYCLE + """
snap = streampool.snapshot()
actions = [t["action"] for t in snap["device_traces"][0]]
assert actions.count("segment_map") == 3 and actions.count("segment_unmap") == 3, actions
assert all(isinstance(t["addr"], int) and t["size"] == 2 * MiB for t in snap["device_traces"][0]
           if t["action"].startswith("segment_") and "map" in t["action"])
print("ok")
"""
    proc = run_python(code, env=VMM)
    assert proc.returncode == 0 and "ok" in proc.stdout, describe(proc)


def test_info_names_the_backend_and_virtual_memory_support():
    proc = run_python(args=["-m", "streampool", "info"], env=VMM)
    assert proc.returncode == 0, describe(proc)
    assert "STREAMPOOL_BACKEND" in proc.stdout and "= vmm  (environment)" in proc.stdout, proc.stdout
    assert "virtual memory (STREAMPOOL_BACKEND=vmm) supported" in proc.stdout, proc.stdout


def test_a_malformed_backend_is_refused_naming_what_is_accepted():
    code = "import streampool; streampool._lib.check_config()"
    proc = run_python(code, env={"STREAMPOOL_BACKEND": "expandable"})
    assert proc.returncode != 0
    assert "STREAMPOOL_BACKEND" in proc.stderr and "use pool, vmm, managed" in proc.stderr, describe(proc)


def test_a_library_older_than_the_vmm_export_still_loads_for_a_benchmark_a_b():
    code = """
import streampool
from streampool import _lib
_lib._SIGNATURES["streampool_from_the_future"] = (None, [])
_lib._NEWER_EXPORTS = _lib._NEWER_EXPORTS | {"streampool_from_the_future"}
assert streampool.device_count() == 2
try:
    _lib.device_flag("streampool_from_the_future", 0)
except streampool.StreampoolError as exc:
    assert "predates streampool_from_the_future" in str(exc), exc
    print("ok")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and "ok" in proc.stdout, describe(proc)

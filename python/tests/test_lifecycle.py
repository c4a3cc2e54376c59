"""Process lifecycle on the simulated driver: fork() after the library is in use.

CUDA does not survive fork(): a child that allocates must get a clear error, and memory it
inherited from the parent must be left alone (its frees are no-ops). The GPU twin of this test,
with torch tensors, is in test_gpu.py.
"""

from helpers import describe, run_python

FORK_AFTER_USE = r"""
import os
from streampool import _lib

inherited = _lib.malloc(4096, 0, None)
pid = os.fork()
if pid == 0:
    code = 0
    try:
        _lib.malloc(4096, 0, None)
        code = 3  # must not work
    except _lib.StreampoolError as e:
        print("CHILD ERROR:", e, flush=True)
        if "fork()" not in str(e) or "spawn" not in str(e):
            code = 4
    try:
        _lib.free(inherited, 4096, 0, None)  # the parent's memory: nothing to do, no error
    except Exception as e:
        print("CHILD FREE FAILED:", e, flush=True)
        code = 5
    os._exit(code)
_, status = os.waitpid(pid, 0)
print("CHILD EXIT", os.waitstatus_to_exitcode(status))
assert _lib.get_stats(0).allocated_bytes == 4096, "the child's free must not reach the parent"
_lib.free(inherited, 4096, 0, None)
again = _lib.malloc(1 << 20, 0, None)
_lib.free(again, 1 << 20, 0, None)
assert _lib.get_stats(0).allocated_bytes == 0
print("PARENT OK")
"""


def test_a_fork_child_gets_a_clear_error_and_leaves_the_parents_memory_alone():
    proc = run_python(FORK_AFTER_USE)
    assert proc.returncode == 0, describe(proc)
    assert "CHILD EXIT 0" in proc.stdout, describe(proc)
    assert "CHILD ERROR: streampool cannot allocate in a fork() child" in proc.stdout, describe(proc)
    assert "PARENT OK" in proc.stdout, describe(proc)

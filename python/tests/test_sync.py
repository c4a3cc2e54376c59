"""torch.cuda.synchronize() under install() tells streampool (simulated driver, the stand-in torch
of stand_ins/ in a subprocess): on the vmm backend a release threshold applies at the
synchronisation, as a CUDA pool's does; without one nothing changes."""

import json

from helpers import describe, run_python, stand_in_torch_env

SCRIPT = """
import json, torch, streampool
from streampool import _lib, _sync
_sync.route(torch)  # as install() does
a = _lib.malloc(8 << 20, 0)
_lib.free(a, 8 << 20, 0)
held = streampool.memory_reserved(0)
torch.cuda.synchronize()
no_threshold = streampool.memory_reserved(0)
streampool.set_release_threshold(0, 0)
torch.cuda.synchronize()
print(json.dumps([held, no_threshold, streampool.memory_reserved(0), torch._C.synchronize_calls]))
"""


def test_a_release_threshold_applies_at_torch_cuda_synchronize_on_vmm():
    env = stand_in_torch_env(FAKE_TORCH_CUDA_INITIALISED="1", STREAMPOOL_BACKEND="vmm")
    proc = run_python(SCRIPT, env=env)
    assert proc.returncode == 0, describe(proc)
    held, no_threshold, with_threshold, calls = json.loads(proc.stdout.splitlines()[-1])
    assert held >= 8 << 20, "the freed block's pages are kept"
    assert no_threshold == held, "no threshold: torch.cuda.synchronize() changes nothing"
    assert with_threshold == 0, "threshold 0: everything unused goes back at the synchronisation"
    assert calls == 2, "PyTorch's own synchronisation ran each time"



ORDER = """
import json, torch
from streampool import _lib, _sync
lib = _lib.library()
seen = []  # (what, device, PyTorch's synchronisations so far)
begin, end = lib.streampool_synchronizing, lib.streampool_synchronized
def note(what, call):
    return lambda d: seen.append((what, d, torch._C.synchronize_calls)) or call(d)
def route_with(before):
    # route() looks the library's functions up once: these, as install() would find them.
    _sync.restore()
    lib.streampool_synchronizing, lib.streampool_synchronized = before, note("end", end)
    _sync.route(torch)
route_with(note("begin", begin))
torch.cuda.synchronize()
def failing(d):
    raise OSError("no mark")
route_with(failing)  # the part before fails: PyTorch's still runs
torch.cuda.synchronize()
route_with(None)  # a library without it
torch.cuda.synchronize()
route_with(note("begin", begin))
torch._C.current_device_index = 1  # the program made device 1 current (as synchronize(1) does)
torch.cuda.synchronize()
print(json.dumps(seen + [("pytorch", 0, torch._C.synchronize_calls)]))
"""


def test_streampool_hears_of_the_synchronisation_as_it_begins_and_once_it_has_returned():
    env = stand_in_torch_env(FAKE_TORCH_CUDA_INITIALISED="1")
    proc = run_python(ORDER, env=env)
    assert proc.returncode == 0, describe(proc)
    seen = [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]
    assert seen == [
        ("begin", 0, 0),  # before PyTorch's synchronisation
        ("end", 0, 1),  # after it
        ("end", 0, 2),  # the part before failed: PyTorch's ran, and the end
        ("end", 0, 3),  # an older library: the end alone
        ("begin", 1, 3),  # the current device's, asked at each synchronisation
        ("end", 1, 4),
        ("pytorch", 0, 4),
    ], seen


OLDER = """
import json, torch
from streampool import _lib, _sync
lib = _lib.library()
original = torch._C._cuda_synchronize
lib.streampool_synchronized = None  # a library older than the synchronisation's calls
_sync.route(torch)
torch.cuda.synchronize()
print(json.dumps([torch._C._cuda_synchronize is original, torch._C.synchronize_calls]))
"""


def test_a_library_without_the_synchronisation_calls_leaves_pytorch_s_synchronisation_alone():
    env = stand_in_torch_env(FAKE_TORCH_CUDA_INITIALISED="1")
    proc = run_python(OLDER, env=env)
    assert proc.returncode == 0, describe(proc)
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, 1], describe(proc)

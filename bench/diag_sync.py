"""What ``torch.cuda.synchronize()`` costs the host under install(), beyond PyTorch's own
synchronisation: streampool's wrapper (python/streampool/_sync.py) and the library's two calls
it makes. A CPU diagnostic, on the simulated driver, of a release build that has it:
``cargo build --release --features sim --lib``, then ``STREAMPOOL_DRIVER=sim
STREAMPOOL_LIBRARY=target/release/libstreampool.so python3 -m bench.diag_sync``.

PyTorch's synchronisation is a stand-in that does nothing, so that what is timed is the rest: a
workload that synchronises after every step pays it once a step (multistream's steps take some
290 us on an H200). Prints microseconds per synchronisation: the stand-in alone, the stand-in
routed through the wrapper, and the library's two calls alone (through ctypes, as the wrapper
makes them), each the median of REPEATS runs of CALLS calls.

Invariant: the device has served one allocation before anything is timed (its first use sets
it up), and nothing waits: the library's calls do their least work.
"""

import os
import statistics
import sys
import time
import types
from typing import Callable

CALLS = 100_000
REPEATS = 5


def per_call_us(call: Callable[[], object]) -> float:
    """The median over REPEATS runs of CALLS calls of ``call``, in microseconds a call."""
    runs = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        for _ in range(CALLS):
            call()
        runs.append((time.perf_counter() - began) / CALLS * 1e6)
    return statistics.median(runs)


def main() -> None:
    if os.environ.get("STREAMPOOL_DRIVER") != "sim":
        sys.exit("bench.diag_sync runs on the simulated driver: set STREAMPOOL_DRIVER=sim")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "python"))
    from streampool import _lib, _sync

    lib = _lib.library()
    size, device = 1 << 20, 0
    ptr = _lib.malloc(size, device)
    _lib.free(ptr, size, device)

    def pytorch_synchronize() -> None:
        """Stands in for torch._C._cuda_synchronize."""

    torch = types.SimpleNamespace(
        _C=types.SimpleNamespace(
            _cuda_synchronize=pytorch_synchronize, _cuda_getDevice=lambda: device
        ),
        cuda=types.SimpleNamespace(current_device=lambda: device),
    )
    alone = per_call_us(torch._C._cuda_synchronize)
    _sync.route(torch)
    routed = per_call_us(torch._C._cuda_synchronize)
    _sync.restore()
    begin, end = lib.streampool_synchronizing, lib.streampool_synchronized
    calls = per_call_us(lambda: (begin(device), end(device)))
    print(f"PyTorch's synchronisation (a stand-in): {alone:.2f} us")
    print(f"routed through streampool's wrapper:    {routed:.2f} us ({routed - alone:.2f} us more)")
    print(f"the library's two calls alone:          {calls:.2f} us")


if __name__ == "__main__":
    main()

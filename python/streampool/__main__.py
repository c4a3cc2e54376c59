"""Command line: ``streampool {info,demo,plot}`` (also ``python -m streampool ...``)."""

import argparse
import os
import pickle
import sys
from typing import List, Optional

import streampool

from . import _lib
from ._config import variables_in_effect
from ._stats import format_bytes, format_limit


def _device_line(index: int) -> str:
    s = streampool.memory_stats(index)
    limit = format_limit(s["memory_limit_bytes"])
    return (
        f"device {index}: total {format_bytes(s['device_total_bytes'])}, "
        f"allocated {format_bytes(s['allocated_bytes.all.current'])}, "
        f"reserved {format_bytes(s['reserved_bytes.all.current'])}, "
        f"cached {format_bytes(s['cached_bytes'])}, limit {limit}; "
        f"memory pools {_supported('streampool_pools_supported', index)}, "
        f"shareable pools (IPC) {_supported('streampool_ipc_supported', index)}, "
        f"virtual memory (STREAMPOOL_BACKEND=vmm) {_supported('streampool_vmm_supported', index)}"
    )


def _supported(function: str, index: int) -> str:
    return "supported" if _lib.device_flag(function, index) else "NOT supported"


def _variable_lines() -> List[str]:
    rows = variables_in_effect()
    width = max(len(name) for name, _, _ in rows)
    lines = [f"  {name:<{width}} = {value}  ({source})" for name, value, source in rows]
    library = os.environ.get(_lib.LIBRARY_ENV)
    origin = f"{library}  (environment)" if library else "not set  (package, then checkout)"
    lines.append(f"  {_lib.LIBRARY_ENV:<{width}} = {origin}")
    return lines


def info() -> int:
    """Print where the library is, what it runs on, per-device statistics and its variables.
    Returns 1 if the library cannot be used here (the reason is printed), else 0."""
    status = 0
    try:
        print(f"library: {streampool.library_path()}")
        print(f"version: {streampool.__version__}")
        print(f"driver: {streampool.driver_name()}")
        count = streampool.device_count()
        print(f"devices: {count}")
        for index in range(count):
            print(_device_line(index))
    except (OSError, streampool.StreampoolError) as exc:
        print(f"error: {exc}")
        status = 1
    print("variables:")
    print("\n".join(_variable_lines()))
    return status


DESCRIPTION = (
    "streampool: a PyTorch CUDA allocator over CUDA stream-ordered memory pools. "
    "`info` shows the library, driver, devices and STREAMPOOL_* settings; `demo` allocates through "
    "streampool (on the GPU when PyTorch and a CUDA device are present, else on the simulated driver); "
    "`plot` draws a memory timeline from a snapshot. (The benchmark is `python3 -m bench` in a "
    "source checkout.)"
)


def _reason(exc: BaseException) -> str:
    """One line for ``exc``: an OSError's own words (no errno tuple), else its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    if isinstance(exc, (KeyError, pickle.UnpicklingError, EOFError)):
        return f"not a memory snapshot ({type(exc).__name__}: {exc})"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text


def plot_command(snapshot: str, out: str, device: Optional[int]) -> int:
    try:
        path = streampool.plot_timeline(snapshot, out, device=device)
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as exc:
        print(f"error: cannot plot {snapshot}: {_reason(exc)}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def demo() -> int:
    from ._demo import DemoError, run

    try:
        return run()
    except (DemoError, streampool.StreampoolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


BENCH_MOVED = (
    "the benchmark is a tool of the source repository: from a checkout, "
    "python3 -m bench --help (see BENCHMARKS.md)"
)


def main(argv: Optional[List[str]] = None, prog: str = "streampool") -> int:
    """The ``streampool`` console script; ``python -m streampool`` passes its own ``prog``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the benchmark left the package for the repository's bench/
        print(BENCH_MOVED, file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library, driver, devices, statistics and STREAMPOOL_* variables")
    commands.add_parser("demo", help="allocate through streampool on the GPU, or the simulated driver")
    plot = commands.add_parser("plot", help="draw a snapshot's memory timeline (streampool.dump_snapshot)")
    plot.add_argument("snapshot", help="a pickle from streampool.dump_snapshot (or PyTorch's _dump_snapshot)")
    plot.add_argument("-o", "--out", default="memory.png", help="the PNG to write (default: memory.png)")
    plot.add_argument("--device", type=int, default=None, help="only this device")
    options = parser.parse_args(argv)
    if options.command == "info":
        return info()
    if options.command == "plot":
        return plot_command(options.snapshot, options.out, options.device)
    return demo()


if __name__ == "__main__":
    sys.exit(main(prog="python -m streampool"))

"""Command line: ``python -m streampool {info,demo,bench,plot}``."""

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
        f"shareable pools (IPC) {_supported('streampool_ipc_supported', index)}"
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


def plot_command(snapshot: str, out: str, device: Optional[int]) -> int:
    try:
        path = streampool.plot_timeline(snapshot, out, device=device)
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        print(f"error: cannot plot {snapshot}: {exc!r}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def bench(argv: List[str]) -> int:
    from . import bench as bench_module

    return bench_module.main(argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after "bench" belongs to streampool.bench
        return bench(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m streampool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library, driver, devices, statistics and STREAMPOOL_* variables")
    commands.add_parser("demo", help="allocate through streampool on the GPU, or the simulated driver")
    commands.add_parser("bench", help="benchmarks; arguments go to streampool.bench")
    plot = commands.add_parser("plot", help="draw a snapshot's memory timeline (streampool.dump_snapshot)")
    plot.add_argument("snapshot", help="a pickle from streampool.dump_snapshot (or PyTorch's _dump_snapshot)")
    plot.add_argument("-o", "--out", default="memory.png", help="the PNG to write (default: memory.png)")
    plot.add_argument("--device", type=int, default=None, help="only this device")
    options = parser.parse_args(argv)
    if options.command == "info":
        return info()
    if options.command == "plot":
        return plot_command(options.snapshot, options.out, options.device)
    from ._demo import run

    return run()


if __name__ == "__main__":
    sys.exit(main())

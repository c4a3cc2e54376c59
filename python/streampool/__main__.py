"""Command line: ``streampool {info,demo,plot,compare}`` (also ``python -m streampool ...``).

Invariant: a command that cannot do its job says why in one line on stderr (or stdout for
``info``'s report) and exits non-zero; no traceback reaches the user for a foreseen failure.
"""

import argparse
import os
import pickle
import shutil
import sys
from typing import List, Optional

import streampool

from . import _lib
from ._config import variables_in_effect
from ._probe import cuda_unavailable_reason
from ._stats import format_bytes, format_limit


def _device_line(index: int, simulated: bool = False) -> str:
    s = streampool.memory_stats(index)
    limit = format_limit(s["memory_limit_bytes"])
    return (
        f"{'simulated ' if simulated else ''}device {index}: total {format_bytes(s['device_total_bytes'])}, "
        f"allocated {format_bytes(s['allocated_bytes.all.current'])}, "
        f"reserved {format_bytes(s['reserved_bytes.all.current'])}, "
        f"cached {format_bytes(s['cached_bytes'])}, limit {limit}, {_asleep(index)}; "
        f"memory pools {_supported('streampool_pools_supported', index)}, "
        f"shareable pools (IPC) {_supported('streampool_ipc_supported', index)}, "
        f"virtual memory (STREAMPOOL_BACKEND=vmm) {_supported('streampool_vmm_supported', index)}"
    )


def _asleep(index: int) -> str:
    """``asleep N`` (streampool.sleep()): the device's memory given back while its addresses are
    kept, and what of it waits in host memory; awake, the host buffer kept for the next sleep."""
    asleep = streampool.sleeping_bytes(index)
    if not asleep:
        kept = streampool.sleep_host_buffer_bytes(index)
        return f"asleep 0 B (host buffer {format_bytes(kept)} kept)" if kept else "asleep 0 B"
    saved = streampool.sleep_saved_bytes(index)
    return f"asleep {format_bytes(asleep)} ({format_bytes(saved)} of contents in host memory)"


def _supported(function: str, index: int) -> str:
    return "supported" if _lib.device_flag(function, index) else "NOT supported"


def _variable_lines(driver_note: Optional[str] = None) -> List[str]:
    rows = variables_in_effect()
    if driver_note:
        rows = [(n, v, driver_note if n == "STREAMPOOL_DRIVER" else s) for n, v, s in rows]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"  {name:<{width}} = {value}  ({source})" for name, value, source in rows]
    library = os.environ.get(_lib.LIBRARY_ENV)
    origin = f"{library}  (environment)" if library else "not set  (package, then checkout)"
    lines.append(f"  {_lib.LIBRARY_ENV:<{width}} = {origin}")
    return lines


def _simulate_without_gpu() -> Optional[str]:
    """With STREAMPOOL_DRIVER unset on a machine without a usable CUDA driver: set it to "sim" for
    this process (before the library reads it) and return why; else None."""
    if os.environ.get("STREAMPOOL_DRIVER") or _lib.is_loaded():
        return None
    reason = cuda_unavailable_reason()
    if reason is not None:
        os.environ["STREAMPOOL_DRIVER"] = "sim"
    return reason


def info() -> int:
    """Print where the library is, what it runs on, per-device statistics and its variables.
    Without a GPU (and no STREAMPOOL_DRIVER) it reports the simulated driver. Returns 1 if the
    library cannot be used here (the reason is printed), else 0."""
    status = 0
    no_gpu = _simulate_without_gpu()
    try:
        if no_gpu:
            print(f"No CUDA GPU here ({no_gpu}): the devices below are simulated in host memory, "
                  "not GPUs; streampool.install() needs a CUDA GPU")
        print(f"library: {streampool.library_path()}")
        print(f"version: {streampool.__version__}")
        simulated = bool(no_gpu) or streampool.driver_name() == "sim"
        if no_gpu:
            print("driver: sim (the simulated driver, chosen because there is no CUDA GPU)")
        elif simulated:
            print("driver: sim (STREAMPOOL_DRIVER=sim: the devices below are simulated in host memory, not GPUs)")
        else:
            print(f"driver: {streampool.driver_name()}")
        count = streampool.device_count()
        print(f"devices: {count}{' simulated' if simulated else ''}")
        for index in range(count):
            print(_device_line(index, simulated))
    except (OSError, streampool.StreampoolError) as exc:
        print(f"error: {exc}")
        status = 1
    print("variables:")
    print("\n".join(_variable_lines("no CUDA GPU here" if no_gpu else None)))
    return status


def version_text() -> str:
    """``streampool VERSION (library PATH)``; the library's version is the package's."""
    return f"streampool {streampool.__version__} (library {streampool.library_path()})"


DESCRIPTION = (
    "streampool: a PyTorch CUDA allocator over CUDA stream-ordered memory pools. "
    "`compare` runs your own command under several allocators and prints peak device memory and "
    "wall time side by side; `info` shows the library, driver, devices and STREAMPOOL_* settings; "
    "`demo` allocates through streampool (on the GPU when PyTorch and a CUDA device are present, "
    "else on the simulated driver); `plot` draws a memory timeline from a snapshot. (The benchmark "
    "is `python3 -m bench` in a source checkout.)"
)

COMPARE_EPILOG = (
    "example: streampool compare --runs 3 --plot memory.png -- python train.py --epochs 1. "
    "Each run is a fresh process tree; streampool is installed in each of its Python processes "
    "when they import torch (a sitecustomize put first on PYTHONPATH: DataLoader workers and "
    "torchrun's workers included), PyTorch's allocators are chosen with PYTORCH_CUDA_ALLOC_CONF. "
    "Device memory comes from NVML (per process of the run) where it can see the run's processes."
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
    except DemoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


BENCH_MOVED = (
    "the benchmark is a tool of the source repository: from a checkout, "
    "python3 -m bench --help (see BENCHMARKS.md)"
)


def _parser(prog: str) -> argparse.ArgumentParser:
    from ._compare import ALLOCATORS_HELP, DEFAULT_ALLOCATORS

    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("--version", action="store_true", help="print the version and the library in use")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("info", help="library, driver, devices, statistics and STREAMPOOL_* variables")
    commands.add_parser("demo", help="allocate through streampool on the GPU, or the simulated driver")
    plot = commands.add_parser("plot", help="draw a snapshot's memory timeline (streampool.dump_snapshot)")
    plot.add_argument("snapshot", help="a pickle from streampool.dump_snapshot (or PyTorch's _dump_snapshot)")
    plot.add_argument("-o", "--out", default="memory.png", help="the PNG to write (default: memory.png)")
    plot.add_argument("--device", type=int, default=None, help="only this device")
    compare = commands.add_parser(
        "compare",
        help="run your command under several allocators: peak device memory and wall time",
        usage=f"{prog} compare [options] -- COMMAND [ARGS...]",
        epilog=COMPARE_EPILOG,
    )
    compare.add_argument("--runs", type=int, default=3, help="rounds; each allocator runs once per round, native twice (default: 3)")
    compare.add_argument("--allocators", default=DEFAULT_ALLOCATORS, help=ALLOCATORS_HELP)
    compare.add_argument("--plot", metavar="FILE.png", help="draw device memory over time for every run")
    compare.add_argument("--json", metavar="FILE.json", help="write every run's figures and memory series")
    compare.add_argument("--log-dir", metavar="DIR", help="each run's stdout, stderr and files (default: a new temporary folder)")
    compare.add_argument("--interval-ms", type=int, default=50, help="memory sampling period in milliseconds (default: 50)")
    compare.add_argument("--timeout-s", type=float, default=None, help="end a run that takes longer (seconds)")
    compare.add_argument("argv", metavar="COMMAND", nargs=argparse.REMAINDER, help="the command to run, after --")
    return parser


def _compare(options: argparse.Namespace) -> int:
    from ._compare import UsageError, compare, parse_allocators

    command = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    try:
        if not command:
            raise UsageError("compare: no command given; put it after --, e.g. -- python train.py")
        if shutil.which(command[0]) is None:
            raise UsageError(f"compare: {command[0]!r} is not a command found on PATH or an executable file")
        if options.runs < 1:
            raise UsageError(f"--runs must be 1 or more, got {options.runs}")
        if options.interval_ms < 1:
            raise UsageError(f"--interval-ms must be 1 or more, got {options.interval_ms}")
        if options.timeout_s is not None and not 0 < options.timeout_s < float("inf"):
            raise UsageError(f"--timeout-s must be a number of seconds above 0, got {options.timeout_s:g}")
        allocators = parse_allocators(options.allocators)
        if options.plot:  # before any run, not after all of them
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError(f"--plot needs matplotlib, which this Python ({sys.executable}) cannot import: "
                                 "pip install 'streampool[plot]' (or pip install matplotlib), or leave out --plot") from None
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return compare(command, allocators, options.runs, plot_path=options.plot, json_path=options.json,
                   log_dir=options.log_dir, interval_ms=options.interval_ms, timeout_s=options.timeout_s)


def _dispatch(argv: List[str], prog: str) -> int:
    if argv[:1] == ["bench"]:  # the benchmark left the package for the repository's bench/
        print(BENCH_MOVED, file=sys.stderr)
        return 2
    parser = _parser(prog)
    options = parser.parse_args(argv)
    if options.version:
        print(version_text())
        return 0
    if options.command is None:
        parser.print_usage(sys.stderr)
        print(f"{prog}: error: a command is required (info, demo, plot, compare), or --version", file=sys.stderr)
        return 2
    if options.command == "info":
        return info()
    if options.command == "plot":
        return plot_command(options.snapshot, options.out, options.device)
    if options.command == "compare":
        return _compare(options)
    return demo()


def _quiet_broken_pipe() -> int:
    """The reader of our output went away (``streampool demo | head``): stop without a traceback,
    and keep Python from failing again when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13  # what a process ended by SIGPIPE reports


def main(argv: Optional[List[str]] = None, prog: str = "streampool") -> int:
    """The ``streampool`` console script; ``python -m streampool`` passes its own ``prog``."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        status = _dispatch(argv, prog)
        sys.stdout.flush()  # here, not at exit, so that a reader gone away is caught below
        return status
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (OSError, streampool.StreampoolError) as exc:  # the library cannot be found, loaded or used
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(prog="python -m streampool"))

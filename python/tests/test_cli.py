"""The command line's rough edges: --version, info without a GPU, a bad STREAMPOOL_LIBRARY, a
reader that goes away (``demo | head``): each ends in one line, never a traceback."""

import os
import subprocess
import sys

import pytest
from helpers import describe, python_env, run_python

from streampool._probe import cuda_unavailable_reason

NO_GPU_HERE = cuda_unavailable_reason()

# Runs the command line in-process with the GPU probe answering "none" (as on a machine without one).
WITHOUT_GPU = """
import sys
from streampool import __main__ as cli
cli.cuda_unavailable_reason = lambda: "libcuda.so.1 not found (no NVIDIA driver)"
sys.exit(cli.main(ARGV))
"""


def test_version_names_the_version_and_the_library():
    proc = run_python(args=["-m", "streampool", "--version"])
    assert proc.returncode == 0, describe(proc)
    import streampool

    assert proc.stdout == f"streampool {streampool.__version__} (library {streampool.library_path()})\n"


def test_info_without_a_gpu_reports_the_simulated_driver_and_succeeds():
    proc = run_python(WITHOUT_GPU.replace("ARGV", "['info']"), env={"STREAMPOOL_DRIVER": None})
    assert proc.returncode == 0, describe(proc)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("No CUDA GPU here (libcuda.so.1 not found (no NVIDIA driver)): the devices below are "
                            "simulated in host memory, not GPUs"), describe(proc)
    assert "driver: sim (the simulated driver, chosen because there is no CUDA GPU)" in proc.stdout
    assert "devices: 2 simulated" in proc.stdout and "\nsimulated device 0: total 16.00 GiB" in proc.stdout
    assert "STREAMPOOL_DRIVER" in proc.stdout and "= sim  (no CUDA GPU here)" in proc.stdout, describe(proc)


def test_info_with_the_simulated_driver_asked_for_says_the_devices_are_simulated():
    proc = run_python(args=["-m", "streampool", "info"], env={"STREAMPOOL_DRIVER": "sim"})
    assert proc.returncode == 0, describe(proc)
    assert "driver: sim (STREAMPOOL_DRIVER=sim: the devices below are simulated" in proc.stdout, describe(proc)
    assert "devices: 2 simulated" in proc.stdout and "\nsimulated device 1: total" in proc.stdout


@pytest.mark.skipif(NO_GPU_HERE is None, reason="this machine has a GPU: the CUDA driver answers")
def test_info_with_the_cuda_driver_asked_for_and_none_there_fails_saying_why():
    proc = run_python(WITHOUT_GPU.replace("ARGV", "['info']"), env={"STREAMPOOL_DRIVER": "cuda"})
    assert proc.returncode == 1, describe(proc)
    assert "error: libcuda.so.1 was not found" in proc.stdout, describe(proc)


@pytest.mark.skipif(NO_GPU_HERE is None, reason="this machine has a GPU")
def test_info_on_this_machine_without_a_gpu_succeeds():
    proc = run_python(args=["-m", "streampool", "info"], env={"STREAMPOOL_DRIVER": None})
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.startswith("No CUDA GPU here (") and "devices: 2 simulated" in proc.stdout, describe(proc)


BAD_LIBRARIES = [
    ("/nonexistent/libstreampool.so", "STREAMPOOL_LIBRARY=/nonexistent/libstreampool.so does not name a file"),
    (__file__, f"STREAMPOOL_LIBRARY={__file__} cannot be loaded ("),
    ("OTHER", "is not libstreampool.so: it lacks my_malloc and "),
    # It loaded target/release's library as if unset.
    ("", "STREAMPOOL_LIBRARY is set but empty: name the libstreampool.so to load, or unset it"),
]


def _another_shared_library() -> str:
    """A shared object that loads but is not libstreampool: Python's own _ctypes extension."""
    import _ctypes

    return _ctypes.__file__


@pytest.mark.parametrize("command", [["--version"], ["info"], ["demo"]])
@pytest.mark.parametrize("library, message", BAD_LIBRARIES, ids=["missing", "not a library", "another library", "empty"])
def test_a_bad_library_is_one_line_without_a_traceback(command, library, message):
    library = _another_shared_library() if library == "OTHER" else library
    proc = run_python(args=["-m", "streampool", *command], env={"STREAMPOOL_LIBRARY": library})
    assert proc.returncode == 1, describe(proc)
    assert "Traceback" not in proc.stderr + proc.stdout, describe(proc)
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], describe(proc)


@pytest.mark.parametrize("buffered", [True, False], ids=["block-buffered", "unbuffered"])
@pytest.mark.parametrize("command", [["demo"], ["info"], ["--version"]])
def test_output_into_a_closed_pipe_ends_quietly(command, buffered):
    # The reader is gone before the first write (what `| head -1` leads to once head has its
    # line), whether stdout is a block-buffered pipe (the usual case) or unbuffered.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = python_env({"PYTHONUNBUFFERED": None if buffered else "1"})
    proc = subprocess.run([sys.executable, "-m", "streampool", *command], env=env, stdout=write_end,
                          stderr=subprocess.PIPE, timeout=120)
    os.close(write_end)
    assert proc.returncode == 141, proc.stderr.decode()
    assert proc.stderr.decode() == ""


def test_no_command_says_which_there_are():
    proc = run_python(args=["-m", "streampool"])
    assert proc.returncode == 2
    assert "a command is required (info, demo, plot, compare), or --version" in proc.stderr

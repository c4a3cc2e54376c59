"""The memory readers of ``streampool compare``: the process tree from /proc, and the merge of the
samples a run's processes take themselves (no NVML on the CPU: its reader is exercised on the GPU)."""

import os
import subprocess
import sys
import time

from streampool._sampler import (
    SOURCE_DEVICE,
    SOURCE_PROCESS,
    Reading,
    choose_series,
    descends_from,
    process_tree,
    read_child_samples,
)


def test_the_process_tree_holds_children_and_grandchildren_only():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while len(process_tree(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(proc.pid)
        assert len(tree) == 2 and proc.pid in tree and os.getpid() not in tree
        grandchild = (tree - {proc.pid}).pop()
        cache = {}
        assert descends_from(grandchild, proc.pid, cache) and cache[grandchild]
        assert not descends_from(os.getpid(), proc.pid, {})
        assert not descends_from(2**22 + 12345, proc.pid, {})  # no such process
    finally:
        for pid in process_tree(proc.pid):
            os.kill(pid, 9)
        proc.wait()


def test_per_process_figures_win_over_whole_devices():
    readings = [(0.0, Reading(None, 500)), (0.05, Reading(100, 600)), (0.1, Reading(None, 700))]
    assert choose_series(readings) == (SOURCE_PROCESS, [(0.0, 0), (0.05, 100), (0.1, 0)])
    whole = [(0.0, Reading(None, 500)), (0.05, Reading(None, 650))]
    assert choose_series(whole) == (SOURCE_DEVICE, [(0.0, 500), (0.05, 650)])
    assert choose_series([(0.0, Reading(None, None))]) == (None, [])


def test_samples_of_processes_on_one_device_are_not_added_twice(tmp_path):
    # Two processes see device 0 (the same figure from both sides); one also uses device 1.
    (tmp_path / "samples-1.txt").write_text("100.00 0 1000\n100.10 0 1500\n100.10 1 200\n")
    (tmp_path / "samples-2.txt").write_text("100.01 0 1000\n100.11 0 1400\n100.2")  # cut short at exit
    assert read_child_samples(tmp_path, start_s=100.0, interval_s=0.05) == [(0.0, 1000), (0.1, 1700)]

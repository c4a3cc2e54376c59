"""``streampool compare`` driven by small stand-in commands on the CPU: the schedule, each run's
environment, the table and its "same" rule, failed runs, the plot and the bootstrap that installs
streampool in every Python process of a run. The memory reader is a stand-in too: the resident
memory of the run's process tree (/proc), so a stand-in that holds more memory shows more."""

import io
import json
import os
import sys
from pathlib import Path

import pytest
from helpers import STAND_INS, describe, python_env, run_python

from streampool import _compare
from streampool._compare import ALLOC_CONF, UsageError, compare, environment_notes, parse_allocators, schedule
from streampool._compare_report import RunResult, format_failures, ratio_cell, summarise
from streampool._sampler import Reading, process_tree

MiB = 1 << 20


class ResidentMemory:
    """The stand-in reader: resident bytes of the run's process tree."""

    sources = ("resident memory of the run's processes (stand-in)", "unused")

    def baseline(self):
        pass

    def track(self, pid):
        self.pid = pid

    def read(self):
        total = 0
        for pid in process_tree(self.pid):
            try:
                with open(f"/proc/{pid}/status") as status:
                    total += next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                pass
        return Reading(total, None)


# Holds MEGABYTES[allocator] MiB for a moment; the allocator named FAILS prints to stderr and exits 3.
STAND_IN = """
import os, sys, time
allocator = os.environ["_STREAMPOOL_COMPARE_ALLOCATOR"]
if allocator == os.environ.get("FAILS"):
    print("something went wrong", file=sys.stderr)
    print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
    sys.exit(3)
megabytes = {"native": 160, "expandable": 120}.get(allocator, 60)
block = bytearray(megabytes << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(1.0)  # long enough for the 50 ms sampler on a loaded machine
print(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "unset"), os.environ.get("STREAMPOOL_BACKEND", "unset"),
      os.environ.get("STREAMPOOL_RELEASE_THRESHOLD", "unset"))
"""


def run_compare(tmp_path, allocators="native,expandable,streampool", runs=3, env=None, script=STAND_IN, **kwargs):
    """compare() on the stand-in script; returns (exit status, printed text, log folder)."""
    path = tmp_path / "stand_in.py"
    path.write_text(script)
    out = io.StringIO()
    logs = tmp_path / "logs"
    environ = python_env(env or {})
    status = compare([sys.executable, str(path)], parse_allocators(allocators), runs, log_dir=str(logs),
                     environ=environ, sampler_factory=ResidentMemory, gpu_check=lambda: None, out=out, **kwargs)
    return status, out.getvalue(), logs


def test_the_threshold_is_checked_alone_not_with_this_process_s_variables(monkeypatch):
    # A malformed variable of the parent, which the run sets itself, was blamed on the threshold.
    monkeypatch.setenv("STREAMPOOL_BACKEND", "nonsense")
    assert parse_allocators("streampool-pool@1GiB")[1].variables["STREAMPOOL_BACKEND"] == "pool"


def test_a_threshold_the_library_takes_is_taken():
    # The check's own pattern refused 1.5GiB, which the library reads as 1610612736 bytes.
    for threshold in ("1.5GiB", "512 MB", "80%", "0.5%", "max", "0"):
        chosen = parse_allocators(f"streampool@{threshold}")
        assert chosen[1].variables == {"STREAMPOOL_RELEASE_THRESHOLD": threshold}


def test_allocator_names_thresholds_and_native_first():
    chosen = parse_allocators("streampool-vmm@2GiB, expandable,streampool@0,streampool-vmm@2GiB")
    assert [a.name for a in chosen] == ["native", "streampool-vmm@2GiB", "expandable", "streampool@0"]
    assert chosen[1].variables == {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_RELEASE_THRESHOLD": "2GiB"}
    assert chosen[3].variables == {"STREAMPOOL_RELEASE_THRESHOLD": "0"} and chosen[3].install
    assert chosen[2].alloc_conf == "expandable_segments:True" and not chosen[2].install


@pytest.mark.parametrize(
    "text, message",
    [("native,tcmalloc", "unknown allocator 'tcmalloc'; known: native, expandable"),
     ("expandable@1GiB", "only streampool allocators take @THRESHOLD"),
     ("streampool@lots", 'STREAMPOOL_RELEASE_THRESHOLD="lots" is not valid'),
     # The library's own parser decides: its check passed 5ki, which every run then refused.
     ("streampool@5ki", 'STREAMPOOL_RELEASE_THRESHOLD="5ki" is not valid.*unknown unit'),
     ("streampool@1.3KiB", "not a whole number of bytes"),
     ("streampool@", "the release threshold is empty")],
)
def test_bad_allocators_are_refused_naming_them(text, message):
    with pytest.raises(UsageError, match=message):
        parse_allocators(text)


def test_each_round_runs_native_first_and_last_with_the_others_between():
    plan = schedule(parse_allocators("expandable,streampool"), 2)
    assert [(a.name, r) for a, r in plan] == [
        ("native", 1), ("expandable", 1), ("streampool", 1), ("native", 1),
        ("native", 2), ("expandable", 2), ("streampool", 2), ("native", 2),
    ]


def test_a_run_gets_its_allocators_variables_and_the_bootstrap_first_on_the_path(tmp_path):
    environ = {"PYTHONPATH": "/mine", ALLOC_CONF: "max_split_size_mb:128", "STREAMPOOL_BACKEND": "pool", "KEEP": "1"}
    expandable, vmm = parse_allocators("expandable,streampool-vmm@1GiB")[1:]
    env = _compare.run_environment(expandable, environ, tmp_path, "/lib/libstreampool.so", None)
    assert env[ALLOC_CONF] == "expandable_segments:True" and env["KEEP"] == "1"
    assert env["PYTHONPATH"] == f"{_compare.BOOTSTRAP_DIR}{os.pathsep}/mine"
    assert _compare.INSTALL_ENV not in env and "STREAMPOOL_LIBRARY" not in env
    env = _compare.run_environment(vmm, environ, tmp_path, "/lib/libstreampool.so", 50)
    assert ALLOC_CONF not in env
    assert env["STREAMPOOL_BACKEND"] == "vmm" and env["STREAMPOOL_RELEASE_THRESHOLD"] == "1GiB"
    assert env[_compare.INSTALL_ENV] == "1" and env["STREAMPOOL_LIBRARY"] == "/lib/libstreampool.so"
    assert env[_compare.SAMPLE_ENV] == "50"


def test_what_compare_overrides_in_the_users_environment_is_said():
    allocators = parse_allocators("expandable,streampool-vmm")
    notes = environment_notes({ALLOC_CONF: "max_split_size_mb:128", "STREAMPOOL_BACKEND": "pool",
                               "STREAMPOOL_CACHE_LIMIT": "1GiB"}, allocators)
    assert notes[0] == (
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 is set here; every run gets its allocator's own "
        "(native: unset, expandable: expandable_segments:True, streampool-vmm: unset)"
    )
    assert notes[1] == (
        "the streampool runs use STREAMPOOL_BACKEND=pool, STREAMPOOL_CACHE_LIMIT=1GiB from this environment "
        "(an allocator's own STREAMPOOL_BACKEND wins where it sets one)"
    )
    assert environment_notes({"HOME": "/root"}, allocators) == []


def _rows(text, title):
    """The table under ``title``: {allocator: cells split on two spaces}."""
    lines = text.split(title, 1)[1].strip("\n").split("\n\n", 1)[0].splitlines()[1:]
    return {line.split()[0]: [c.strip() for c in line.split("  ") if c.strip()] for line in lines}


def test_a_comparison_measures_each_allocators_runs_and_prints_the_table(tmp_path):
    # STREAMPOOL_BACKEND unset here: the suite's run on the pool backend sets it in this process.
    env = {ALLOC_CONF: "garbage_collection_threshold:0.6", "STREAMPOOL_BACKEND": None}
    status, text, logs = run_compare(tmp_path, env=env)
    assert status == 0, text
    assert "note: PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6 is set here" in text
    lines = text.splitlines()
    plan = next(line for line in lines if line.startswith("plan: "))
    assert plan.startswith("plan: 12 runs of your command, one after the other: 3 round(s) of: native, "
                           "expandable, streampool, native; so about 12 times as long as one run takes"), text
    assert lines.index(plan) < min(i for i, line in enumerate(lines) if line.startswith("[")), "plan first"
    progress = [line for line in lines if line.startswith("[")]
    assert len(progress) == 12 and progress[0].startswith("[ 1/12] native") and "exit 0" in progress[0]
    # Right after the first run, the minutes: 12 runs at the first one's time.
    estimate = lines[lines.index(progress[0]) + 1]
    first_s = float(progress[0].split("...")[1].split()[0])
    assert estimate.startswith("estimate: about ") and estimate.endswith(f"at {first_s:.1f} s each (--runs sets the rounds)")
    assert float(estimate.split()[2]) == pytest.approx(12 * first_s / 60, abs=0.06), estimate
    memory = _rows(text, "peak device memory (median of the successful runs)")
    assert memory["native"][1] == "6/6" and memory["streampool"][1] == "3/3"
    native_mib = float(memory["native"][2].split()[0])
    ours_mib = float(memory["streampool"][2].split()[0])
    assert native_mib - ours_mib == pytest.approx(100, abs=15)  # the stand-in holds 160 vs 60 MiB
    assert memory["streampool"][3].endswith("x") and float(memory["streampool"][3][:-1]) < 0.8
    assert "memory: resident memory of the run's processes (stand-in); sampled every 50 ms" in text
    # Each run got its own allocator's environment (the stand-in prints it).
    outputs = {p.name.split("-", 2)[2]: (p / "stdout.txt").read_text().split() for p in sorted(logs.iterdir())}
    assert outputs["native"] == ["unset", "unset", "unset"]
    assert outputs["expandable"] == ["expandable_segments:True", "unset", "unset"]


def test_failed_runs_are_reported_with_their_stderr_and_counted(tmp_path):
    status, text, _ = run_compare(tmp_path, allocators="native,streampool-vmm@0", env={"FAILS": "streampool-vmm@0"})
    assert status == 1
    assert "FAILED: exit status 3" in text
    times = _rows(text, "wall time (median of the successful runs)")
    assert times["streampool-vmm@0"][1:] == ["0/3", "-", "-", "-", "3", "3"]  # ok, median, ratios, OOMs, exit
    failures = text.split("FAILED: streampool-vmm@0, run 1: exit status 3", 1)[1]
    assert "  | something went wrong\n  | RuntimeError: CUDA out of memory." in failures
    assert "(the same end of stderr as streampool-vmm@0, run 1)" in failures


def test_a_run_past_its_timeout_is_ended_and_failed(tmp_path):
    script = "import time\ntime.sleep(30)\n"
    status, text, _ = run_compare(tmp_path, allocators="native", runs=1, script=script, timeout_s=0.5)
    assert status == 1
    assert "FAILED: native, run 1: ran past --timeout-s 0.5" in text
    assert all(float(line.split("...")[1].split()[0]) < 10 for line in text.splitlines() if line.startswith("["))


def test_the_plot_and_the_json_hold_every_run(tmp_path):
    pytest.importorskip("matplotlib")
    plot, results = tmp_path / "memory.png", tmp_path / "runs.json"
    status, text, _ = run_compare(tmp_path, allocators="native,streampool", runs=1, plot_path=str(plot),
                                  json_path=str(results))
    assert status == 0, text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    runs = json.loads(results.read_text())["runs"]
    assert [r["allocator"] for r in runs] == ["native", "streampool", "native"]
    assert all(r["series"] and r["peak_bytes"] == max(b for _, b in r["series"]) for r in runs)


def test_without_a_gpu_one_line_and_a_failing_status(capsys):
    status = compare(["true"], parse_allocators("native"), 1, gpu_check=lambda: "libcuda.so.1 not found")
    assert status == 2
    assert capsys.readouterr().err == "streampool compare needs a CUDA GPU and there is none here: libcuda.so.1 not found\n"


def test_the_command_line_refuses_bad_arguments_in_one_line():
    for args, message in [(["--runs", "0", "--", "true"], "error: --runs must be 1 or more, got 0"),
                          (["--"], "error: compare: no command given; put it after --"),
                          (["--allocators", "x", "--", "true"], "error: --allocators: unknown allocator 'x'"),
                          (["--", "no-such-command-here", "x"],
                           "error: compare: 'no-such-command-here' is not a command found on PATH"),
                          # nan passed the old check (nan <= 0 is false) and ran with no limit
                          (["--timeout-s", "nan", "--", "true"], "error: --timeout-s must be a number of seconds above 0, got nan"),
                          (["--timeout-s", "0", "--", "true"], "error: --timeout-s must be a number of seconds above 0, got 0")]:
        proc = run_python(args=["-m", "streampool", "compare", *args])
        assert proc.returncode == 2, describe(proc)
        assert proc.stderr.startswith(message), describe(proc)


# compare --plot in a Python without matplotlib (the import made to fail), on a machine with no GPU.
WITHOUT_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None  # import matplotlib raises ImportError
from streampool import __main__ as cli
sys.exit(cli.main(["compare", "--plot", "memory.png", "--", "true"]))
"""


def test_plot_without_matplotlib_is_refused_before_any_run():
    proc = run_python(WITHOUT_MATPLOTLIB)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.startswith("error: --plot needs matplotlib, which this Python ("), describe(proc)
    assert "pip install 'streampool[plot]'" in proc.stderr and proc.stderr.count("\n") == 1, describe(proc)
    assert proc.stdout == "", describe(proc)  # no plan, no run


def test_same_means_inside_the_native_spread():
    assert ratio_cell(103.0, 100.0, 0.05, verdict=True) == "1.03x same"
    assert ratio_cell(94.0, 100.0, 0.05, verdict=True) == "0.94x"
    assert ratio_cell(103.0, 100.0, 0.05, verdict=False) == "1.03x"
    assert ratio_cell(103.0, 100.0, None, verdict=True) == "1.03x"
    assert ratio_cell(None, 100.0, 0.05, verdict=True) == "-"


def test_the_spread_and_medians_come_from_successful_runs_only():
    def run(name, peak, wall, failure=None):
        return RunResult(name, 1, "0" if failure is None else "1", wall, peak_bytes=peak, failure=failure)

    results = [run("native", 100, 10.0), run("native", 110, 11.0), run("native", 500, 1.0, "exit status 1"),
               run("streampool", 80, 10.5), run("streampool", 90, 10.5), run("streampool", 85, 10.4)]
    summary = summarise(results, ["native", "streampool"], 3)
    assert summary.memory_band == pytest.approx(0.10) and summary.wall_band == pytest.approx(0.10)
    assert summary.memory == {"native": 105, "streampool": 85}
    assert summary.wall["streampool"] == 10.5
    assert "FAILED: native, run 1: exit status 1" in format_failures(results)


# The stand-in torch: each Python process of a run imports it; the first one starts another.
TORCH_SCRIPT = """
import importlib.util, os, subprocess, sys
assert importlib.util.find_spec("torch") is not None  # a lookup first, as libraries do
import torch
torch.cuda.init()
import streampool
print(os.getpid(), streampool.is_installed())
if len(sys.argv) == 1:
    subprocess.run([sys.executable, __file__, "child"], check=True)
"""


def test_the_bootstrap_installs_streampool_in_every_python_process_that_imports_torch(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(STAND_INS), python_env()["PYTHONPATH"]]), "FAKE_TORCH_GPU": "1",
           "STREAMPOOL_DRIVER": None,
           "FAKE_TORCH_STATS": json.dumps({"num_ooms": 2, "allocated_bytes": {"all": {"peak": 1000}}})}
    status, text, logs = run_compare(tmp_path, allocators="native,streampool", runs=1, env=env, script=TORCH_SCRIPT)
    assert status == 0, text
    for run in sorted(logs.iterdir()):
        printed = (run / "stdout.txt").read_text().split()
        installed = run.name.endswith("streampool")
        assert printed[1::2] == [str(installed)] * 2, run  # the process and its child
        records = [json.loads(p.read_text()) for p in run.glob("stats-*.json")]
        assert sorted(r["pid"] for r in records) == sorted(int(p) for p in printed[0::2])
        assert all(r["streampool_installed"] == installed for r in records)
    # PyTorch's figures of both processes of a native run are added up.
    memory = _rows(text, "peak device memory (median of the successful runs)")
    assert memory["native"][-1] == "1.95 KiB"
    assert _rows(text, "wall time (median of the successful runs)")["native"][5] == "8"  # 2 runs x 2 processes x 2


def test_a_failed_install_fails_the_run_with_the_reason(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(STAND_INS), python_env()["PYTHONPATH"]]), "FAKE_TORCH_GPU": "1",
           "STREAMPOOL_DRIVER": "sim"}
    status, text, _ = run_compare(tmp_path, allocators="native,streampool", runs=1, env=env, script=TORCH_SCRIPT)
    assert status == 1
    assert "ImportError: streampool compare: streampool.install() failed in process" in text
    assert "STREAMPOOL_DRIVER=sim: the simulated driver serves host memory" in text


def test_a_native_run_of_a_script_that_installs_streampool_itself_does_not_count(tmp_path):
    script = TORCH_SCRIPT.replace("torch.cuda.init()\nimport streampool", "import streampool\nstreampool.install()\ntorch.cuda.init()")
    env = {"PYTHONPATH": os.pathsep.join([str(STAND_INS), python_env()["PYTHONPATH"]]), "FAKE_TORCH_GPU": "1",
           "STREAMPOOL_DRIVER": None}
    status, text, _ = run_compare(tmp_path, allocators="native", runs=1, env=env, script=script)
    assert status == 1
    assert "the command installs streampool itself, so this was no run of native" in text


def test_the_bootstrap_leaves_processes_without_torch_and_other_sitecustomize_alone(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os, sys\nprint(os.environ.get('OTHER_SITECUSTOMIZE'), 'streampool' in sys.modules, 'torch' in sys.modules)"
    env = {"PYTHONPATH": os.pathsep.join([str(_compare.BOOTSTRAP_DIR), str(other)]),
           _compare.ALLOCATOR_ENV: "streampool", _compare.INSTALL_ENV: "1"}
    proc = run_python(code, env=env)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["ran", "False", "False"]


def test_processes_a_run_leaves_behind_are_ended_before_the_next_run(tmp_path):
    marker = tmp_path / "sleeper.pid"
    script = (
        "import subprocess, sys\n"
        "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(sleeper.pid))\n"
    )
    status, text, logs = run_compare(tmp_path, allocators="native", runs=1, script=script)
    assert status == 0, text
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert all((run / "leftover.txt").exists() for run in logs.iterdir())


def _no_nvml():
    raise OSError("libnvidia-ml.so.1 not found")


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="the CUDA driver answers which devices have a context")
def test_without_nvml_the_runs_sample_their_own_device_memory(tmp_path):
    script = "import time, torch\ntorch.cuda.init()\ntime.sleep(0.5)\n"
    env = {"PYTHONPATH": os.pathsep.join([str(STAND_INS), python_env()["PYTHONPATH"]]),
           "FAKE_TORCH_GPU": "1", "FAKE_TORCH_USED_BYTES": str(300 * MiB)}
    path = tmp_path / "stand_in.py"
    path.write_text(script)
    out = io.StringIO()
    status = compare([sys.executable, str(path)], parse_allocators("native"), 1, log_dir=str(tmp_path / "logs"),
                     environ=python_env(env), sampler_factory=_no_nvml, gpu_check=lambda: None, out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "note: NVML cannot be used (libnvidia-ml.so.1 not found); the runs sample torch.cuda.mem_get_info" in text
    assert "memory: torch.cuda.mem_get_info sampled inside the run's processes" in text
    assert _rows(text, "peak device memory (median of the successful runs)")["native"][2] == "300.00 MiB"

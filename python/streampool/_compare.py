"""``streampool compare -- COMMAND``: the user's own command under several allocators, each run in
a process tree of its own, its device memory sampled while it goes, and a table at the end.

Each round runs native first and last and every other allocator once in between, so native runs
twice per round and their spread is the noise the table measures differences against. The
allocator is chosen for a run through its environment only: ``PYTORCH_CUDA_ALLOC_CONF`` for
PyTorch's own allocators, and for streampool a ``sitecustomize`` first on ``PYTHONPATH``
(``_bootstrap/``) that installs it in every Python process of the run when it imports torch.

Invariant: every run is a fresh process tree started from the same environment but for the
variables its allocator sets, and no run starts before the previous one's processes are gone.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import _lib
from ._compare_report import NATIVE, RunResult, format_failures, format_report, plot, stderr_tail, summarise
from ._probe import cuda_unavailable_reason
from ._sampler import SOURCE_CHILD, NvmlSampler, Reading, choose_series, read_child_samples

PACKAGE_DIR = Path(__file__).resolve().parent
BOOTSTRAP_DIR = PACKAGE_DIR / "_bootstrap"
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATOR_ENV, INSTALL_ENV, OUT_ENV, PACKAGE_ENV, SAMPLE_ENV = (
    "_STREAMPOOL_COMPARE_ALLOCATOR",
    "_STREAMPOOL_COMPARE_INSTALL",
    "_STREAMPOOL_COMPARE_OUT",
    "_STREAMPOOL_COMPARE_PACKAGE",
    "_STREAMPOOL_COMPARE_SAMPLE_MS",
)
DEFAULT_ALLOCATORS = "native,expandable,streampool"
RELEASE_THRESHOLD = "STREAMPOOL_RELEASE_THRESHOLD"
OOM_TEXT = re.compile(r"CUDA out of memory|OutOfMemoryError")


@dataclass(frozen=True)
class Allocator:
    """One allocator a run can use: ``alloc_conf`` is the run's PYTORCH_CUDA_ALLOC_CONF (None:
    unset), ``variables`` the STREAMPOOL_* it sets, ``install`` whether streampool is installed."""

    name: str
    description: str
    alloc_conf: Optional[str] = None
    install: bool = False
    variables: Dict[str, str] = field(default_factory=dict)


ALLOCATORS = {
    a.name: a
    for a in (
        Allocator("native", "PyTorch's caching allocator, default settings"),
        Allocator("expandable", "PyTorch's allocator with expandable segments", "expandable_segments:True"),
        Allocator("cuda-async", "PyTorch's cudaMallocAsync backend", "backend:cudaMallocAsync"),
        Allocator("streampool", "streampool with the STREAMPOOL_* settings of this environment", install=True),
        Allocator("streampool-pool", "streampool, pool backend", install=True, variables={"STREAMPOOL_BACKEND": "pool"}),
        Allocator("streampool-vmm", "streampool, virtual-memory backend", install=True, variables={"STREAMPOOL_BACKEND": "vmm"}),
    )
}
ALLOCATORS_HELP = (
    "comma-separated, run in this order in every round: "
    + ", ".join(f"{a.name} ({a.description})" for a in ALLOCATORS.values())
    + "; a streampool allocator may add @THRESHOLD for STREAMPOOL_RELEASE_THRESHOLD (streampool@0, "
    "streampool-vmm@2GiB). native always runs, twice per round. Default: " + DEFAULT_ALLOCATORS
)


class UsageError(ValueError):
    """A bad argument: the message names it, the value and what is accepted."""


def _check_threshold(item: str, threshold: str) -> None:
    """UsageError unless the library takes ``threshold`` as STREAMPOOL_RELEASE_THRESHOLD (its own
    parser, the value alone, so that a value it would refuse in every streampool run is refused
    before the first)."""
    if not threshold.strip():
        raise UsageError(f"--allocators: {item!r}: the release threshold is empty; "
                         "e.g. streampool@1GiB, streampool@80%, streampool@0")
    try:
        _lib.check_setting(RELEASE_THRESHOLD, threshold.strip())
    except _lib.ConfigError as exc:
        raise UsageError(f"--allocators: {item!r}: {exc}") from None


def parse_allocators(text: str) -> List[Allocator]:
    """The allocators named in ``text``, in order, native included; UsageError for a bad name."""
    chosen: List[Allocator] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, threshold = item.partition("@")
        base = ALLOCATORS.get(name)
        if base is None:
            raise UsageError(f"--allocators: unknown allocator {name!r}; known: {', '.join(ALLOCATORS)}")
        if threshold or "@" in item:
            if not base.install:
                raise UsageError(f"--allocators: {item!r}: only streampool allocators take @THRESHOLD")
            _check_threshold(item, threshold)
            base = Allocator(item, f"{base.description}, release threshold {threshold}", base.alloc_conf, True,
                             {**base.variables, RELEASE_THRESHOLD: threshold.strip()})
        if all(a.name != base.name for a in chosen):
            chosen.append(base)
    if all(a.name != NATIVE for a in chosen):
        chosen.insert(0, ALLOCATORS[NATIVE])
    return chosen


def schedule(allocators: Sequence[Allocator], rounds: int) -> List[Tuple[Allocator, int]]:
    """(allocator, round) in run order: per round native, the others, native again."""
    native = next(a for a in allocators if a.name == NATIVE)
    others = [a for a in allocators if a.name != NATIVE]
    return [(a, r) for r in range(1, rounds + 1) for a in [native, *others, native]]


def environment_notes(environ: Dict[str, str], allocators: Sequence[Allocator]) -> List[str]:
    """What compare changes of the user's environment, worth a line each before the runs."""
    notes = []
    if ALLOC_CONF in environ:
        settings = ", ".join(f"{a.name}: {a.alloc_conf or 'unset'}" for a in allocators)
        notes.append(f"{ALLOC_CONF}={environ[ALLOC_CONF]} is set here; every run gets its allocator's own ({settings})")
    ours = sorted(k for k in environ if k.startswith("STREAMPOOL_") and k != "STREAMPOOL_LIBRARY")
    if ours and any(a.install for a in allocators):
        overridden = sorted({k for a in allocators for k in a.variables} & set(ours))
        note = f"the streampool runs use {', '.join(f'{k}={environ[k]}' for k in ours)} from this environment"
        if overridden:
            note += f" (an allocator's own {', '.join(overridden)} wins where it sets one)"
        notes.append(note)
    return notes


def run_environment(allocator: Allocator, environ: Dict[str, str], out: Path, library: Optional[str],
                    sample_ms: Optional[int]) -> Dict[str, str]:
    """The environment of one run: the user's, with the allocator's variables and the bootstrap."""
    env = {k: v for k, v in environ.items() if k != ALLOC_CONF}
    if allocator.alloc_conf:
        env[ALLOC_CONF] = allocator.alloc_conf
    env.update(allocator.variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BOOTSTRAP_DIR), environ.get("PYTHONPATH")]))
    env[ALLOCATOR_ENV] = allocator.name
    env[OUT_ENV] = str(out)
    env[PACKAGE_ENV] = str(PACKAGE_DIR)
    if allocator.install:
        env[INSTALL_ENV] = "1"
        if library:
            env["STREAMPOOL_LIBRARY"] = library
    if sample_ms:
        env[SAMPLE_ENV] = str(sample_ms)
    return env


def _status(returncode: int) -> str:
    if returncode >= 0:
        return str(returncode)
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _end_group(proc: subprocess.Popen, grace_s: float = 5.0) -> bool:
    """SIGTERM, then after ``grace_s`` SIGKILL, every process left in the run's process group (the
    run leads a group of its own: start_new_session); True if any was there. Reaps the run."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the run itself: a zombie still counts as a member of its group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return True


def _child_records(out: Path) -> List[dict]:
    records = []
    for path in sorted(out.glob("stats-*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def _judge(allocator: Allocator, result: RunResult, records: List[dict], stderr_text: str) -> None:
    """Fill in the run's OOMs, peak tensor bytes and, where it does not count, why."""
    used_cuda = [r for r in records if r.get("cuda_used")]
    counted = [r for r in used_cuda if "devices" in r]
    if counted and len(counted) == len(used_cuda):
        devices = [d for r in counted for d in r["devices"].values()]
        result.ooms = sum(d.get("num_ooms") or 0 for d in devices)
        result.peak_tensor_bytes = sum(d.get("peak_allocated_bytes") or 0 for d in devices)
    if OOM_TEXT.search(stderr_text):
        result.ooms = max(result.ooms or 0, 1)
    if result.exit_status != "0":
        result.failure = f"exit status {result.exit_status}"
    elif allocator.install and any(not r.get("streampool_installed") for r in used_cuda):
        pids = [str(r["pid"]) for r in used_cuda if not r.get("streampool_installed")]
        result.failure = f"streampool was not in use in process {', '.join(pids)}, which used CUDA"
    elif not allocator.install and any(r.get("streampool_installed") for r in used_cuda):
        result.failure = "the command installs streampool itself, so this was no run of " + allocator.name


Sampler = Optional[NvmlSampler]  # or any object with baseline(), track(pid), read() -> Reading


def run_once(allocator: Allocator, command: Sequence[str], env: Dict[str, str], out: Path, sampler: Sampler,
             interval_s: float, timeout_s: Optional[float], round_index: int) -> RunResult:
    """Run ``command`` once; its logs and child files go to ``out``."""
    if sampler is not None:
        sampler.baseline()
    readings: List[Tuple[float, Reading]] = []
    stop = threading.Event()
    start_wall, start = time.time(), time.monotonic()
    with open(out / "stdout.txt", "wb") as stdout, open(out / "stderr.txt", "wb") as stderr:
        proc = subprocess.Popen(list(command), env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def sample() -> None:
        try:
            sampler.track(proc.pid)
            while True:
                readings.append((time.monotonic() - start, sampler.read()))
                if stop.wait(interval_s):
                    return
        except Exception as exc:  # the run goes on; its memory is what was read until then
            (out / "sampler-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")

    thread = threading.Thread(target=sample, name="streampool-compare-nvml", daemon=True) if sampler else None
    if thread:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _end_group(proc)
    except BaseException:  # Ctrl-C: end the run's processes before going on
        _end_group(proc)
        raise
    finally:
        wall_s = time.monotonic() - start
        stop.set()
        if thread:
            thread.join()
    leftover = _end_group(proc)
    result = RunResult(allocator.name, round_index, "timeout" if timed_out else _status(proc.returncode),
                       wall_s, log_dir=str(out))
    if sampler is not None:
        result.source, result.series = choose_series(readings, getattr(sampler, "sources", NvmlSampler.sources))
    else:
        result.series = read_child_samples(out, start_wall, interval_s)
        result.source = SOURCE_CHILD if result.series else None
    result.peak_bytes = max((b for _, b in result.series), default=None)
    stderr_text = (out / "stderr.txt").read_bytes().decode("utf-8", errors="replace")
    _judge(allocator, result, _child_records(out), stderr_text)
    if timed_out:
        result.failure = f"ran past --timeout-s {timeout_s:g}"
    if result.failure:
        result.stderr_tail = stderr_tail(out / "stderr.txt")
    if leftover:
        (out / "leftover.txt").write_text("processes of the run were still there after it exited; ended\n")
    return result


def _progress_end(result: RunResult) -> str:
    peak = "-" if result.peak_bytes is None else f"{result.peak_bytes / 2**30:.2f} GiB"
    text = f"{result.wall_s:.1f} s, peak {peak}, exit {result.exit_status}"
    return text if result.ok else f"{text}  FAILED: {result.failure}"


def compare(command: Sequence[str], allocators: Sequence[Allocator], runs: int, plot_path: Optional[str] = None,
            json_path: Optional[str] = None, log_dir: Optional[str] = None, interval_ms: int = 50,
            timeout_s: Optional[float] = None, environ: Optional[Dict[str, str]] = None,
            sampler_factory: Optional[Callable[[], Sampler]] = None,
            gpu_check: Callable[[], Optional[str]] = cuda_unavailable_reason, out=sys.stdout) -> int:
    """Run the comparison and print it; returns the exit status (0: every run succeeded, 1: some
    failed, 2: nothing could run). ``sampler_factory`` and ``gpu_check`` are for tests."""
    def say(text: str = "", end: str = "\n") -> None:
        print(text, end=end, file=out, flush=True)

    reason = gpu_check()
    if reason is not None:
        print(f"streampool compare needs a CUDA GPU and there is none here: {reason}", file=sys.stderr)
        return 2
    environ = dict(os.environ if environ is None else environ)
    library = None
    if any(a.install for a in allocators):
        library = environ.get("STREAMPOOL_LIBRARY") or str(_lib.find_library())
    if sampler_factory is None:
        sampler_factory = NvmlSampler
    try:
        sampler = sampler_factory()
        sample_ms = None
    except OSError as exc:
        sampler, sample_ms = None, interval_ms
        say(f"note: NVML cannot be used ({exc}); the runs sample torch.cuda.mem_get_info themselves")
    folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="streampool-compare-"))
    folder.mkdir(parents=True, exist_ok=True)
    plan = schedule(allocators, runs)
    order = [a.name for a in allocators]
    say(f"streampool compare: {shlex.join(command)}")
    say(f"plan: {len(plan)} runs of your command, one after the other: {runs} round(s) of: "
        f"{', '.join(a.name for a, _ in plan[: len(allocators) + 1])}; so about {len(plan)} times "
        f"as long as one run takes (the minutes follow the first run); logs in {folder}")
    for note in environment_notes(environ, allocators):
        say(f"note: {note}")
    results: List[RunResult] = []
    interrupted = False
    try:
        for number, (allocator, round_index) in enumerate(plan, start=1):
            out_dir = folder / f"run-{number:02d}-{allocator.name}"
            out_dir.mkdir()
            say(f"[{number:>{len(str(len(plan)))}}/{len(plan)}] {allocator.name:<18} round {round_index}/{runs} ... ", end="")
            env = run_environment(allocator, environ, out_dir, library, sample_ms)
            result = run_once(allocator, command, env, out_dir, sampler, interval_ms / 1000.0, timeout_s, round_index)
            results.append(result)
            say(_progress_end(result))
            if number == 1 and len(plan) > 1:
                say(f"estimate: about {len(plan) * result.wall_s / 60:.1f} min for the {len(plan)} runs "
                    f"at {result.wall_s:.1f} s each (--runs sets the rounds)")
    except KeyboardInterrupt:
        interrupted = True
        say("\ninterrupted: the table covers the runs that finished")
    finally:
        if sampler is not None and hasattr(sampler, "close"):
            sampler.close()
    sources = sorted({r.source for r in results if r.source})
    say()
    say(f"memory: {' / '.join(sources) if sources else 'not measured'}; sampled every {interval_ms} ms")
    say(format_report(summarise(results, order, runs)))
    failures = format_failures(results)
    if failures:
        say()
        say(failures)
    if plot_path:
        try:
            say(f"\nplot: {plot(results, order, plot_path, shlex.join(command), ' / '.join(sources) or 'not measured')}")
        except (ImportError, OSError, ValueError) as exc:
            say(f"\nerror: cannot draw {plot_path}: {exc}")
            return 1
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"command": list(command), "interval_ms": interval_ms, "runs": [asdict(r) for r in results]}, indent=1))
        say(f"results: {json_path}")
    if interrupted:
        return 130
    return 0 if results and all(r.ok for r in results) else 1

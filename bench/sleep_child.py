"""The sleep-and-wake benchmark's child (bench/sleep.py has the method): one configuration's
measurement in a process of its own, started as ``python3 -m bench.sleep --child CONFIG --out
FILE``; its record (a JSON object) is written to FILE after every stage.

Invariant: whatever goes wrong is caught and recorded with the stage it happened in; nothing is
allocated on the device while it sleeps (only readings: ``mem_get_info``, NVML, the allocator's
statistics); the comparisons are bit for bit, on host copies made before the sleep (copies on
the device would be part of what the sleep is measured on).
"""

import gc
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from . import protocol
from .sleep import (BUFFER_VARIABLE, CONFIGS, CUBLAS_WORKSPACE, GB, GIB, NATIVE,
                    PRELOADED_VARIABLE, STREAMPOOL_RESERVED, STREAMPOOLS, TMS, TMS_TORCH,
                    finite)
from .sleep_workload import TRAIN_STEPS, Workload, same_parameters

BUFFER_BYTES = 4 * GIB
LINK_BYTES = GIB
LINK_REPEATS = 3
ASLEEP_SETTLE_S = 0.5  # between the end of a sleep and the reading of what is held
PRELOAD_STEM = "torch_memory_saver_hook_mode_preload"
MAX_MISMATCHES = 10


class Record:
    """A child's record, written to its file after every stage."""

    def __init__(self, config: str, path: Path) -> None:
        self.path = path
        self.data: Dict[str, Any] = {"config": config, "ok": False, "stage": "start",
                                     "error": None, "pid": os.getpid(), "stages_s": {},
                                     "facts": {}}
        self._began = time.monotonic()

    def stage(self, name: str) -> None:
        now = time.monotonic()
        self.data["stages_s"][self.data["stage"]] = round(now - self._began, 3)
        self._began = now
        self.data["stage"] = name
        self.save()
        protocol.progress(f"[{self.data['config']}] {name}")

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def save(self) -> None:
        text = json.dumps(finite(self.data), indent=1, allow_nan=False, default=str)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(self.path)


def preloaded_path() -> Optional[str]:
    """The torch_memory_saver preload .so mapped into this process, if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        if PRELOAD_STEM in line:
            return line.split()[-1]
    return None


def _cudart_directories(torch: Any) -> List[str]:
    """Where the libcudart torch loads lies: from this process's mappings, else torch's
    nvidia/ packages."""
    found: List[str] = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if "/libcudart.so" in path:
                found.append(str(Path(path).parent))
    except (OSError, IndexError):
        pass
    if not found:
        nvidia = Path(torch.__file__).resolve().parent.parent / "nvidia"
        major = str(getattr(torch.version, "cuda", "") or "").split(".")[0]
        found = [str(p.parent) for p in nvidia.glob(f"**/libcudart.so.{major}*")] if major else []
    return list(dict.fromkeys(found))


def reexec_with_preload(config: str, out: Path, record: Record) -> None:
    """Start this child again with torch_memory_saver's preload .so in LD_PRELOAD (it must be
    there when the process starts); does not return."""
    import torch  # loads libcudart; CUDA is not started
    from torch_memory_saver.utils import get_binary_path_from_package

    library = str(get_binary_path_from_package(PRELOAD_STEM))
    directories = _cudart_directories(torch)
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join([library] + [p for p in env.get("LD_PRELOAD", "").split(":") if p])
    env["LD_LIBRARY_PATH"] = ":".join(
        directories + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
    env[PRELOADED_VARIABLE] = "1"
    record["reexec"] = {"LD_PRELOAD": env["LD_PRELOAD"], "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]}
    record.stage("re-exec with LD_PRELOAD")
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "bench.sleep", "--child", config, "--out", str(out)]
    os.execve(sys.executable, argv, env)


class Memory:
    """Readings of held device memory: NVML's figure for this process where it lists it, and
    the device's total - free."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.nvml = None
        self.device = None
        try:
            from . import nvml

            self.nvml = nvml.Nvml.open()
            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            uuid = str(getattr(properties, "uuid", "") or "")
            self.device = self.nvml.handle(uuid) if self.nvml else None
        except Exception as exc:  # NVML is optional
            protocol.progress(f"NVML unavailable: {exc}")
            self.nvml = self.device = None

    def read(self) -> Dict[str, Any]:
        torch = self.torch
        free, total = torch.cuda.mem_get_info()
        process = None
        if self.nvml is not None and self.device is not None:
            try:
                used = self.nvml.process_used_bytes(self.device)
                process = None if used is None else used.get(os.getpid())
            except Exception:
                process = None
        reading = {"device_used_bytes": total - free, "device_total_bytes": total,
                   "process_bytes": process}
        for name in ("memory_reserved", "memory_allocated"):
            try:
                reading[name.replace("memory_", "") + "_bytes"] = getattr(torch.cuda, name)()
            except Exception:
                reading[name.replace("memory_", "") + "_bytes"] = None
        return reading


def measure_link(torch: Any, nbytes: int = LINK_BYTES, repeats: int = LINK_REPEATS) -> Dict:
    """The host link: a pinned host tensor copied to the device and back, best of ``repeats``
    each way (after one warm-up each), wall time with synchronisation around each copy."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host.fill_(7)

    def best(copy: Callable[[], Any]) -> float:
        copy()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            began = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
        return min(times)

    h2d_s = best(lambda: device.copy_(host, non_blocking=True))
    d2h_s = best(lambda: host.copy_(device, non_blocking=True))
    return {"bytes": nbytes, "repeats": repeats, "h2d_s": h2d_s, "d2h_s": d2h_s,
            "h2d_gbps": nbytes / h2d_s / GB, "d2h_gbps": nbytes / d2h_s / GB}


class Sleeper:
    """What sleep, wake and the workload's allocation scope are for one configuration."""

    def __init__(self, config: str, record: Record) -> None:
        self.config = config
        self.tms = None
        facts = record["facts"]
        if config in STREAMPOOLS:
            import streampool

            # The idle release off: the sleep itself gives back everything (it would otherwise
            # give back, 2 s after the last free, what the training step left unused).
            streampool.install(backend="vmm", idle_release="off")
            self.streampool = streampool
            # Relative to the repository (the child's working directory): a committed report
            # names no folder of the machine that ran it.
            facts["streampool_library"] = os.path.relpath(streampool.library_path())
            facts["streampool_backend"] = os.environ.get("STREAMPOOL_BACKEND")
        elif config in (TMS, TMS_TORCH):
            from torch_memory_saver import torch_memory_saver

            if config == TMS_TORCH:
                torch_memory_saver.hook_mode = "torch"
            self.tms = torch_memory_saver
            try:
                from importlib.metadata import version

                facts["torch_memory_saver"] = version("torch_memory_saver")
            except Exception:
                facts["torch_memory_saver"] = "unknown version"

    def scope(self) -> Any:
        if self.tms is not None:
            return self.tms.region(tag="sleep-bench", enable_cpu_backup=True)
        return nullcontext()

    def describe(self, torch: Any, record: Record) -> None:
        """After CUDA started: facts only the running library can give."""
        if self.config in STREAMPOOLS:
            record["facts"]["streampool_version"] = self.streampool.__version__
        if self.tms is not None:
            try:
                impl = self.tms._impl
                record["tms"] = {
                    "hook_mode": impl._hook_mode,
                    "binary": str(impl._hook_util.get_path_binary()),
                    "cpu_backup_backend":
                        impl._binary_wrapper.cdll.tms_get_cpu_backup_backend().decode(),
                }
            except Exception as exc:
                record["tms"] = {"error": protocol.tail(str(exc), 2)}

    def sleep(self, torch: Any) -> Optional[int]:
        if self.config in STREAMPOOLS:
            return self.streampool.sleep(level=1)
        torch.cuda.empty_cache()
        self.tms.pause()
        return None

    def wake(self, torch: Any) -> Optional[int]:
        if self.config in STREAMPOOLS:
            return self.streampool.wake()
        self.tms.resume()
        return None

    def sleeping_bytes(self) -> Optional[int]:
        return self.streampool.sleeping_bytes() if self.config in STREAMPOOLS else None


def timed(torch: Any, action: Callable[[], Any]) -> tuple:
    """(seconds, result) of ``action`` with the device synchronised before and after."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    result = action()
    torch.cuda.synchronize()
    return time.perf_counter() - began, result


def child(config: str, out: Path) -> int:
    record = Record(config, out)
    record["preloaded_at_start"] = preloaded_path()  # before anything maps the .so
    try:
        measure(config, out, record)
        record["ok"] = True
        record.stage("done")
    except BaseException as exc:  # recorded, whatever it is
        record["error"] = f"at stage {record.data['stage']}: {protocol.error_text(exc)}"
        protocol.progress(record.data["error"])
    finally:
        record.save()
    return 0 if record.data["ok"] else 1


def measure(config: str, out: Path, record: Record) -> None:
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    facts = record["facts"]
    facts["python"] = sys.version.split()[0]
    if config == TMS:
        record.stage("preload")
        record["preload"] = {k: os.environ.get(k) for k in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        if record["preloaded_at_start"] is None:
            if os.environ.get(PRELOADED_VARIABLE):
                raise RuntimeError(
                    f"LD_PRELOAD={os.environ.get('LD_PRELOAD')!r} did not load the .so at start "
                    "(the dynamic loader's message is at the top of the child's log)")
            reexec_with_preload(config, out, record)
    record.stage("allocator")
    sleeper = Sleeper(config, record)
    import torch

    facts.update({"torch": torch.__version__, "cuda": torch.version.cuda})
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    buffer_bytes = int(float(os.environ.get(BUFFER_VARIABLE) or BUFFER_BYTES / GIB) * GIB)
    record["buffer_bytes"] = buffer_bytes

    record.stage("context")
    torch.cuda.init()
    tiny = torch.ones(16, device="cuda")
    del tiny
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    facts["device"] = torch.cuda.get_device_name(0)
    record["allocator_backend"] = torch.cuda.get_allocator_backend()
    memory = Memory(torch)
    record["context"] = memory.read()

    record.stage("link")
    record["link"] = measure_link(torch)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        torch._C._host_emptyCache()  # the pinned tensor's host memory
    except Exception:
        pass
    record["after_link"] = memory.read()

    record.stage("build")
    with sleeper.scope():
        workload = Workload(torch, record, buffer_bytes)
    sleeper.describe(torch, record)
    record["live_bytes"] = workload.live_bytes()

    record.stage("snapshot")
    workload.take_snapshot()

    record.stage("reference")
    with sleeper.scope():
        losses, parameters = [], []
        for _ in range(2):
            losses.append(workload.step(TRAIN_STEPS))
            parameters.append(workload.parameters_on_host())
            workload.restore()
    record["reference_losses"] = [x.hex() for x in losses]
    record["reference_repeatable"] = (
        losses[0].hex() == losses[1].hex() and same_parameters(torch, *parameters))
    reference_loss, reference = losses[0], parameters[0]
    del parameters
    record.stage("restore check")
    wrong = workload.mismatches()
    record["restore_equal"] = not wrong
    record["restore_mismatches"] = wrong[:MAX_MISMATCHES]

    gc.collect()
    torch.cuda.synchronize()
    record["before"] = memory.read()
    if config == NATIVE:
        return

    if config == STREAMPOOL_RESERVED:
        record.stage("reserve")
        record["reserve_s"], record["reserved_bytes"] = timed(
            torch, lambda: sleeper.streampool.reserve_sleep_buffer())

    record.stage("sleep")
    addresses = workload.addresses()
    gc.collect()
    record["sleep_s"], record["sleep_returned"] = timed(torch, lambda: sleeper.sleep(torch))
    time.sleep(ASLEEP_SETTLE_S)
    record["asleep"] = memory.read()
    record["sleeping_bytes"] = sleeper.sleeping_bytes()

    record.stage("wake")
    record["wake_s"], record["wake_returned"] = timed(torch, lambda: sleeper.wake(torch))
    record["woken"] = memory.read()

    record.stage("compare")
    wrong = workload.mismatches()
    record["bitwise_equal"] = not wrong
    record["mismatches"] = wrong[:MAX_MISMATCHES]
    record["addresses_kept"] = workload.addresses() == addresses

    record.stage("step after wake")
    with sleeper.scope():
        loss = workload.step(TRAIN_STEPS)
    after = workload.parameters_on_host()
    record["loss_after_wake"] = loss.hex()
    record["step_equal"] = (loss.hex() == reference_loss.hex()
                            and same_parameters(torch, after, reference))
    del after, reference

    record.stage("second cycle")
    second: Dict[str, Any] = {}
    record["second_cycle"] = second
    gc.collect()
    torch.cuda.synchronize()
    second["before"] = memory.read()
    second["sleep_s"], second["sleep_returned"] = timed(torch, lambda: sleeper.sleep(torch))
    time.sleep(ASLEEP_SETTLE_S)
    second["asleep"] = memory.read()
    second["wake_s"], _ = timed(torch, lambda: sleeper.wake(torch))
    second["woken"] = memory.read()

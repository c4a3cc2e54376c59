"""Device memory of a running command's process tree, for ``streampool compare``.

Readers: NVML (``libnvidia-ml.so.1`` through ctypes, no Python package): the used memory NVML
lists for each process of the run's tree (per process, the CUDA context included), and the
used memory of every device (whole devices, other processes included), for machines whose NVML
lists processes outside this PID namespace. Without NVML the run's processes sample
``torch.cuda.mem_get_info`` themselves (``_bootstrap/sitecustomize.py``) and
:func:`read_child_samples` merges their files.

Invariant: a reading never guesses: a figure that cannot be had is None, and the caller says
which reader produced the numbers it reports.
"""

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1

SOURCE_PROCESS = "NVML, per process (the run's processes summed, CUDA contexts included)"
SOURCE_DEVICE = (
    "NVML, whole devices (the run's processes are not visible to NVML here: used memory of every "
    "device minus what was used before the run, so other processes on the GPUs count too)"
)
SOURCE_CHILD = (
    "torch.cuda.mem_get_info sampled inside the run's processes (no NVML here: whole devices, "
    "other processes on the GPUs count too)"
)


@dataclass
class Reading:
    """One sample. ``process_bytes``: used memory NVML lists for processes of the run (None when
    it lists none of them); ``device_bytes``: used memory of every device (None: unknown)."""

    process_bytes: Optional[int]
    device_bytes: Optional[int]


def parent_pid(pid: int) -> Optional[int]:
    """The parent of ``pid`` from /proc, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def process_tree(root_pid: int) -> Set[int]:
    """``root_pid`` and every live descendant of it."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def descends_from(pid: int, root_pid: int, cache: Dict[int, bool]) -> bool:
    """True if ``pid`` is ``root_pid`` or below it (answers cached: a process keeps its line)."""
    chain = []
    current: Optional[int] = pid
    answer = False
    while current is not None and current > 1:
        if current in cache:
            answer = cache[current]
            break
        chain.append(current)
        if current == root_pid:
            answer = True
            break
        current = parent_pid(current)
    for seen in chain:
        cache[seen] = answer
    return answer


class _ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (the _v2 and _v3 calls)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (the unversioned call of older drivers)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _Memory(ctypes.Structure):
    """nvmlMemory_t."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlSampler:
    """Reads NVML for one run at a time: :meth:`baseline` before the run starts, :meth:`track` with
    its pid, :meth:`read` while it goes. The constructor raises OSError if NVML cannot be used."""

    sources = (SOURCE_PROCESS, SOURCE_DEVICE)

    def __init__(self) -> None:
        try:
            self._nvml = ctypes.CDLL(NVML_LIBRARY)
        except OSError as exc:
            raise OSError(f"{NVML_LIBRARY} not found") from exc
        self._check(self._nvml.nvmlInit_v2(), "nvmlInit_v2")
        count = ctypes.c_uint(0)
        self._check(self._nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        self._devices = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
            self._devices.append(handle)
        self._processes, self._info = self._process_call()
        self._root_pid = 0
        self._lineage: Dict[int, bool] = {}
        self._device_before = 0

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != NVML_SUCCESS:
            raise OSError(f"{call} failed with NVML error {status}")

    def _process_call(self) -> Tuple[object, type]:
        for name, info in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1),
        ):
            function = getattr(self._nvml, name, None)
            if function is not None:
                return function, info
        raise OSError(f"{NVML_LIBRARY} has no nvmlDeviceGetComputeRunningProcesses")

    def _device_used_bytes(self) -> Optional[int]:
        total = 0
        for handle in self._devices:
            memory = _Memory()
            if self._nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != NVML_SUCCESS:
                return None
            total += memory.used
        return total

    def _processes_on(self, handle: ctypes.c_void_p) -> List[Tuple[int, Optional[int]]]:
        """(pid, used bytes) of the compute processes on one device; None where NVML says 'not
        available' (as it does in some containers)."""
        capacity = 64
        while True:
            count = ctypes.c_uint(capacity)
            infos = (self._info * capacity)()
            status = self._processes(handle, ctypes.byref(count), infos)
            if status == NVML_ERROR_INSUFFICIENT_SIZE:
                capacity = max(count.value, capacity * 2)
                continue
            if status != NVML_SUCCESS:
                return []
            return [
                (int(info.pid), None if info.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else int(info.usedGpuMemory))
                for info in infos[: count.value]
            ]

    def baseline(self) -> None:
        """Before a run starts: the devices' used memory, which whole-device readings subtract."""
        self._device_before = self._device_used_bytes() or 0

    def track(self, root_pid: int) -> None:
        """The run's processes are ``root_pid`` and its descendants."""
        self._root_pid = root_pid
        self._lineage = {}

    def read(self) -> Reading:
        """Per process: None unless NVML lists a process of the run, and None too if it cannot say
        how much one of them uses (a sum without it would be too small)."""
        matched, known = False, True
        process_bytes = 0
        for handle in self._devices:
            for pid, used in self._processes_on(handle):
                if descends_from(pid, self._root_pid, self._lineage):
                    matched = True
                    known = known and used is not None
                    process_bytes += used or 0
        device = self._device_used_bytes()
        device_bytes = None if device is None else max(0, device - self._device_before)
        return Reading(process_bytes if matched and known else None, device_bytes)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def choose_series(
    readings: List[Tuple[float, Reading]], sources: Tuple[str, str] = (SOURCE_PROCESS, SOURCE_DEVICE)
) -> Tuple[Optional[str], List[Tuple[float, int]]]:
    """The source and the (seconds, bytes) series a run's readings support: per process if the
    reader saw any process of the run, else whole devices, else none (None, []). ``sources``
    names the two kinds of figure (a stand-in reader in tests has its own)."""
    if any(r.process_bytes is not None for _, r in readings):
        return sources[0], [(t, r.process_bytes or 0) for t, r in readings]
    if readings and all(r.device_bytes is not None for _, r in readings):
        return sources[1], [(t, int(r.device_bytes or 0)) for t, r in readings]
    return None, []


def read_child_samples(folder: Path, start_s: float, interval_s: float) -> List[Tuple[float, int]]:
    """Merge the ``samples-<pid>.txt`` files the run's processes wrote (lines ``time_s device
    used_bytes``, wall-clock time): per time slot of ``interval_s`` and device the largest
    figure (processes on one device see the same device), summed over devices (slots are the
    nearest multiple of ``interval_s``: processes sample out of step). Returns
    (seconds since ``start_s``, bytes), in time order."""
    slots: Dict[int, Dict[int, int]] = {}
    for path in sorted(folder.glob("samples-*.txt")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue  # a line cut short when the process ended
            try:
                time_s, device, used = float(parts[0]), int(parts[1]), int(parts[2])
            except ValueError:
                continue
            slot = slots.setdefault(round((time_s - start_s) / interval_s), {})
            slot[device] = max(slot.get(device, 0), used)
    return [(slot * interval_s, sum(devices.values())) for slot, devices in sorted(slots.items())]

"""NVML through ctypes (libnvidia-ml.so.1, no Python dependency): clocks, power, throttle reasons,
the device memory each process uses, and the device's PCI bus id (where its CPUs are).

Invariant: nothing here raises for a missing or failing NVML: ``Nvml.open()`` returns None, and
every reading is None when its call fails, so a run without NVML measures as before and says so.
Process lists are trusted only when they parse sanely (see ``process_used_bytes``); inside a
container they are often empty or list host pids, which callers detect by not finding their own.
"""

import ctypes
from typing import Any, Dict, List, Optional

LIBRARY = "libnvidia-ml.so.1"
SUCCESS = 0
ERROR_INSUFFICIENT_SIZE = 7
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
# Throttle (clock event) reasons that slow the clocks; idle (0x1), application clocks (0x2) and
# sync boost (0x10) do not mean the GPU was held back.
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
THROTTLE_MASK = sum(THROTTLE_BITS)


class _ProcessV2(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessV3(ctypes.Structure):
    _fields_ = _ProcessV2._fields_ + [("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


def throttle_names(reasons: Optional[int]) -> List[str]:
    """The names of the slowing reasons set in ``reasons``."""
    if not reasons:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if reasons & bit]


class Nvml:
    """An initialised NVML library."""

    def __init__(self, library: Any) -> None:
        self.lib = library
        self._processes = self._process_function()

    @classmethod
    def open(cls) -> Optional["Nvml"]:
        try:
            library = ctypes.CDLL(LIBRARY)
            if library.nvmlInit_v2() != SUCCESS:
                return None
        except (OSError, AttributeError):
            return None
        return cls(library)

    def driver_version(self) -> Optional[str]:
        text = ctypes.create_string_buffer(96)
        if self.lib.nvmlSystemGetDriverVersion(text, ctypes.c_uint(96)) != SUCCESS:
            return None
        return text.value.decode(errors="replace")

    def _has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def _process_function(self):
        """(function, struct): the process-list call of this driver and the struct it fills.
        Newer drivers fill the v2 struct through _v3 (the v3 struct with protected memory
        existed only in the drivers that lack nvmlDeviceGetRunningProcessDetailList)."""
        if self._has("nvmlDeviceGetComputeRunningProcesses_v3"):
            v3_struct = self._has("nvmlDeviceGetConfComputeMemSizeInfo") and not self._has(
                "nvmlDeviceGetRunningProcessDetailList"
            )
            function = self.lib.nvmlDeviceGetComputeRunningProcesses_v3
            return function, _ProcessV3 if v3_struct else _ProcessV2
        if self._has("nvmlDeviceGetComputeRunningProcesses_v2"):
            return self.lib.nvmlDeviceGetComputeRunningProcesses_v2, _ProcessV2
        return None, None

    def handle(self, uuid: Optional[str] = None, index: int = 0) -> Optional[ctypes.c_void_p]:
        """The device with ``uuid`` (``GPU-...``, as torch reports it) or else at ``index``."""
        device = ctypes.c_void_p()
        if uuid:
            text = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            if self.lib.nvmlDeviceGetHandleByUUID(text.encode(), ctypes.byref(device)) == SUCCESS:
                return device
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == SUCCESS:
            return device
        return None

    def pci_bus_id(self, device) -> Optional[str]:
        """``00000000:19:00.0``: the device's PCI address (None when NVML cannot say)."""
        for name in ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"):
            if not self._has(name):
                continue
            info = _PciInfo()
            if getattr(self.lib, name)(device, ctypes.byref(info)) == SUCCESS:
                return info.busId.decode(errors="replace") or None
        return None

    def _uint(self, name: str, device, *arguments) -> Optional[int]:
        if not self._has(name):
            return None
        value = ctypes.c_uint()
        if getattr(self.lib, name)(device, *arguments, ctypes.byref(value)) != SUCCESS:
            return None
        return value.value

    def throttle_reasons(self, device) -> Optional[int]:
        value = ctypes.c_ulonglong()
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if self._has(name) and getattr(self.lib, name)(device, ctypes.byref(value)) == SUCCESS:
                return value.value
        return None

    def sample(self, device) -> Dict[str, Any]:
        """Clocks (MHz), power (W), temperature (°C), throttle reasons (bit mask and names)."""
        power_mw = self._uint("nvmlDeviceGetPowerUsage", device)
        reasons = self.throttle_reasons(device)
        return {
            "sm_mhz": self._uint("nvmlDeviceGetClockInfo", device, CLOCK_SM),
            "mem_mhz": self._uint("nvmlDeviceGetClockInfo", device, CLOCK_MEM),
            "power_w": None if power_mw is None else round(power_mw / 1000, 1),
            "temp_c": self._uint("nvmlDeviceGetTemperature", device, TEMPERATURE_GPU),
            "throttle": reasons,
            "throttled": bool(reasons is not None and reasons & THROTTLE_MASK),
        }

    def process_used_bytes(self, device) -> Optional[Dict[int, int]]:
        """``{pid: used device bytes}`` of the compute processes on ``device``; None when the
        call fails or returns entries that cannot be right (a zero pid, more than the card)."""
        function, struct = self._processes
        if function is None:
            return None
        count = ctypes.c_uint(0)
        status = function(device, ctypes.byref(count), None)
        if status == SUCCESS:
            return {}
        if status != ERROR_INSUFFICIENT_SIZE:
            return None
        count.value = count.value * 2 + 8
        entries = (struct * count.value)()
        if function(device, ctypes.byref(count), entries) != SUCCESS:
            return None
        total = ctypes.c_ulonglong * 3
        memory = total()
        card_bytes = None
        if self.lib.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory)) == SUCCESS:
            card_bytes = memory[0]
        used = {}
        for entry in entries[: count.value]:
            if entry.pid == 0 or (card_bytes is not None and entry.usedGpuMemory > card_bytes):
                return None
            used[entry.pid] = entry.usedGpuMemory
        return used

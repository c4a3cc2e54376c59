"""NVML through ctypes, against a stand-in library: the process list (its struct per driver,
sanity checks), clocks, power and throttle reasons; and no NVML at all is not an error."""

import ctypes

from bench import nvml

GIB = 2**30


class FakeLibrary:
    """The few NVML entry points nvml.py calls, filling their ctypes out-arguments."""

    def __init__(self, processes, v3_struct=False, reasons=0x4, missing=()):
        self.processes, self.v3_struct, self.reasons = processes, v3_struct, reasons
        names = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetConfComputeMemSizeInfo"]
        if not v3_struct:
            names.append("nvmlDeviceGetRunningProcessDetailList")
        names += ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo",
                  "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons"]
        for name in names:
            if name not in missing and not hasattr(self, name):
                setattr(self, name, lambda *args: 0)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, device, count, entries):
        count = count._obj
        if entries is None or count.value < len(self.processes):
            count.value = len(self.processes)
            return nvml.ERROR_INSUFFICIENT_SIZE if self.processes else nvml.SUCCESS
        struct = nvml._ProcessV3 if self.v3_struct else nvml._ProcessV2
        array = ctypes.cast(entries, ctypes.POINTER(struct))
        for i, (pid, used) in enumerate(self.processes):
            array[i].pid, array[i].usedGpuMemory = pid, used
        count.value = len(self.processes)
        return nvml.SUCCESS

    def nvmlDeviceGetMemoryInfo(self, device, memory):
        memory._obj[0] = 80 * GIB
        return nvml.SUCCESS

    def nvmlDeviceGetPowerUsage(self, device, value):
        value._obj.value = 412345
        return nvml.SUCCESS

    def nvmlDeviceGetClockInfo(self, device, which, value):
        value._obj.value = 1980 if which == nvml.CLOCK_SM else 2619
        return nvml.SUCCESS

    def nvmlDeviceGetTemperature(self, device, which, value):
        value._obj.value = 51
        return nvml.SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, device, value):
        value._obj.value = self.reasons
        return nvml.SUCCESS


def test_the_process_list_in_either_struct():
    for v3 in (False, True):
        library = nvml.Nvml(FakeLibrary([(101, 3 * GIB), (202, 12 * GIB)], v3_struct=v3))
        assert library.process_used_bytes(None) == {101: 3 * GIB, 202: 12 * GIB}, v3
    assert nvml.Nvml(FakeLibrary([])).process_used_bytes(None) == {}


def test_a_process_list_that_cannot_be_right_is_not_trusted():
    assert nvml.Nvml(FakeLibrary([(0, GIB)])).process_used_bytes(None) is None
    assert nvml.Nvml(FakeLibrary([(7, 200 * GIB)])).process_used_bytes(None) is None

    def absent(self):
        raise AttributeError("not in this driver")

    class Old(FakeLibrary):
        nvmlDeviceGetComputeRunningProcesses_v3 = property(absent)

    old = Old([(7, GIB)], missing=("nvmlDeviceGetComputeRunningProcesses_v3",))
    assert nvml.Nvml(old).process_used_bytes(None) is None  # no call it knows


def test_a_sample_has_clocks_power_and_what_throttled():
    sample = nvml.Nvml(FakeLibrary([], reasons=0x4 | 0x1)).sample(None)
    assert sample == {"sm_mhz": 1980, "mem_mhz": 2619, "power_w": 412.3, "temp_c": 51,
                      "throttle": 0x5, "throttled": True}
    assert not nvml.Nvml(FakeLibrary([], reasons=0x1 | 0x10)).sample(None)["throttled"]
    assert nvml.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]


def test_no_nvml_is_none_not_an_error(monkeypatch):
    def refuse(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nvml.ctypes, "CDLL", refuse)
    assert nvml.Nvml.open() is None


def test_the_pci_bus_id_says_where_the_gpus_cpus_are():
    class Pci(FakeLibrary):
        def nvmlDeviceGetPciInfo_v3(self, device, info):
            info._obj.busId = b"00000000:19:00.0"
            return nvml.SUCCESS

    assert nvml.Nvml(Pci([])).pci_bus_id(None) == "00000000:19:00.0"
    assert nvml.Nvml(FakeLibrary([])).pci_bus_id(None) is None  # a driver without the call

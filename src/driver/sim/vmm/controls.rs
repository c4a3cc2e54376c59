//! The tests' controls and views of the simulated virtual memory: a device without it, the
//! physical bytes held, the mappings with their access.

use crate::driver::sim::SimDriver;
use crate::driver::DevicePtr;

impl SimDriver {
    /// Makes `device` report no virtual memory management support.
    pub fn set_vmm_unsupported(&self, device: usize) {
        self.vmm_unsupported.lock().push(device);
    }

    /// Physical bytes `device` holds in handles (mapped or not).
    pub fn physical_bytes(&self, device: usize) -> u64 {
        self.devices[device].lock().vmm.physical_bytes()
    }

    /// (mapped bytes, devices with access to all of them) of `device`'s mappings, for tests.
    pub fn mappings(&self, device: usize) -> Vec<(DevicePtr, u64, Vec<usize>)> {
        let d = self.devices[device].lock();
        let mappings = d.vmm.mappings.iter();
        mappings
            .map(|(&at, m)| (DevicePtr(at), m.bytes, m.access.clone()))
            .collect()
    }
}

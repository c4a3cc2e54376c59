//! The simulator's twin of managed memory: `cuMemAllocManaged` takes device memory at a new
//! address, usable by every device; `cuMemFree` first completes all work on the device (CUDA's
//! implicit synchronisation) and gives the memory back. Injected `SimFault::Alloc` and
//! `SimFault::Free` make them fail too.
//!
//! Invariants: managed memory counts as device memory until freed; a free of an address that is
//! not a live managed allocation is an error and changes nothing; both calls are forbidden
//! during a capture in global mode (counted as `"unsafe during capture"`), as `cudaMalloc` and
//! `cudaFree` are.

use super::{driver_error, SimDevice, SimDriver, SimFault, CUDA_ERROR_INVALID_VALUE};
use crate::driver::{DevicePtr, ManagedDriver};
use crate::error::Result;
use std::collections::HashMap;

/// A device's managed memory.
#[derive(Default)]
pub(super) struct SimManaged {
    /// Live allocations: address -> bytes.
    live: HashMap<DevicePtr, u64>,
    /// The device reports no managed memory (`set_managed_unsupported`).
    unsupported: bool,
}

impl SimManaged {
    pub(super) fn bytes(&self) -> u64 {
        self.live.values().sum()
    }
}

impl SimDevice {
    /// True if `[ptr, ptr + bytes)` lies inside one live managed allocation (usable by every
    /// device).
    pub(super) fn is_managed(&self, ptr: DevicePtr, bytes: u64) -> bool {
        let end = ptr.0.checked_add(bytes);
        (self.managed.live.iter())
            .any(|(&start, &len)| start <= ptr && end.is_some_and(|end| end <= start.0 + len))
    }
}

impl SimDriver {
    /// Makes `device` report no managed memory support.
    pub fn set_managed_unsupported(&self, device: usize) {
        self.devices[device].lock().managed.unsupported = true;
    }
}

impl ManagedDriver for SimDriver {
    fn managed_supported(&self, device: usize) -> Result<bool> {
        Ok(!self
            .device(device, "cuDeviceGetAttribute")?
            .managed
            .unsupported)
    }

    fn mem_alloc_managed(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
        let call = "cuMemAllocManaged";
        self.take_fault(SimFault::Alloc, call)?;
        let mut d = self.device(device, call)?;
        self.check_capture_mode(&d, call);
        if bytes == 0 {
            return Err(driver_error(
                call,
                CUDA_ERROR_INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE",
            ));
        }
        let fits = (d.memory_in_use_bytes().checked_add(bytes))
            .is_some_and(|total| total <= self.memory_bytes);
        if !fits {
            return Err(Self::out_of_memory(call));
        }
        let ptr = d
            .claim_range(bytes)
            .ok_or_else(|| Self::out_of_memory(call))?;
        d.managed.live.insert(ptr, bytes);
        d.note_in_use();
        Ok(ptr)
    }

    fn mem_free(&self, device: usize, ptr: DevicePtr) -> Result<()> {
        let call = "cuMemFree";
        self.take_fault(SimFault::Free, call)?;
        let mut d = self.device(device, call)?;
        self.check_capture_mode(&d, call);
        let Some(bytes) = d.managed.live.remove(&ptr) else {
            return Err(driver_error(
                call,
                CUDA_ERROR_INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE",
            ));
        };
        d.complete_all_streams();
        d.release_range(ptr, bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::driver::sim::SimDriver;
    use crate::driver::{DevicePtr, ManagedDriver, Stream, StreamDriver};

    #[test]
    fn managed_memory_is_device_memory_until_freed_and_a_free_waits_for_the_device() {
        let sim = SimDriver::new(2, 8 << 20).strict();
        assert!(sim.managed_supported(0).unwrap());
        let p = sim.mem_alloc_managed(0, 4 << 20).unwrap();
        assert!(sim
            .mem_alloc_managed(0, 5 << 20)
            .unwrap_err()
            .is_device_oom());
        // Any device may use it.
        sim.touch(0, 1, p.offset(512), 512, Stream(1)).unwrap();
        assert_eq!(sim.outstanding_bytes(), 4 << 20);
        assert!(sim.mem_free(0, p.offset(512)).is_err(), "not an allocation");
        assert!(
            !sim.stream_query(0, Stream(1)).unwrap(),
            "the touch is queued"
        );
        sim.mem_free(0, p).unwrap();
        assert!(
            sim.stream_query(0, Stream(1)).unwrap(),
            "cuMemFree waited for it"
        );
        assert!(sim.mem_free(0, p).is_err(), "twice");
        assert_eq!(sim.outstanding_bytes(), 0);
        assert!(sim.touch(0, 0, p, 512, Stream(1)).is_err(), "freed");
        sim.set_managed_unsupported(1);
        assert!(!sim.managed_supported(1).unwrap());
        assert!(sim.mem_free(0, DevicePtr(0x1000)).is_err());
    }

    #[test]
    fn both_calls_are_counted_during_a_capture_outside_relaxed_mode() {
        let sim = SimDriver::new(1, 8 << 20);
        sim.begin_capture(0, Stream(7));
        let p = sim.mem_alloc_managed(0, 4096).unwrap();
        sim.mem_free(0, p).unwrap();
        assert_eq!(sim.calls("unsafe during capture"), 2);
    }
}

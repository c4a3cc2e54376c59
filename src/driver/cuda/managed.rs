//! The CUDA managed-memory calls (`cuMemAllocManaged`, `cuMemFree`).
//!
//! Invariant: as for the rest of `cuda`: the device's primary context is current for every
//! call, a size is checked against `size_t`, and an error is returned, never a panic.

use super::{check, too_large, CudaDriver};
use crate::driver::{DevicePtr, ManagedDriver};
use crate::error::Result;
use cudarc::driver::sys;

impl ManagedDriver for CudaDriver {
    fn managed_supported(&self, device: usize) -> Result<bool> {
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY;
        Ok(self.device_attr(device, attr)? != 0)
    }

    fn mem_alloc_managed(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
        let _scope = self.enter(device)?;
        let size = usize::try_from(bytes).map_err(|_| too_large(bytes))?;
        let mut ptr: sys::CUdeviceptr = 0;
        let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        // SAFETY: a valid out-pointer; CU_MEM_ATTACH_GLOBAL is a valid flag.
        check("cuMemAllocManaged", unsafe {
            sys::cuMemAllocManaged(&mut ptr, size, global)
        })?;
        Ok(DevicePtr(ptr))
    }

    fn mem_free(&self, device: usize, ptr: DevicePtr) -> Result<()> {
        let _scope = self.enter(device)?;
        // SAFETY: the caller frees only what mem_alloc_managed returned, once (the driver checks
        // the address and reports an error for anything else).
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr.0) })
    }
}

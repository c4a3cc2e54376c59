//! The CUDA virtual memory calls (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, ...).
//!
//! Invariant: as for the rest of `cuda`: the device's primary context is current for every call
//! that needs one, and an error is returned, never a panic; the calls that change mappings run in
//! relaxed capture mode (see `relaxed`). Physical memory is plain device memory of the device
//! (`CU_MEM_ALLOCATION_TYPE_PINNED`), with no shareable handle type, RDMA-capable where the
//! device supports GPUDirect RDMA with virtual memory (as PyTorch's expandable segments and NCCL
//! ask), so that NCCL or a network stack can register tensors from it.

use super::{relaxed, stream_ptr, timed, too_large, CudaDriver};
use crate::driver::{DevicePtr, HostBuffer, MemHandle, Stream, VmmDriver};
use crate::error::Result;
use cudarc::driver::sys;

fn size_t(bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| too_large(bytes))
}

fn device_location(device: usize) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device as i32,
    }
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// What `cuMemCreate` and the granularity query are asked for: device memory on `device`,
/// exportable to a POSIX file descriptor if asked.
fn allocation_prop(
    device: usize,
    rdma_capable: bool,
    exportable: bool,
) -> sys::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is plain data (a NULL pointer among it); zero is its default.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = match exportable {
        true => POSIX_FD,
        false => sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
    };
    prop.location = device_location(device);
    // Only where supported: other devices (integrated GPUs) refuse the flag.
    prop.allocFlags.gpuDirectRDMACapable = rdma_capable.into();
    prop
}

impl CudaDriver {
    fn rdma_with_vmm(&self, device: usize) -> Result<bool> {
        let supported = self.device_attr(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        )?;
        Ok(supported != 0)
    }
}

impl VmmDriver for CudaDriver {
    fn vmm_supported(&self, device: usize) -> Result<bool> {
        let supported = self.device_attr(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )?;
        Ok(supported != 0)
    }

    fn vmm_granularity_bytes(&self, device: usize) -> Result<u64> {
        let prop = allocation_prop(device, false, false);
        let mut granularity: usize = 0;
        // SAFETY: valid out-pointer and a fully initialised property struct.
        timed("cuMemGetAllocationGranularity", || unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        Ok(granularity as u64)
    }

    fn address_reserve(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
        // Aligned to the granularity, so that pages counted from the base can be mapped.
        let alignment = size_t(self.vmm_granularity_bytes(device)?)?;
        let _scope = self.enter(device)?;
        let mut base: sys::CUdeviceptr = 0;
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: valid out-pointer; address 0 lets the driver choose where.
            timed("cuMemAddressReserve", || unsafe {
                sys::cuMemAddressReserve(&mut base, bytes, alignment, 0, 0)
            })
        })?;
        Ok(DevicePtr(base))
    }

    fn address_free(&self, device: usize, base: DevicePtr, bytes: u64) -> Result<()> {
        let _scope = self.enter(device)?;
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: a whole reservation made by address_reserve, with nothing mapped in it.
            timed("cuMemAddressFree", || unsafe {
                sys::cuMemAddressFree(base.0, bytes)
            })
        })
    }

    fn mem_create(&self, device: usize, bytes: u64) -> Result<MemHandle> {
        self.create(device, bytes, false)
    }

    fn mem_release(&self, device: usize, handle: MemHandle) -> Result<()> {
        let _scope = self.enter(device)?;
        relaxed(|| {
            // SAFETY: a handle from mem_create (or an import) that is no longer mapped anywhere.
            timed("cuMemRelease", || unsafe {
                sys::cuMemRelease(handle.raw() as sys::CUmemGenericAllocationHandle)
            })
        })
    }

    fn mem_map(&self, device: usize, at: DevicePtr, bytes: u64, handle: MemHandle) -> Result<()> {
        let _scope = self.enter(device)?;
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: `[at, at + bytes)` lies in a reservation and is unmapped; the handle is
            // `bytes` long, mapped from its start (offset 0).
            timed("cuMemMap", || unsafe {
                sys::cuMemMap(
                    at.0,
                    bytes,
                    0,
                    handle.raw() as sys::CUmemGenericAllocationHandle,
                    0,
                )
            })
        })
    }

    fn mem_unmap(&self, device: usize, at: DevicePtr, bytes: u64) -> Result<()> {
        let _scope = self.enter(device)?;
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: whole mappings that no work still uses (the caller's invariant).
            timed("cuMemUnmap", || unsafe { sys::cuMemUnmap(at.0, bytes) })
        })
    }

    fn mem_set_access(
        &self,
        device: usize,
        at: DevicePtr,
        bytes: u64,
        devices: &[usize],
    ) -> Result<()> {
        let _scope = self.enter(device)?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&d| sys::CUmemAccessDesc {
                location: device_location(d),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: `descs` holds `descs.len()` initialised descriptors; the range is mapped.
            timed("cuMemSetAccess", || unsafe {
                sys::cuMemSetAccess(at.0, bytes, descs.as_ptr(), descs.len())
            })
        })
    }

    fn mem_export_supported(&self, device: usize) -> Result<bool> {
        let supported = self.device_attr(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )?;
        Ok(supported != 0)
    }

    fn mem_create_exportable(&self, device: usize, bytes: u64) -> Result<MemHandle> {
        self.create(device, bytes, true)
    }

    fn mem_export_fd(&self, device: usize, handle: MemHandle) -> Result<i32> {
        let _scope = self.enter(device)?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FD the out-pointer is an int; the handle was created exportable.
        timed("cuMemExportToShareableHandle", || unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut i32 as *mut _,
                handle.raw() as sys::CUmemGenericAllocationHandle,
                POSIX_FD,
                0,
            )
        })?;
        Ok(fd)
    }

    fn mem_import_fd(&self, device: usize, fd: i32) -> Result<MemHandle> {
        let _scope = self.enter(device)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX_FD the handle argument is the descriptor itself, cast to a pointer.
        timed("cuMemImportFromShareableHandle", || unsafe {
            sys::cuMemImportFromShareableHandle(&mut handle, fd as isize as *mut _, POSIX_FD)
        })?;
        Ok(MemHandle::from_raw(handle as usize))
    }

    fn host_alloc(&self, device: usize, bytes: u64) -> Result<HostBuffer> {
        let _scope = self.enter(device)?;
        let ptr = super::host::alloc(size_t(bytes)?)?;
        Ok(HostBuffer::from_raw(ptr as usize))
    }

    fn host_free(&self, device: usize, buffer: HostBuffer) {
        if let Ok(_scope) = self.enter(device) {
            super::host::free(buffer.raw() as *mut std::ffi::c_void);
        }
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: HostBuffer,
        dst_offset: u64,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let _scope = self.enter(device)?;
        let at = (dst.raw() as u64)
            .checked_add(dst_offset)
            .ok_or_else(|| too_large(dst_offset))?;
        let bytes = size_t(bytes)?;
        // SAFETY: `[at, at + bytes)` lies in the caller's page-locked host buffer and
        // `[src, src + bytes)` is mapped device memory with access; both stay as they are until
        // the stream's work completes (the caller's).
        timed("cuMemcpyDtoHAsync", || unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                at as *mut std::ffi::c_void,
                src.0,
                bytes,
                stream_ptr(stream),
            )
        })
    }

    fn copy_to_device(
        &self,
        device: usize,
        dst: DevicePtr,
        src: HostBuffer,
        src_offset: u64,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let _scope = self.enter(device)?;
        let at = (src.raw() as u64)
            .checked_add(src_offset)
            .ok_or_else(|| too_large(src_offset))?;
        let bytes = size_t(bytes)?;
        // SAFETY: as copy_to_host, the other way.
        timed("cuMemcpyHtoDAsync", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.0,
                at as *const std::ffi::c_void,
                bytes,
                stream_ptr(stream),
            )
        })
    }
}

impl CudaDriver {
    /// `cuMemCreate` of `bytes` on `device`, exportable to a POSIX file descriptor if asked.
    fn create(&self, device: usize, bytes: u64, exportable: bool) -> Result<MemHandle> {
        let prop = allocation_prop(device, self.rdma_with_vmm(device)?, exportable);
        let _scope = self.enter(device)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let bytes = size_t(bytes)?;
        relaxed(|| {
            // SAFETY: valid out-pointer; `bytes` is a multiple of the granularity (the caller's).
            timed("cuMemCreate", || unsafe {
                sys::cuMemCreate(&mut handle, bytes, &prop, 0)
            })
        })?;
        Ok(MemHandle::from_raw(handle as usize))
    }
}

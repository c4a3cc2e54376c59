//! The CUDA calls that share pool memory between processes (POSIX file descriptors).
//!
//! Invariant: as for the rest of `cuda`: the device's primary context is current for every call
//! that needs one, and an error is returned, never a panic.

use super::{check, pool_ptr, stream_ptr, CudaDriver};
use crate::driver::{DevicePtr, EventHandle, IpcBytes, IpcDriver, PoolHandle, Stream};
use crate::error::Result;
use cudarc::driver::sys;

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

impl IpcDriver for CudaDriver {
    fn ipc_supported(&self, device: usize) -> Result<bool> {
        let types = self.device_attr(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
        )?;
        Ok(types as u32 & POSIX_FD.0 != 0)
    }

    fn pool_export_fd(&self, device: usize, pool: PoolHandle) -> Result<i32> {
        let _scope = self.enter(device)?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FD the out-pointer is an int; the pool was created shareable.
        check("cuMemPoolExportToShareableHandle", unsafe {
            sys::cuMemPoolExportToShareableHandle(
                &mut fd as *mut i32 as *mut _,
                pool_ptr(pool),
                POSIX_FD,
                0,
            )
        })?;
        Ok(fd)
    }

    fn pool_import_fd(&self, device: usize, fd: i32) -> Result<PoolHandle> {
        let _scope = self.enter(device)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: for POSIX_FD the handle argument is the descriptor itself, cast to a pointer.
        check("cuMemPoolImportFromShareableHandle", unsafe {
            sys::cuMemPoolImportFromShareableHandle(&mut pool, fd as isize as *mut _, POSIX_FD, 0)
        })?;
        Ok(PoolHandle::from_raw(pool as usize))
    }

    fn pointer_export(&self, device: usize, ptr: DevicePtr) -> Result<IpcBytes> {
        let _scope = self.enter(device)?;
        // SAFETY: plain data, fully written by the call.
        let mut data: sys::CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is a live allocation of a shareable pool (checked by the caller).
        check("cuMemPoolExportPointer", unsafe {
            sys::cuMemPoolExportPointer(&mut data, ptr.0)
        })?;
        Ok(data.reserved)
    }

    fn pointer_import(
        &self,
        device: usize,
        pool: PoolHandle,
        data: &IpcBytes,
    ) -> Result<DevicePtr> {
        let _scope = self.enter(device)?;
        let mut share = sys::CUmemPoolPtrExportData { reserved: *data };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `pool` was imported by pool_import_fd; `share` is a copy the call may read.
        check("cuMemPoolImportPointer", unsafe {
            sys::cuMemPoolImportPointer(&mut ptr, pool_ptr(pool), &mut share)
        })?;
        Ok(DevicePtr(ptr))
    }

    fn ipc_event_record(&self, device: usize, stream: Stream) -> Result<(EventHandle, IpcBytes)> {
        let _scope = self.enter(device)?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointer; interprocess events must not time.
        check("cuEventCreate(INTERPROCESS)", unsafe {
            sys::cuEventCreate(&mut event, flags)
        })?;
        let recorded = (|| {
            // SAFETY: the event was just created on this device; `stream` is the caller's.
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(event, stream_ptr(stream))
            })?;
            // SAFETY: plain data, fully written by the call.
            let mut handle: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
            // SAFETY: an interprocess event and a valid out-pointer.
            check("cuIpcGetEventHandle", unsafe {
                sys::cuIpcGetEventHandle(&mut handle, event)
            })?;
            Ok(handle.reserved.map(|b| b as u8))
        })();
        match recorded {
            Ok(bytes) => Ok((EventHandle::from_raw(event as usize), bytes)),
            Err(e) => {
                // SAFETY: the event is not used after this.
                unsafe { sys::cuEventDestroy_v2(event) };
                Err(e)
            }
        }
    }

    fn ipc_event_wait(&self, device: usize, stream: Stream, handle: &IpcBytes) -> Result<()> {
        let _scope = self.enter(device)?;
        let handle = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `handle` came from cuIpcGetEventHandle in the exporting process.
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut event, handle)
        })?;
        // SAFETY: an opened event and the caller's stream; the wait is enqueued before the
        // event is destroyed, which CUDA allows.
        let waited = check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream_ptr(stream), event, 0)
        });
        // SAFETY: the event is not used after this.
        unsafe { sys::cuEventDestroy_v2(event) };
        waited
    }
}

//! The simulator's twin of sharing pool memory between processes, within one process: an
//! exported pool is a real file descriptor (a memfd) that maps back to the pool, an imported
//! pointer is the exporter's block, counted so that freeing it releases the import only.
//!
//! Invariant: as CUDA: only a pool created shareable exports, only a live block of it exports a
//! pointer, and an import is released by `free_async` without freeing the exporter's block.

use super::{driver_error, SimDriver, CUDA_ERROR_INVALID_VALUE};
use crate::driver::{
    DevicePtr, EventHandle, IpcBytes, IpcDriver, PoolHandle, Stream, StreamDriver,
};
use crate::error::Result;

pub(super) fn inode(fd: i32) -> Option<u64> {
    // SAFETY: libc::stat is plain data, for which all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a stat struct we own; a bad fd only returns -1.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}

fn word(data: &IpcBytes, i: usize) -> u64 {
    u64::from_le_bytes(data[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

fn invalid(call: &'static str) -> crate::error::Error {
    driver_error(call, CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE")
}

impl SimDriver {
    /// Makes `device` report no POSIX file descriptor sharing (an unsupported GPU or driver).
    pub fn set_ipc_unsupported(&self, device: usize) {
        self.ipc_unsupported.lock().push(device);
    }

    /// Pointers imported and not yet released, on `device`.
    pub fn imported_count(&self, device: usize) -> u32 {
        self.devices[device].lock().imported.values().sum()
    }
}

impl IpcDriver for SimDriver {
    fn ipc_supported(&self, device: usize) -> Result<bool> {
        drop(self.device(device, "cuDeviceGetAttribute")?);
        Ok(!self.ipc_unsupported.lock().contains(&device))
    }

    fn pool_export_fd(&self, device: usize, pool: PoolHandle) -> Result<i32> {
        let call = "cuMemPoolExportToShareableHandle";
        let shareable = self
            .device(device, call)?
            .pools
            .get(pool.raw())
            .map(|p| p.shareable);
        if shareable != Some(true) {
            return Err(invalid(call));
        }
        // SAFETY: creates an anonymous file; its inode names the pool.
        let fd = unsafe { libc::memfd_create(c"streampool-sim-pool".as_ptr(), 0) };
        let ino = inode(fd).ok_or_else(|| invalid(call))?;
        self.exported_pools.lock().insert(ino, (device, pool.raw()));
        Ok(fd)
    }

    fn pool_import_fd(&self, device: usize, fd: i32) -> Result<PoolHandle> {
        let call = "cuMemPoolImportFromShareableHandle";
        let exported = inode(fd).and_then(|ino| self.exported_pools.lock().get(&ino).copied());
        match exported {
            Some((d, pool)) if d == device => Ok(PoolHandle::from_raw(pool)),
            _ => Err(invalid(call)),
        }
    }

    fn pointer_export(&self, device: usize, ptr: DevicePtr) -> Result<IpcBytes> {
        let call = "cuMemPoolExportPointer";
        let d = self.device(device, call)?;
        let pool = d
            .pools
            .iter()
            .position(|p| p.shareable && p.live.contains_key(&ptr))
            .ok_or_else(|| invalid(call))?;
        let mut data = [0u8; 64];
        data[..8].copy_from_slice(&ptr.0.to_le_bytes());
        data[8..16].copy_from_slice(&(pool as u64).to_le_bytes());
        Ok(data)
    }

    fn pointer_import(
        &self,
        device: usize,
        pool: PoolHandle,
        data: &IpcBytes,
    ) -> Result<DevicePtr> {
        let call = "cuMemPoolImportPointer";
        let mut d = self.device(device, call)?;
        let (ptr, exported_pool) = (DevicePtr(word(data, 0)), word(data, 1) as usize);
        let live = d
            .pools
            .get(pool.raw())
            .is_some_and(|p| p.live.contains_key(&ptr));
        if exported_pool != pool.raw() || !live {
            return Err(invalid(call));
        }
        *d.imported.entry(ptr).or_default() += 1;
        Ok(ptr)
    }

    fn ipc_event_record(&self, device: usize, stream: Stream) -> Result<(EventHandle, IpcBytes)> {
        let event = self.event_create(device)?;
        if let Err(e) = self.event_record(device, event, stream) {
            self.event_destroy(device, event);
            return Err(e);
        }
        let mut handle = [0u8; 64];
        handle[..8].copy_from_slice(&(event.raw() as u64).to_le_bytes());
        Ok((event, handle))
    }

    fn ipc_event_wait(&self, device: usize, stream: Stream, handle: &IpcBytes) -> Result<()> {
        let call = "cuIpcOpenEventHandle";
        let event = word(handle, 0) as usize;
        if !self.device(device, call)?.events.contains_key(&event) {
            return Err(driver_error(call, 400, "CUDA_ERROR_INVALID_HANDLE"));
        }
        // The importer's stream waits for the exporter's work (one process here: the event is
        // the exporter's own).
        self.stream_wait_event(device, stream, EventHandle::from_raw(event))
    }
}

//! The importing side of sharing: pools and blocks this process imported from others, through
//! their pools or page by page (`page_imports`, a sibling module).
//!
//! Invariants: an imported pointer is known until closed, and a block imported twice is mapped
//! once and counted; closing the last import frees it and waits for the device before returning,
//! so the exporter may free the block once every importer has closed; only pools imported by
//! [`Imports::import_pool`] are used to import blocks.

use super::page_imports::PageImports;
use super::{StreampoolIpcHandle, StreampoolIpcPages};
use crate::driver::{DevicePtr, Driver, IpcBytes, PoolHandle, Stream};
use crate::error::{Error, Result};
use crate::resource::Accessible;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A pool imported from another process, as something peers can be given access to.
pub struct ImportedPool {
    driver: Arc<dyn Driver>,
    device: usize,
    handle: PoolHandle,
}

impl Accessible for ImportedPool {
    fn label(&self) -> &'static str {
        "imported pool"
    }

    fn grant_access(&self, peer: usize) -> Result<()> {
        self.driver
            .pool_grant_access(self.device, self.handle, peer)
    }
}

/// What this process imported from others.
#[derive(Default)]
pub struct Imports {
    pools: Mutex<Vec<(usize, PoolHandle)>>,
    /// Imported pointer -> (device, its export data, imports not yet closed). A block imported
    /// again is mapped once and counted: closing one import must not unmap the others.
    pointers: Mutex<HashMap<DevicePtr, (usize, IpcBytes, u32)>>,
    /// Blocks imported page by page.
    pages: PageImports,
}

impl Imports {
    /// Imports another process's pool from `fd` (which stays the caller's); returns the pool,
    /// and, if this process had not imported it before, it as something peers can access.
    pub fn import_pool(
        &self,
        driver: &Arc<dyn Driver>,
        device: usize,
        fd: i32,
    ) -> Result<(PoolHandle, Option<Arc<ImportedPool>>)> {
        let handle = driver.pool_import_fd(device, fd)?;
        let mut pools = self.pools.lock();
        if pools.contains(&(device, handle)) {
            return Ok((handle, None));
        }
        pools.push((device, handle));
        let pool = ImportedPool {
            driver: Arc::clone(driver),
            device,
            handle,
        };
        Ok((handle, Some(Arc::new(pool))))
    }

    /// Maps the block `handle` describes from the imported pool `pool_token`, and makes `stream`
    /// wait until the exporter's work on it at export time is done.
    pub fn import(
        &self,
        driver: &dyn Driver,
        pool_token: u64,
        handle: &StreampoolIpcHandle,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let device = usize::try_from(handle.device).unwrap_or(usize::MAX);
        let pool = PoolHandle::from_raw(pool_token as usize);
        if !self.pools.lock().contains(&(device, pool)) {
            return Err(Error::InvalidArgument(format!(
                "pool {pool_token:#x} was not imported on device {} by streampool_ipc_import_pool",
                handle.device
            )));
        }
        let mapped = self
            .pointers
            .lock()
            .iter()
            .find(|(_, (d, data, _))| *d == device && *data == handle.pointer_data)
            .map(|(ptr, _)| *ptr);
        let ptr = match mapped {
            Some(ptr) => ptr,
            None => driver.pointer_import(device, pool, &handle.pointer_data)?,
        };
        if let Err(e) = driver.ipc_event_wait(device, stream, &handle.event_handle) {
            if mapped.is_none() {
                let _ = driver.free_async(device, ptr, stream);
            }
            return Err(e);
        }
        let mut pointers = self.pointers.lock();
        let entry = pointers
            .entry(ptr)
            .or_insert((device, handle.pointer_data, 0));
        entry.2 += 1;
        Ok(ptr)
    }

    /// Maps a block another process exported page by page (its page descriptors `fds` stay the
    /// caller's), and makes `stream` wait until the exporter's work on it is done.
    pub fn import_pages(
        &self,
        driver: &dyn Driver,
        handle: &StreampoolIpcPages,
        fds: &[i32],
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.pages.import(driver, handle, fds, stream)
    }

    /// Releases an import: frees it on `stream` and waits for the device (work on other streams
    /// may still read the block), so the exporter may free the block as soon as this returns.
    pub fn close(&self, driver: &dyn Driver, ptr: DevicePtr, stream: Stream) -> Result<()> {
        if let Some(closed) = self.pages.close(driver, ptr, stream) {
            return closed;
        }
        let (device, data, last) = {
            let mut pointers = self.pointers.lock();
            let (device, data, count) = pointers.get_mut(&ptr).ok_or(Error::UnknownPointer {
                ptr: ptr.0,
                device: 0,
            })?;
            let out = (*device, *data, *count == 1);
            *count -= 1;
            if out.2 {
                pointers.remove(&ptr);
            }
            out
        };
        if !last {
            return Ok(()); // still mapped for the other imports; the last close waits
        }
        if let Err(e) = driver.free_async(device, ptr, stream) {
            // Still mapped: a later close may work.
            self.pointers.lock().insert(ptr, (device, data, 1));
            return Err(e);
        }
        driver.synchronize(device)
    }

    pub fn open_count(&self) -> usize {
        let pooled: usize = self
            .pointers
            .lock()
            .values()
            .map(|(_, _, n)| *n as usize)
            .sum();
        pooled + self.pages.open_count()
    }
}

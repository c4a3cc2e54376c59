//! Sharing allocations with other processes through shareable pools (`STREAMPOOL_IPC`,
//! `streampool.shareable()`), and the importing side's bookkeeping.
//!
//! Invariants: a block is exported only if it is live and came from a shareable pool; the
//! shareable scope is per thread (PyTorch allocates on the calling thread) and costs other
//! allocations one relaxed load while no thread is inside one; an imported pointer is known
//! until closed, and closing it frees the import and waits for the device before returning, so
//! the exporter may free the block once every importer has closed.

use crate::driver::{DevicePtr, Driver, IpcBytes, PoolHandle, Stream};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    static SHAREABLE_DEPTH: Cell<u32> = const { Cell::new(0) };
}
/// Threads inside a shareable scope, so that allocations elsewhere skip the thread-local.
static THREADS_IN_SCOPE: AtomicUsize = AtomicUsize::new(0);

/// Enters a shareable scope on this thread; returns the new depth.
pub fn begin_shareable() -> u32 {
    SHAREABLE_DEPTH.with(|d| {
        if d.get() == 0 {
            THREADS_IN_SCOPE.fetch_add(1, Ordering::Relaxed);
        }
        d.set(d.get() + 1);
        d.get()
    })
}

/// Leaves a shareable scope; an unmatched end is an error.
pub fn end_shareable() -> Result<u32> {
    SHAREABLE_DEPTH.with(|d| match d.get() {
        0 => Err(Error::InvalidArgument(
            "streampool_shareable_end without a matching streampool_shareable_begin".into(),
        )),
        depth => {
            d.set(depth - 1);
            if depth == 1 {
                THREADS_IN_SCOPE.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(depth - 1)
        }
    })
}

/// True if this thread's allocations must come from a shareable pool.
#[inline]
pub fn in_shareable_scope() -> bool {
    THREADS_IN_SCOPE.load(Ordering::Relaxed) != 0
        && SHAREABLE_DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Everything another process needs to map a shareable block (`streampool_ipc_export`). The
/// pool's file descriptor stays the exporter's; it travels by the receiving side's means
/// (SCM_RIGHTS, e.g. Python's multiprocessing), the rest as bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolIpcHandle {
    /// `CUmemPoolPtrExportData` of the block.
    pub pointer_data: [u8; 64],
    /// `CUipcEventHandle` of an event recorded on the exporter's stream at export: the data is
    /// ready once it has completed.
    pub event_handle: [u8; 64],
    /// The exporter's own event, released with `streampool_ipc_release_export`.
    pub event: u64,
    pub block_bytes: u64,
    /// The exporting pool's file descriptor, valid in the exporting process.
    pub pool_fd: i32,
    pub device: i32,
}

/// What this process imported from others.
#[derive(Default)]
pub struct Imports {
    pools: Mutex<Vec<(usize, PoolHandle)>>,
    /// Imported pointer -> (device, its export data, imports not yet closed). A block imported
    /// again is mapped once and counted: closing one import must not unmap the others.
    pointers: Mutex<HashMap<DevicePtr, (usize, IpcBytes, u32)>>,
}

impl Imports {
    /// Imports another process's pool from `fd` (which stays the caller's); returns the pool
    /// and whether this process had not imported it before.
    pub fn import_pool(
        &self,
        driver: &dyn Driver,
        device: usize,
        fd: i32,
    ) -> Result<(PoolHandle, bool)> {
        let pool = driver.pool_import_fd(device, fd)?;
        let mut pools = self.pools.lock();
        let new = !pools.contains(&(device, pool));
        if new {
            pools.push((device, pool));
        }
        Ok((pool, new))
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
        let pool = PoolHandle(pool_token as usize);
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

    /// Releases an import: frees it on `stream` and waits for the device (work on other streams
    /// may still read the block), so the exporter may free the block as soon as this returns.
    pub fn close(&self, driver: &dyn Driver, ptr: DevicePtr, stream: Stream) -> Result<()> {
        let (device, data, last) = {
            let mut pointers = self.pointers.lock();
            let (device, data, count) = pointers
                .get_mut(&ptr)
                .ok_or(Error::UnknownPointer { ptr, device: 0 })?;
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
        self.pointers
            .lock()
            .values()
            .map(|(_, _, n)| *n as usize)
            .sum()
    }
}

//! The importing side of sharing page by page (the vmm backend's blocks): another process's
//! physical pages, imported from their file descriptors and mapped contiguously at addresses of
//! this process's own; a descriptor followed by -1s is one handle backing that many pages (a
//! span of the exporter's), mapped whole.
//!
//! Invariants: an import is known (by the address it returned) until closed; a failed import
//! leaves nothing mapped, imported or reserved; a close waits for the device before it unmaps,
//! so no work of this process still reads the pages when the exporter may free the block, and
//! once it has waited the import is closed even if an unmap fails (logged).

use super::StreampoolIpcPages;
use crate::driver::{DevicePtr, Driver, MemHandle, Stream};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;

/// One imported block's mapping.
struct PageImport {
    device: usize,
    base: DevicePtr,
    page_bytes: u64,
    reserved_bytes: u64,
    /// Each imported handle with how many pages it backs, in address order.
    handles: Vec<(MemHandle, u64)>,
}

impl PageImport {
    /// Unmaps the first `mapped` handles' mappings, releases every handle and frees the
    /// addresses; the first error, after trying everything.
    fn undo(&self, driver: &dyn Driver, mapped: usize) -> Result<()> {
        let mut first = Ok(());
        let mut at = self.base;
        for &(_, pages) in &self.handles[..mapped] {
            let bytes = pages * self.page_bytes;
            first = first.and(driver.mem_unmap(self.device, at, bytes));
            at = at.offset(bytes);
        }
        for &(h, _) in &self.handles {
            first = first.and(driver.mem_release(self.device, h));
        }
        first.and(driver.address_free(self.device, self.base, self.reserved_bytes))
    }
}

/// `fds` cut into mappings: each descriptor with how many pages it backs (itself and the -1s
/// after it). None if the first is not a descriptor or one is negative but -1.
fn mappings(fds: &[i32]) -> Option<Vec<(i32, u64)>> {
    let mut out: Vec<(i32, u64)> = Vec::new();
    for &fd in fds {
        match (fd, out.last_mut()) {
            (-1, Some((_, pages))) => *pages += 1,
            (fd, _) if fd >= 0 => out.push((fd, 1)),
            _ => return None,
        }
    }
    Some(out)
}

/// The page imports of this process.
#[derive(Default)]
pub(super) struct PageImports {
    by_ptr: Mutex<HashMap<DevicePtr, PageImport>>,
}

fn invalid(why: String) -> Error {
    Error::InvalidArgument(format!("streampool_ipc_import_pages: {why}"))
}

impl PageImports {
    /// Maps the block `handle` describes from the page descriptors `fds` (which stay the
    /// caller's) and makes `stream` wait until the exporter's work on it at export is done.
    pub fn import(
        &self,
        driver: &dyn Driver,
        handle: &StreampoolIpcPages,
        fds: &[i32],
        stream: Stream,
    ) -> Result<DevicePtr> {
        let device = usize::try_from(handle.device)
            .ok()
            .filter(|&d| driver.device_count().is_ok_and(|n| d < n))
            .ok_or_else(|| invalid(format!("no device {}", handle.device)))?;
        let pages = u64::try_from(fds.len()).unwrap_or(u64::MAX);
        if pages == 0 || pages != handle.page_count {
            return Err(invalid(format!(
                "{} file descriptors for {} pages",
                fds.len(),
                handle.page_count
            )));
        }
        let units = mappings(fds).ok_or_else(|| {
            invalid(
                "file descriptors must be open ones, or -1 after one (pages of one handle)".into(),
            )
        })?;
        let reserved_bytes = handle
            .page_bytes
            .checked_mul(pages)
            .filter(|_| handle.page_bytes > 0)
            .filter(|&r| {
                (handle.offset_bytes.checked_add(handle.block_bytes)).is_some_and(|end| end <= r)
            })
            .ok_or_else(|| {
                invalid(format!(
                    "a block of {} B at {} B into {pages} pages of {} B does not fit",
                    handle.block_bytes, handle.offset_bytes, handle.page_bytes
                ))
            })?;
        let base = driver.address_reserve(device, reserved_bytes)?;
        let mut import = PageImport {
            device,
            base,
            page_bytes: handle.page_bytes,
            reserved_bytes,
            handles: Vec::with_capacity(units.len()),
        };
        let mut mapped = 0;
        let outcome = (|| {
            for &(fd, pages) in &units {
                import
                    .handles
                    .push((driver.mem_import_fd(device, fd)?, pages));
            }
            let mut at = base;
            for &(h, pages) in &import.handles {
                let bytes = pages * handle.page_bytes;
                driver.mem_map(device, at, bytes, h)?;
                at = at.offset(bytes);
                mapped += 1;
            }
            driver.mem_set_access(device, base, reserved_bytes, &[device])?;
            driver.ipc_event_wait(device, stream, &handle.event_handle)
        })();
        if let Err(e) = outcome {
            if let Err(undo) = import.undo(driver, mapped) {
                log::warn!("device {device}: undoing a failed page import: {undo}");
            }
            return Err(e);
        }
        let ptr = base.offset(handle.offset_bytes);
        self.by_ptr.lock().insert(ptr, import);
        Ok(ptr)
    }

    /// Releases the page import at `ptr`, if it is one: waits for the device (work of this
    /// process may still read the block), then unmaps and releases it. `None` if `ptr` is not
    /// a page import.
    pub fn close(&self, driver: &dyn Driver, ptr: DevicePtr, stream: Stream) -> Option<Result<()>> {
        let import = self.by_ptr.lock().remove(&ptr)?;
        let synced = driver
            .stream_synchronize(import.device, stream)
            .and_then(|()| driver.synchronize(import.device));
        if let Err(e) = synced {
            self.by_ptr.lock().insert(ptr, import);
            return Some(Err(e));
        }
        // Synchronised: no work of this process uses the pages. A mapping that cannot be undone
        // stays in this process (CUDA keeps the memory until it goes) but the import is closed,
        // so the exporter is released all the same.
        if let Err(e) = import.undo(driver, import.handles.len()) {
            log::warn!(
                "device {}: undoing a closed page import: {e}",
                import.device
            );
        }
        Some(Ok(()))
    }

    pub fn open_count(&self) -> usize {
        self.by_ptr.lock().len()
    }
}

//! The exporting side of sharing, per device: the file descriptor of the device's shareable pool
//! (a source of the device's table: created on first use, or the device's own pool with
//! `STREAMPOOL_IPC`), and the events of exports not yet released.
//!
//! Invariants: the file descriptor is exported once (a device has one shareable pool) and closed
//! when the exporter is dropped; only events this exporter recorded, and not yet released, are
//! destroyed on release. The caller (the device) decides whether a block may be exported.

use super::{StreampoolIpcHandle, StreampoolIpcPages};
use crate::driver::{DevicePtr, Driver, EventHandle, Stream};
use crate::error::{Error, Result};
use crate::fasthash::WordMap;
use crate::resource::{ExportMark, Resource};
use crate::sync::Mutex;
use std::sync::Arc;

pub struct Exporter {
    device: usize,
    driver: Arc<dyn Driver>,
    pool_fd: Mutex<Option<i32>>,
    /// Events of exports not yet released (only these may be destroyed), with the block of an
    /// export of pages and its mark (whose count its resource keeps: [`Exporter::release`]).
    events: Mutex<WordMap<u64, Option<(DevicePtr, ExportMark)>>>,
}

impl Exporter {
    pub fn new(device: usize, driver: Arc<dyn Driver>) -> Exporter {
        Exporter {
            device,
            driver,
            pool_fd: Mutex::new(None),
            events: Mutex::new(WordMap::default()),
        }
    }

    /// What another process needs to map the live shareable block at `ptr` (of `block_bytes`,
    /// from `pool`), with an event recorded on `stream` (the exporter's work so far); the event
    /// is released with [`Exporter::release`].
    pub fn export(
        &self,
        pool: &dyn Resource,
        ptr: DevicePtr,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<StreampoolIpcHandle> {
        let export = pool.capabilities().export.ok_or_else(|| {
            Error::Internal(format!(
                "the {} of device {} is not a CUDA pool",
                pool.traits().label,
                self.device
            ))
        })?;
        let pool_fd = {
            let mut fd = self.pool_fd.lock();
            match *fd {
                Some(fd) => fd,
                None => *fd.insert(
                    self.driver
                        .pool_export_fd(self.device, export.pool_handle())?,
                ),
            }
        };
        let pointer_data = self.driver.pointer_export(self.device, ptr)?;
        let (event, event_handle) = self.driver.ipc_event_record(self.device, stream)?;
        self.events.lock().insert(event.raw() as u64, None);
        Ok(StreampoolIpcHandle {
            pointer_data,
            event_handle,
            event: event.raw() as u64,
            block_bytes,
            pool_fd,
            device: self.device as i32,
        })
    }

    /// The handle and the page file descriptors (the caller's, at most `max_fds`) of the live
    /// block at `ptr` (of `block_bytes`) of a resource whose pages export, with an event recorded
    /// on `stream`; the block is marked exported only once all of it went through (on an error
    /// nothing is left open or marked).
    pub fn export_pages(
        &self,
        resource: &dyn Resource,
        ptr: DevicePtr,
        block_bytes: u64,
        stream: Stream,
        max_fds: usize,
    ) -> Result<(StreampoolIpcPages, Vec<i32>)> {
        let export = resource.capabilities().page_export.ok_or_else(|| {
            Error::Internal(format!(
                "the {} of device {} does not export pages",
                resource.traits().label,
                self.device
            ))
        })?;
        let pages = export.export_pages(ptr, block_bytes)?;
        let close_all = |fds: &[i32]| {
            for &fd in fds.iter().filter(|&&fd| fd >= 0) {
                // SAFETY: descriptors just made for this export, seen by nobody else.
                unsafe { libc::close(fd) };
            }
        };
        if pages.fds.len() > max_fds {
            close_all(&pages.fds);
            return Err(Error::InvalidArgument(format!(
                "the block {ptr:#x} lies on {} pages: fds needs room for {} descriptors, not \
                 {max_fds}",
                pages.fds.len(),
                pages.fds.len()
            )));
        }
        let (event, event_handle) = match self.driver.ipc_event_record(self.device, stream) {
            Ok(recorded) => recorded,
            Err(e) => {
                close_all(&pages.fds);
                return Err(e);
            }
        };
        let mark = match export.mark_exported(ptr, block_bytes, &pages) {
            Ok(mark) => mark,
            Err(e) => {
                close_all(&pages.fds);
                self.driver.event_destroy(self.device, event);
                return Err(e);
            }
        };
        self.events
            .lock()
            .insert(event.raw() as u64, Some((ptr, mark)));
        let handle = StreampoolIpcPages {
            event_handle,
            event: event.raw() as u64,
            block_bytes,
            offset_bytes: pages.offset_bytes,
            page_bytes: pages.page_bytes,
            page_count: pages.fds.len() as u64,
            device: self.device as i32,
        };
        Ok((handle, pages.fds))
    }

    /// Releases the event of an export once every importer has closed it; an event this device
    /// did not export (or released already) is an error, never destroyed. The block of an export
    /// of pages and its mark, whose resource counts it until now.
    pub fn release(&self, event: u64) -> Result<Option<(DevicePtr, ExportMark)>> {
        let Some(block) = self.events.lock().remove(&event) else {
            return Err(Error::InvalidArgument(format!(
                "{event:#x} is not the event of an unreleased export on device {}",
                self.device
            )));
        };
        let event = EventHandle::from_raw(event as usize);
        self.driver.event_destroy(self.device, event);
        Ok(block)
    }
}

impl Drop for Exporter {
    /// Closes the exported pool's file descriptor (an allocator lives as long as its process;
    /// tests and the fuzzer make many).
    fn drop(&mut self) {
        if let Some(fd) = *self.pool_fd.lock() {
            // SAFETY: the descriptor was returned by pool_export_fd and is closed only here.
            unsafe { libc::close(fd) };
        }
    }
}

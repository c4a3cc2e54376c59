//! Sharing a live block with another process, page by page: the file descriptors of the
//! physical pages under it (every page is created exportable where the device can). A span
//! ([`super::spans`]) under the block is exported whole — one descriptor, then -1 for each of its
//! other pages — so the importer maps all of it, its pages outside the block included.
//!
//! Invariants: only a live block's pages are exported (and the rest of the spans they lie in,
//! which the importer maps too, as expandable segments export whole segments), and the block's
//! pages stay its own while it is live (a page under a live block is never idle, so never moved
//! or released); the descriptors are made outside the resource's lock, so an export never holds
//! up a free; on a failure no descriptor is left open; a block's export is counted once it went
//! through ([`PageExport::mark_exported`], under the lock, refused if the resource slept since
//! the pages were read or the block was freed since: the mark read with the pages names it)
//! until it is released or the block freed (an importer keeps its pages, so the resource refuses
//! to sleep meanwhile: [`super::sleep`]); a failed export counts nothing.

use super::{VmmResource, VmmState};
use crate::driver::{DevicePtr, MemHandle};
use crate::error::{Error, Result};
use crate::resource::{ExportMark, ExportedPages, PageExport};

impl PageExport for VmmResource {
    fn export_pages(&self, ptr: DevicePtr, bytes: u64) -> Result<ExportedPages> {
        let (mappings, offset_bytes, sleeps_at, mark) = self.mappings_under(ptr, bytes)?;
        let mut fds = Vec::with_capacity(mappings.len());
        for (handle, pages) in mappings {
            match self.driver.mem_export_fd(self.device, handle) {
                Ok(fd) => {
                    fds.push(fd);
                    fds.extend((1..pages).map(|_| -1));
                }
                Err(e) => {
                    for fd in fds.into_iter().filter(|&fd| fd >= 0) {
                        // SAFETY: descriptors this call made and nobody else has seen.
                        unsafe { libc::close(fd) };
                    }
                    return Err(e);
                }
            }
        }
        Ok(ExportedPages {
            fds,
            page_bytes: self.page_bytes,
            offset_bytes,
            sleeps_at,
            mark,
        })
    }

    fn mark_exported(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        pages: &ExportedPages,
    ) -> Result<ExportMark> {
        let mut st = self.lock_enabled()?;
        self.check_shareable_now(&st, ptr, bytes)?;
        if st.sleeps != pages.sleeps_at {
            return Err(Error::InvalidArgument(format!(
                "device {}: the block {ptr:#x} slept while it was being shared (its pages are \
                 others now); share it again",
                self.device
            )));
        }
        if !st.live.mark_exported(ptr.0, pages.mark) {
            return Err(Error::InvalidArgument(format!(
                "device {}: the block {ptr:#x} was freed while it was being shared (another \
                 block lies there now); share that one again",
                self.device
            )));
        }
        Ok(pages.mark)
    }

    fn unmark_exported(&self, ptr: DevicePtr, mark: ExportMark) {
        self.state.lock().live.unmark_exported(ptr.0, mark);
    }
}

impl VmmResource {
    /// An error unless `[ptr, ptr + bytes)` is a live block and the resource is awake.
    fn check_shareable_now(&self, st: &VmmState, ptr: DevicePtr, bytes: u64) -> Result<()> {
        if st.asleep.is_some() {
            return Err(super::sleep::asleep_sharing_error(self.device));
        }
        match st.live.contains(ptr.0, bytes) {
            true => Ok(()),
            false => Err(Error::UnknownPointer {
                ptr: ptr.0,
                device: self.device,
            }),
        }
    }

    /// The mappings under the live block `[ptr, ptr + bytes)`, in address order, each a handle
    /// and its pages, with where the block starts in the first, and the count of sleeps then.
    #[allow(clippy::type_complexity)]
    fn mappings_under(
        &self,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(Vec<(MemHandle, u64)>, u64, u64, ExportMark)> {
        if !self.exportable {
            return Err(Error::InvalidArgument(format!(
                "device {}'s memory cannot be shared with other processes: it has no POSIX file \
                 descriptor handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)",
                self.device
            )));
        }
        let mut st = self.lock_enabled()?;
        self.check_shareable_now(&st, ptr, bytes)?;
        let first = st.pages.range(..=ptr.0).next_back().map(|(_, p)| p.mapping);
        let first = first
            .filter(|m| m.first + m.pages * self.page_bytes > ptr.0)
            .ok_or_else(|| {
                Error::Internal(format!("the live block {ptr:#x} has no page under it"))
            })?
            .first;
        let end = ptr.0 + bytes;
        let mut mappings = Vec::new();
        let mut next = first;
        for (&page, p) in st.pages.range(first..end) {
            if page != next {
                return Err(Error::Internal(format!(
                    "the live block {ptr:#x} has no page at {next:#x}"
                )));
            }
            if p.mapping.first == page {
                mappings.push((p.handle, p.mapping.pages));
            }
            next = page + self.page_bytes;
        }
        if next < end {
            return Err(Error::Internal(format!(
                "the live block {ptr:#x} has no page at {next:#x}"
            )));
        }
        let mark = st.live.export_mark(ptr.0);
        Ok((mappings, ptr.0 - first, st.sleeps, mark))
    }
}

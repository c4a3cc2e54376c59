//! Mapping and unmapping pages of the virtual-memory resource: backing a window with handles
//! (taken out of idle pages first), giving access, and releasing idle pages.
//!
//! Invariants: a page is mapped and given access (device and peers) before any of it is handed
//! out, and on failure nothing half done stays usable — every page of a window is unmapped again
//! and its handle kept as a spare, or, if even that fails, blocked until access can be set or it
//! can be unmapped; only idle pages (in `Ready` ranges) are unmapped; nothing is unmapped during
//! a capture.

use super::ranges::{State, Window};
use super::{VmmResource, VmmState};
use crate::driver::{DevicePtr, MemHandle};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::history::StreampoolEventKind as Event;

impl VmmResource {
    /// Backs the window's unmapped pages: handles of idle pages elsewhere first, then spare
    /// handles, then fresh ones; then gives the device and its peers access. On failure every
    /// page of the window is left unmapped and every handle taken is kept as a spare.
    pub(super) fn map_window(&self, st: &mut VmmState, window: &Window, bytes: u64) -> Result<()> {
        let mut idle = st
            .free
            .idle_pages(window.start, window.start + bytes)
            .into_iter();
        let mut mapped: Vec<u64> = Vec::with_capacity(window.pages.len());
        let outcome = (|| {
            for &page in &window.pages {
                let handle = self.take_handle(st, &mut idle)?;
                if let Err(e) =
                    self.driver
                        .mem_map(self.device, DevicePtr(page), self.page_bytes, handle)
                {
                    st.spare_handles.push(handle);
                    return Err(e);
                }
                st.pages.insert(page, handle);
                mapped.push(page);
            }
            self.set_access(&mapped, &self.access_list(st))
        })();
        match outcome {
            Ok(()) => {
                for &page in &mapped {
                    st.free.mark_mapped(page);
                    self.count(Event::Map, page, st);
                }
                Ok(())
            }
            Err(e) => {
                for page in mapped {
                    let handle = st.pages.remove(&page).expect("mapped above");
                    match self
                        .driver
                        .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
                    {
                        Ok(()) => st.spare_handles.push(handle),
                        // Mapped, maybe without access: no one may use it until that is fixed.
                        Err(_) => {
                            st.pages.insert(page, handle);
                            st.free.retag(page, State::Unmapped, State::Blocked);
                            st.blocked = true;
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// Blocked pages get access, or are unmapped (their handles kept as spares); a page for which
    /// both fail stays blocked for the next try.
    pub(super) fn unblock(&self, st: &mut VmmState) {
        for page in st.free.blocked_pages() {
            let access = self.set_access(&[page], &self.access_list(st));
            if access.is_ok() {
                st.free.retag(page, State::Blocked, State::Ready);
                self.count(Event::Map, page, st);
            } else if self
                .driver
                .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
                .is_ok()
            {
                let handle = st.pages.remove(&page).expect("a blocked page is mapped");
                st.spare_handles.push(handle);
                st.free.retag(page, State::Blocked, State::Unmapped);
            }
        }
    }

    /// A handle for a page: out of an idle page (unmapped now), a spare, or a new one.
    fn take_handle(
        &self,
        st: &mut VmmState,
        idle: &mut impl Iterator<Item = u64>,
    ) -> Result<MemHandle> {
        for page in idle.by_ref() {
            if self
                .driver
                .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
                .is_ok()
            {
                let handle = st.pages.remove(&page).expect("an idle page is mapped");
                st.free.mark_unmapped(page);
                self.count(Event::Unmap, page, st);
                return Ok(handle);
            }
        }
        if let Some(handle) = st.spare_handles.pop() {
            return Ok(handle);
        }
        if st.physical_bytes(self.page_bytes) + self.page_bytes > self.max_physical_bytes {
            return Err(Error::Driver {
                call: "cuMemCreate",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY (STREAMPOOL_MAX_POOL_SIZE reached)".into(),
            });
        }
        let handle = self.driver.mem_create(self.device, self.page_bytes)?;
        st.physical_high_bytes = st
            .physical_high_bytes
            .max(st.physical_bytes(self.page_bytes) + self.page_bytes);
        Ok(handle)
    }

    /// The device and every granted peer.
    fn access_list(&self, st: &VmmState) -> Vec<usize> {
        std::iter::once(self.device)
            .chain(st.peers.iter().copied())
            .collect()
    }

    /// Gives `devices` access to `pages`, one call per run of contiguous pages.
    pub(super) fn set_access(&self, pages: &[u64], devices: &[usize]) -> Result<()> {
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + self.page_bytes {
                j += 1;
            }
            let bytes = (j - i) as u64 * self.page_bytes;
            self.driver
                .mem_set_access(self.device, DevicePtr(pages[i]), bytes, devices)?;
            i = j;
        }
        Ok(())
    }

    /// Unmaps and releases spare handles and idle pages until at most `keep_bytes` of physical
    /// memory is held. Never during a capture; a page the driver refuses stays.
    pub(super) fn release_down_to(&self, st: &mut VmmState, keep_bytes: u64) {
        if self.capturing(st) {
            return;
        }
        // Each spare is tried once; one the driver refuses stays a spare (and counted).
        let mut refused = Vec::new();
        while st.physical_bytes(self.page_bytes) > keep_bytes {
            let Some(handle) = st.spare_handles.pop() else {
                break;
            };
            if let Err(e) = self.driver.mem_release(self.device, handle) {
                log::warn!("device {}: releasing a spare page: {e}", self.device);
                refused.push(handle);
            }
        }
        st.spare_handles.append(&mut refused);
        if st.physical_bytes(self.page_bytes) <= keep_bytes {
            return;
        }
        let mut idle = st.free.idle_pages(0, 0);
        idle.sort_unstable_by(|a, b| b.cmp(a)); // from the top of the address space down
        for page in idle {
            if st.physical_bytes(self.page_bytes) <= keep_bytes {
                break;
            }
            if let Err(e) = self
                .driver
                .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
            {
                log::warn!("device {}: unmapping an idle page: {e}", self.device);
                continue;
            }
            let handle = st.pages.remove(&page).expect("an idle page is mapped");
            st.free.mark_unmapped(page);
            self.count(Event::Unmap, page, st);
            if let Err(e) = self.driver.mem_release(self.device, handle) {
                log::warn!("device {}: releasing a page: {e}", self.device);
                st.spare_handles.push(handle);
            }
        }
    }
}

//! Sleep and wake: every physical page goes back to the device while the addresses stay
//! reserved, and fresh pages are mapped at the same addresses later, so tensors, CUDA graphs and
//! compiled code that hold those addresses keep working. At level 1 the pages under live blocks
//! are copied to one page-locked host buffer first and copied back at wake — but for blocks
//! allocated under a tag the caller discards ([`crate::tag`]); at level 2 their contents are
//! discarded.
//!
//! Invariants: a sleep happens only after the device synchronised (no work in flight, so nothing
//! half-written is copied) and never during a capture; it changes nothing unless the host buffer
//! was allocated and every copy succeeded; while asleep nothing is allocated (a request is
//! refused, saying to wake the device), nothing is released (there is nothing mapped to
//! release), frees are booked as usual; a wake maps each page before it copies it back and keeps
//! every page it restored — out of memory part way leaves the rest asleep for a later wake; a
//! page under a kept block is saved even if a discarded block shares it.

use super::{Page, Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, HostBuffer};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::Sleep;
use crate::tag::TagId;
use std::collections::BTreeSet;

/// A page given back by a sleep.
#[derive(Debug, Clone, Copy)]
struct SleptPage {
    page: u64,
    region: Region,
    /// Where its contents wait in the host buffer (level 1, a page under a live block).
    saved_at: Option<u64>,
}

/// The state of a sleeping resource.
#[derive(Debug)]
pub(super) struct Asleep {
    /// Pages still to map again, in address order.
    pages: Vec<SleptPage>,
    buffer: Option<HostBuffer>,
}

impl Asleep {
    /// The host buffer holding the saved contents, if any.
    pub(super) fn buffer(&self) -> Option<HostBuffer> {
        self.buffer
    }
}

/// The error of a request made while asleep.
pub(super) fn asleep_error(device: usize) -> Error {
    Error::InvalidArgument(format!(
        "device {device} is asleep (streampool.sleep()): call streampool.wake() before \
         allocating on it"
    ))
}

impl Sleep for VmmResource {
    fn sleep(&self, level: u32, discard: &[TagId]) -> Result<u64> {
        if !matches!(level, 1 | 2) {
            return Err(Error::InvalidArgument(format!(
                "sleep level {level}: 1 keeps the contents in host memory, 2 discards them"
            )));
        }
        let mut st = self.lock_enabled()?;
        if st.asleep.is_some() {
            return Err(Error::InvalidArgument(format!(
                "device {} is asleep already: wake it first",
                self.device
            )));
        }
        if self.capturing(&mut st) {
            return Err(Error::InvalidArgument(format!(
                "device {} cannot sleep while a stream of it captures a CUDA graph",
                self.device
            )));
        }
        self.return_slot(&mut st);
        // The device synchronised: every fence is done once recorded or settled.
        let (driver, device) = (self.driver.as_ref(), self.device);
        if st.fences.record_all_pending(driver, device) {
            drop(st);
            driver.synchronize(device)?;
            st = self.lock_enabled()?;
        }
        self.update_ranges(&mut st, super::Caller::Program);
        self.unmap_retired(&mut st);
        if !st.retiring.is_empty() {
            return Err(Error::Internal(format!(
                "device {device}: moved pages could not be unmapped; try again"
            )));
        }
        let saved = match level {
            1 => self.pages_under_kept_blocks(&st, discard),
            _ => BTreeSet::new(),
        };
        let buffer = self.save(&st, &saved)?;
        let given_back = st.physical_bytes(self.page_bytes);
        let pages = self.give_back_all(&mut st, &saved);
        st.asleep = Some(Asleep { pages, buffer });
        log::info!(
            "device {device}: asleep at level {level}, {given_back} B given back, {} B kept in \
             host memory",
            saved.len() as u64 * self.page_bytes
        );
        Ok(given_back)
    }

    fn wake(&self) -> Result<u64> {
        let mut st = self.lock_enabled()?;
        let Some(mut asleep) = st.asleep.take() else {
            return Err(Error::InvalidArgument(format!(
                "device {} is not asleep: nothing to wake",
                self.device
            )));
        };
        // In address order; the pages restored leave the list at once at the end (not one by
        // one from its front, which would be quadratic in the pages of a full device).
        let mut done = 0;
        let result = loop {
            let Some(&slept) = asleep.pages.get(done) else {
                break Ok(());
            };
            if let Err(e) = self.restore(&mut st, slept, asleep.buffer) {
                break Err(e);
            }
            done += 1;
        };
        asleep.pages.drain(..done);
        let restored = done as u64 * self.page_bytes;
        if let Err(e) = result {
            st.asleep = Some(asleep);
            return Err(e);
        }
        if let Some(buffer) = asleep.buffer {
            self.driver.host_free(self.device, buffer);
        }
        Ok(restored)
    }

    fn sleeping_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.asleep
            .as_ref()
            .map_or(0, |a| a.pages.len() as u64 * self.page_bytes)
    }

    fn saved_bytes(&self) -> u64 {
        let st = self.state.lock();
        let asleep = st.asleep.as_ref().map_or(&[][..], |a| &a.pages[..]);
        let saved = asleep.iter().filter(|p| p.saved_at.is_some()).count();
        saved as u64 * self.page_bytes
    }
}

impl VmmResource {
    /// The mapped pages any live block lies on, but for blocks allocated under a tag in
    /// `discard`.
    fn pages_under_kept_blocks(&self, st: &VmmState, discard: &[TagId]) -> BTreeSet<u64> {
        let mut pages = BTreeSet::new();
        let kept = st.live.blocks().filter(|&(start, _)| {
            discard.is_empty() || st.live.tag(start).is_none_or(|t| !discard.contains(&t))
        });
        for (start, bytes) in kept {
            let end = start + bytes;
            let first = st.pages.range(..=start).next_back().map(|(&p, _)| p);
            let from = first
                .filter(|&p| p + self.page_bytes > start)
                .unwrap_or(start);
            pages.extend(st.pages.range(from..end).map(|(&p, _)| p));
        }
        pages
    }

    /// Copies the `saved` pages into a new page-locked host buffer, in address order; `None` if
    /// there are none. On a failure the buffer is freed and nothing else changed.
    fn save(&self, st: &VmmState, saved: &BTreeSet<u64>) -> Result<Option<HostBuffer>> {
        if saved.is_empty() {
            return Ok(None);
        }
        let bytes = (saved.len() as u64)
            .checked_mul(self.page_bytes)
            .ok_or_else(|| Error::Internal("the pages to save overflow".into()))?;
        let buffer = self.driver.host_alloc(self.device, bytes).map_err(|e| {
            Error::InvalidArgument(format!(
                "device {} cannot sleep at level 1: {bytes} B of page-locked host memory for \
                 its contents could not be allocated ({e}); nothing changed",
                self.device
            ))
        })?;
        for (i, &page) in saved.iter().enumerate() {
            let at = i as u64 * self.page_bytes;
            if let Err(e) =
                self.driver
                    .copy_to_host(self.device, buffer, at, DevicePtr(page), self.page_bytes)
            {
                self.driver.host_free(self.device, buffer);
                return Err(e);
            }
        }
        debug_assert!(st.pages.keys().filter(|p| saved.contains(p)).count() == saved.len());
        Ok(Some(buffer))
    }

    /// Unmaps and releases every page and spare; the pages slept, with where their contents
    /// wait. A page that cannot be unmapped stays mapped (and awake); a handle that cannot be
    /// released stays a spare.
    fn give_back_all(&self, st: &mut VmmState, saved: &BTreeSet<u64>) -> Vec<SleptPage> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        for handle in std::mem::take(&mut st.spare_handles) {
            if driver.mem_release(device, handle).is_err() {
                st.spare_handles.push(handle);
            } else {
                st.counts.releases += 1;
            }
        }
        let mut slept = Vec::with_capacity(st.pages.len());
        let pages: Vec<u64> = st.pages.keys().copied().collect();
        // Pages in address order, as `saved` is: a saved page's contents are at its place among
        // the saved pages, counted as they go by (once each, not searched for each page).
        let mut saved_before = 0u64;
        for page in pages {
            let saved_at = saved.contains(&page).then(|| {
                saved_before += 1;
                (saved_before - 1) * self.page_bytes
            });
            if let Err(e) = driver.mem_unmap(device, DevicePtr(page), self.page_bytes) {
                log::warn!("device {device}: a page stays awake, it could not be unmapped: {e}");
                continue;
            }
            let Page { handle, region, .. } = st.pages.remove(&page).expect("listed above");
            self.count(Event::Unmap, page, st);
            match driver.mem_release(device, handle) {
                Ok(()) => st.counts.releases += 1,
                Err(_) => st.spare_handles.push(handle),
            }
            slept.push(SleptPage {
                page,
                region,
                saved_at,
            });
        }
        slept
    }

    /// Maps a fresh page where `slept` was, gives access, and copies its contents back.
    fn restore(
        &self,
        st: &mut VmmState,
        slept: SleptPage,
        buffer: Option<HostBuffer>,
    ) -> Result<()> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let handle = match st.spare_handles.pop() {
            Some(handle) => handle,
            None if self.exportable => driver.mem_create_exportable(device, self.page_bytes)?,
            None => driver.mem_create(device, self.page_bytes)?,
        };
        let at = DevicePtr(slept.page);
        if let Err(e) = driver.mem_map(device, at, self.page_bytes, handle) {
            st.spare_handles.push(handle);
            return Err(e);
        }
        let devices = self.access_list(st);
        if let Err(e) = self.set_access(st, &[slept.page], &devices) {
            if driver.mem_unmap(device, at, self.page_bytes).is_ok() {
                st.spare_handles.push(handle);
                return Err(e);
            }
            // Mapped without access and it cannot be unmapped (two driver failures): the page is
            // taken as restored, its contents not copied; using it fails on the GPU.
            log::error!(
                "device {device}: page {:#x} could not be given access nor unmapped at wake: {e}",
                slept.page
            );
        }
        let now_ms = driver.now_ms();
        let page = Page {
            handle,
            region: slept.region,
            last_used_ms: now_ms,
        };
        st.pages.insert(slept.page, page);
        self.count(Event::Map, slept.page, st);
        st.physical_high_bytes = st
            .physical_high_bytes
            .max(st.physical_bytes(self.page_bytes));
        if let (Some(from), Some(buffer)) = (slept.saved_at, buffer) {
            if let Err(e) = driver.copy_to_device(device, at, buffer, from, self.page_bytes) {
                // Not restored: the page sleeps on (its contents still in the buffer).
                st.pages.remove(&slept.page);
                if driver.mem_unmap(device, at, self.page_bytes).is_ok() {
                    st.spare_handles.push(handle);
                    self.count(Event::Unmap, slept.page, st);
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

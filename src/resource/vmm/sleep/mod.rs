//! Sleep and wake: every physical page goes back to the device while the addresses stay
//! reserved, and fresh pages are mapped at the same addresses under every live block later, so
//! tensors, CUDA graphs and compiled code that hold those addresses keep working; pages no live
//! block lies on go back as `empty_cache()` gives them back (mapped again when an allocation
//! needs them), so only the pages under live blocks sleep (with the rest of a span one lies on:
//! [`super::spans`]). At level 1 the pages under live blocks are copied to one page-locked host
//! buffer first and copied back at wake ([`wake`]) — but for blocks allocated under a tag the
//! caller discards ([`crate::tag`]); at level 2 their contents are discarded. The copies are
//! queued on the legacy default stream (so that they also wait for work any thread queued on a
//! blocking stream since the device synchronised) and run while the driver unmaps the idle pages
//! and the pages already copied (sleep, [`save`]) or maps the next pages (wake): on an H200 a
//! 2 MiB page costs about as long to unmap and release (44 us) or to map with access (54 us) as
//! to copy (38 us). Pages adjacent in one address reservation are saved with one copy; wake
//! restores them a chunk of pages at a time, one handle a chunk where it can ([`wake`]: the next
//! sleep then gives each chunk back in one unmap and one release). The host buffer is kept after
//! a wake for the next sleep (page-locking gigabytes takes longer than copying them) until
//! [`Sleep::release_host_buffer`], a larger sleep, or the resource's end.
//!
//! Invariants: a sleep happens only after the device synchronised (no work in flight, so nothing
//! half-written is copied), never during a capture, and never while an export of a live block's
//! pages is not released (an importer keeps them: [`super::export`]); a page under a live block is unmapped
//! only once its copy has completed; a sleep that fails leaves no copy in flight, keeps a host
//! buffer it had, and gives back the idle pages as `empty_cache()` gives them back; one that
//! fails before its first page under a live block went back changes nothing else, and one that
//! fails part way (a wait for its copies) maps what it gave back again — with the saved contents,
//! the discarded tags' blocks among it without theirs, as the sleep would have left them — or,
//! where even that fails, leaves it asleep, the device with it, and says so; while asleep nothing
//! is allocated (a request is refused, saying to wake the device), nothing is released (there is
//! nothing mapped to release), frees are booked as usual; a wake maps each page before it copies
//! it back, returns once every copy has completed, and keeps every page it restored — out of
//! memory part way leaves the rest asleep for a later wake; a page under a kept block is saved
//! even if a discarded block shares it.

mod save;
mod wake;

use super::spans::GiveBack;
use super::{Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, HostBuffer};
use crate::error::{Error, Result};
use crate::resource::Sleep;
use crate::tag::TagId;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// A page given back by a sleep.
#[derive(Debug, Clone, Copy)]
struct SleptPage {
    page: u64,
    region: Region,
    /// Where its contents wait in the host buffer (level 1, a page under a live block).
    saved_at: Option<u64>,
}

/// Page-locked host memory and its size.
#[derive(Debug, Clone, Copy)]
pub(super) struct HostBytes {
    pub(super) buffer: HostBuffer,
    pub(super) bytes: u64,
}

/// The state of a sleeping resource.
#[derive(Debug)]
pub(super) struct Asleep {
    /// Pages still to map again, in address order.
    pages: Vec<SleptPage>,
    /// Where the saved contents wait, if any were saved.
    host: Option<HostBytes>,
}

impl Asleep {
    /// The host buffer holding the saved contents, if any.
    pub(super) fn host(&self) -> Option<HostBytes> {
        self.host
    }
}

/// The error of a share (an export of pages) asked while asleep.
pub(super) fn asleep_sharing_error(device: usize) -> Error {
    Error::InvalidArgument(format!(
        "device {device} is asleep (streampool.sleep()): its memory was given back; call \
         streampool.wake() before sharing a tensor of it"
    ))
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
        self.check_can_sleep(&mut st, &[])?;
        self.return_kept(&mut st);
        // The device synchronised: every fence is done once recorded or settled.
        let (driver, device) = (self.driver.as_ref(), self.device);
        if st.fences.record_all_pending(driver, device) {
            drop(st);
            driver.synchronize(device)?;
            st = self.lock_enabled()?;
            // Another thread may have slept, or begun a capture, or freed a block (kept in the
            // slot), while the lock was free.
            self.check_can_sleep(&mut st, &[])?;
            self.return_kept(&mut st);
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
        let (host, batches) = match self.save(&mut st, &saved)? {
            Some(saving) => (Some(saving.host), saving.batches),
            None => (None, Vec::new()),
        };
        let given_back = st.physical_bytes(self.page_bytes);
        // While the copies run, pages no live block lies on go back as empty_cache() gives them
        // back: only the pages under live blocks sleep, and wake maps only those (on an H200 a
        // page costs 8.8 us to create, 5.7 to map and 26 to give access at wake; the others are
        // mapped when an allocation needs them). Then the pages under live blocks, as their
        // copies complete ([`save`]).
        self.release_down_to(&mut st, 0, None);
        // From here the pages under live blocks change (even a sleep undone maps fresh ones).
        st.sleeps += 1;
        let (pages, waited) = self.give_back_as_copied(&mut st, &saved, batches);
        if let Err(e) = waited {
            return Err(match host {
                Some(host) => self.undo_sleep(&mut st, pages, host, e),
                None => e,
            });
        }
        // Memory went back as at a trim: what the program maps again after the wake comes in
        // spans ([`super::spans`]), so that the next sleep gives it back in a few handles, not
        // one a page (each costs the driver about 44 us).
        self.note_given_back(&mut st, given_back, GiveBack::Sleep);
        st.asleep = Some(Asleep { pages, host });
        self.asleep_now.store(true, Ordering::Release);
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
        if let Err(e) = self.give_access_left(&mut st) {
            st.asleep = Some(asleep);
            return Err(e);
        }
        self.forget_freed_while_asleep(&mut st, &mut asleep.pages);
        // Spans the driver would not release at the sleep hold memory the wake needs: tried again.
        self.release_spare_spans(&mut st);
        let (restored, result) = self.restore(&mut st, &asleep.pages, asleep.host);
        // The pages restored leave the list at once (not one by one, which would be quadratic in
        // the pages of a full device).
        asleep.pages.retain(|p| !restored.contains(&p.page));
        let restored_bytes = restored.len() as u64 * self.page_bytes;
        if let Err(e) = result {
            st.asleep = Some(asleep);
            return Err(e);
        }
        self.asleep_now.store(false, Ordering::Release);
        // Kept for the next sleep: a kept buffer is never both here and in a sleep.
        if let Some(host) = asleep.host {
            debug_assert!(st.sleep_buffer.is_none());
            st.sleep_buffer = Some(host);
        }
        Ok(restored_bytes)
    }

    fn may_sleep_now(&self, freed: &[DevicePtr]) -> Result<()> {
        let mut st = self.lock_enabled()?;
        self.check_can_sleep(&mut st, freed)
    }

    fn asleep(&self) -> Result<bool> {
        Ok(self.lock_enabled()?.asleep.is_some())
    }

    fn asleep_error(&self) -> Option<Error> {
        // Without the lock, which a sleep or a wake holds through its copies.
        let asleep = self.asleep_now.load(Ordering::Acquire);
        asleep.then(|| asleep_error(self.device))
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

    fn host_buffer_bytes(&self) -> u64 {
        let st = self.state.lock();
        let asleep = st.asleep.as_ref().and_then(|a| a.host);
        asleep.or(st.sleep_buffer).map_or(0, |h| h.bytes)
    }

    fn release_host_buffer(&self) -> Result<u64> {
        let mut st = self.lock_enabled()?;
        let Some(kept) = st.sleep_buffer.take() else {
            if st.asleep.as_ref().is_some_and(|a| a.host.is_some()) {
                return Err(Error::InvalidArgument(format!(
                    "device {} is asleep: its host buffer holds what the sleep saved; wake it \
                     first",
                    self.device
                )));
            }
            return Ok(0);
        };
        self.driver.host_free(self.device, kept.buffer);
        Ok(kept.bytes)
    }

    fn reserve_host_buffer(&self, bytes: u64) -> Result<u64> {
        let wanted_bytes = {
            let st = self.lock_enabled()?;
            self.check_awake_to_reserve(&st)?;
            let wanted_bytes = match bytes {
                0 => (self.pages_under_kept_blocks(&st, &[]).len() as u64)
                    .checked_mul(self.page_bytes)
                    .ok_or_else(|| Error::Internal("the pages to save overflow".into()))?,
                bytes => bytes,
            };
            let kept_bytes = st.sleep_buffer.map_or(0, |h| h.bytes);
            if wanted_bytes == 0 || kept_bytes >= wanted_bytes {
                return Ok(kept_bytes);
            }
            wanted_bytes
        };
        // Pinned with the lock free: gigabytes take a while, and allocations go on meanwhile.
        let buffer = (self.driver.host_alloc(self.device, wanted_bytes)).map_err(|e| {
            Error::InvalidArgument(format!(
                "device {}: {wanted_bytes} B of page-locked host memory for the next sleep could \
                 not be allocated ({e}); a buffer kept before stays",
                self.device
            ))
        })?;
        let fresh = HostBytes {
            buffer,
            bytes: wanted_bytes,
        };
        let (kept_bytes, unused) = match self.lock_enabled() {
            Ok(mut st) => self.keep_reserved(&mut st, fresh),
            Err(e) => (Err(e), Some(fresh)),
        };
        // Freed with the lock free, as it was pinned.
        if let Some(unused) = unused {
            self.driver.host_free(self.device, unused.buffer);
        }
        kept_bytes
    }
}

impl VmmResource {
    /// An error if the resource cannot sleep now: asleep already, a capture under way, or a live
    /// block exported to other processes (but those starting at `freed`, freed by the program).
    fn check_can_sleep(&self, st: &mut VmmState, freed: &[DevicePtr]) -> Result<()> {
        if st.asleep.is_some() {
            return Err(Error::InvalidArgument(format!(
                "device {} is asleep already: wake it first",
                self.device
            )));
        }
        if self.capturing(st) {
            return Err(Error::InvalidArgument(format!(
                "device {} cannot sleep while a stream of it captures a CUDA graph",
                self.device
            )));
        }
        let shared_bytes = self.shared_live_bytes(st, freed);
        if shared_bytes > 0 {
            return Err(Error::InvalidArgument(format!(
                "device {} cannot sleep: {shared_bytes} B under its live tensors were shared with \
                 other processes page by page (IPC); an importer keeps those pages, so the sleep \
                 would give nothing back for them and, after wake, the two processes would no \
                 longer see the same memory. Release the exports first, once every importer closed \
                 them (streampool_ipc_release_export; streampool.share() releases its own once \
                 every receiver let go, at streampool.ipc_collect()), or share from inside \
                 streampool.shareable(), whose memory keeps through a sleep",
                self.device
            )));
        }
        Ok(())
    }

    /// The bytes of the live blocks whose pages were exported ([`super::export`]), but those
    /// starting at `freed`.
    fn shared_live_bytes(&self, st: &VmmState, freed: &[DevicePtr]) -> u64 {
        let shared = st
            .live
            .exported()
            .filter(|&(start, _)| !freed.contains(&DevicePtr(start)));
        shared.map(|(_, bytes)| bytes).sum()
    }

    /// Keeps `fresh`, pinned with the lock free, as the buffer of the next sleep, unless another
    /// thread meanwhile slept (the kept buffer holds that sleep's contents now: an error) or kept
    /// a buffer at least as large; the bytes kept, and the buffer that is no longer kept, to free.
    pub(in crate::resource::vmm) fn keep_reserved(
        &self,
        st: &mut VmmState,
        fresh: HostBytes,
    ) -> (Result<u64>, Option<HostBytes>) {
        if let Err(e) = self.check_awake_to_reserve(st) {
            return (Err(e), Some(fresh));
        }
        match st.sleep_buffer {
            Some(kept) if kept.bytes >= fresh.bytes => (Ok(kept.bytes), Some(fresh)),
            _ => (Ok(fresh.bytes), st.sleep_buffer.replace(fresh)),
        }
    }

    /// An error if the resource is asleep: its host buffer holds what the sleep saved.
    fn check_awake_to_reserve(&self, st: &VmmState) -> Result<()> {
        match st.asleep.is_some() {
            true => Err(Error::InvalidArgument(format!(
                "device {} is asleep: a buffer for its next sleep can be reserved once it is awake",
                self.device
            ))),
            false => Ok(()),
        }
    }
}

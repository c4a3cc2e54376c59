//! How far the virtual-memory resource may grow: new handles within the pool cap, the memory
//! limit and the device's free memory less the headroom kept for the CUDA runtime and libraries
//! (`STREAMPOOL_VMM_HEADROOM`), and what goes back once a growth found the device full.
//!
//! The device's free memory is read (`cuMemGetInfo`) only when it matters: each reading is kept
//! with the resource's physical bytes at the time, and later growths estimate the free memory
//! from it by their own creates and releases; the device is asked again only when that estimate
//! comes within [`MARGIN_SHARE`] of the device's memory of the headroom (what others allocated
//! since cannot take a growth below it unseen) or when no reading is kept.
//!
//! Invariants: a growth creates at most the pages its budget allows, so it never takes the
//! device's free memory below the headroom through its own creates, and after the device refuses
//! a create (others took the memory) it creates no more; after a growth the device's free memory
//! bounded, idle pages go back until twice the headroom is free (or none is idle), so other users
//! of the device get room again; nothing is released during a capture.

use super::{VmmResource, VmmState};

/// The estimate of the device's free memory is trusted down to this share (1/16) of the
/// device's memory above the headroom and the growth; closer, the device is asked.
const MARGIN_SHARE: u64 = 16;

/// The device's free memory as last read, with the resource's physical bytes at the time.
#[derive(Debug, Clone, Copy)]
pub(super) struct FreeSeen {
    free_bytes: u64,
    physical_bytes: u64,
}

/// How many new pages a growth may create, and what bounds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Budget {
    pub pages: u64,
    /// The device's free memory (less the headroom) bounds it, not the pool cap or the limit.
    pub device_bound: bool,
}

impl VmmResource {
    /// How many of `wanted` new pages may be created now (see the module's notes).
    pub(super) fn creatable(&self, st: &mut VmmState, wanted: u64) -> Budget {
        let page = self.page_bytes;
        let physical = st.physical_bytes(page);
        let cap_pages = self.physical_cap_bytes().saturating_sub(physical) / page;
        let wanted_bytes = wanted.min(cap_pages).saturating_mul(page);
        let margin = self.device_total_bytes / MARGIN_SHARE;
        let trusted = self.estimated_free_bytes(st).filter(|&free| {
            free >= (self.headroom_bytes)
                .saturating_add(wanted_bytes)
                .saturating_add(margin)
        });
        let free = match trusted {
            Some(free) => Some(free),
            None => self.read_free_bytes(st),
        };
        // Unknown (the query failed): the cap alone, and the create's own answer.
        let device_pages = free.map_or(u64::MAX, |f| f.saturating_sub(self.headroom_bytes) / page);
        Budget {
            pages: cap_pages.min(device_pages),
            device_bound: device_pages < cap_pages,
        }
    }

    /// The device's free memory as the last reading and the resource's own creates and releases
    /// since say; `None` without a reading.
    fn estimated_free_bytes(&self, st: &VmmState) -> Option<u64> {
        let seen = st.free_seen?;
        let physical = st.physical_bytes(self.page_bytes);
        Some(match physical >= seen.physical_bytes {
            true => (seen.free_bytes).saturating_sub(physical - seen.physical_bytes),
            false => (seen.free_bytes).saturating_add(seen.physical_bytes - physical),
        })
    }

    /// Asks the device for its free memory (kept as the new reading).
    fn read_free_bytes(&self, st: &mut VmmState) -> Option<u64> {
        match self.driver.mem_info(self.device) {
            Ok(info) => {
                st.free_seen = Some(FreeSeen {
                    free_bytes: info.free_bytes,
                    physical_bytes: st.physical_bytes(self.page_bytes),
                });
                Some(info.free_bytes)
            }
            Err(e) => {
                log::debug!("device {}: reading its free memory: {e}", self.device);
                st.free_seen = None;
                None
            }
        }
    }

    /// The most physical memory the growth slack allows with `using_bytes` more in use than now
    /// (`STREAMPOOL_VMM_GROWTH_SLACK` over the most in use since a trim asked for last gave memory
    /// back or the device last idled: [`super::VmmState`]'s `used_max_bytes`); `None` without a
    /// slack.
    pub(super) fn slack_allowed_bytes(&self, st: &VmmState, using_bytes: u64) -> Option<u64> {
        let percent = self.growth_slack_percent?;
        let most_bytes = st
            .used_max_bytes
            .max(st.used_bytes.saturating_add(using_bytes));
        let slack_bytes = most_bytes.saturating_mul(percent.min(1000)) / 100;
        Some(most_bytes.saturating_add(slack_bytes))
    }

    /// The device's free memory bounded the last growth: idle pages (and spare handles) go back
    /// until twice the headroom is free, so that what runs beside the allocator has room again.
    pub(super) fn release_surplus(&self, st: &mut VmmState) {
        st.device_full = false;
        let Some(free) = self.read_free_bytes(st) else {
            return;
        };
        let target_bytes = self.headroom_bytes.saturating_mul(2);
        if free >= target_bytes {
            return;
        }
        let short_pages = (target_bytes - free).div_ceil(self.page_bytes);
        let physical = st.physical_bytes(self.page_bytes);
        let keep_bytes = physical.saturating_sub(short_pages.saturating_mul(self.page_bytes));
        self.release_down_to(st, keep_bytes, None);
        log::info!(
            "device {}: near full; {} idle went back to the device",
            self.device,
            crate::units::format_bytes(physical - st.physical_bytes(self.page_bytes)),
        );
    }
}

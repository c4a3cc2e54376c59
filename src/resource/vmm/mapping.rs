//! Mapping and unmapping pages of the virtual-memory resource: backing a window with handles,
//! giving access, and releasing idle pages.
//!
//! A window's unmapped pages are backed, in this order, by: spare handles (unmapped already);
//! handles moved out of cold idle pages (unused for `cold_after_ms`: memory the program has
//! stopped using, so moving it costs no future mapping); new handles, within the growth's budget
//! ([`super::growth`]: the pool cap, the memory limit, the device's free memory less the
//! headroom); and only then handles moved out of any idle page. So in a steady loop the set of
//! mapped pages settles and nothing is mapped on the allocating thread, while memory that stays
//! unused is reused before the device grows, and a device near full is served from idle pages.
//!
//! Invariants: a page is mapped and given access (device and peers) before any of it is handed
//! out, and on failure nothing half done stays usable — every page of a window is unmapped again
//! and its handle kept as a spare, or, if even that fails, blocked until access can be set or it
//! can be unmapped; a window that spares, idle pages and the budget cannot back together is
//! refused before anything is mapped or moved; no create is tried again in a growth after the
//! device refused one; the handle of a page is taken only from an idle page (in a `Ready` range)
//! or a page the growth's own stream freed, and such a page is unmapped later, once no work can
//! use it there ([`super::lending`]); nothing is unmapped during a capture; physical memory never exceeds the pool cap or the memory limit through this
//! module.

use super::growth::Budget;
use super::ranges::{State, Window};
use super::{Page, Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, MemHandle, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::history::StreampoolEventKind as Event;

/// Driver calls a resource made, for the statistics (what costs time on the allocating thread).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DriverCounts {
    pub maps: u64,
    pub unmaps: u64,
    pub creates: u64,
    pub releases: u64,
    pub set_access_calls: u64,
    /// Blocks handed to a stream after a GPU-side wait for another stream's fence.
    pub stream_waits: u64,
    /// Pages whose handles a growth took to back other addresses, idle or freed by its stream
    /// ([`super::lending`]; their old addresses are unmapped later, counted in `unmaps`).
    pub moves: u64,
    /// Of those, pages its stream had freed and whose work may not have completed.
    pub lent: u64,
}

impl DriverCounts {
    pub fn plus(self, o: DriverCounts) -> DriverCounts {
        DriverCounts {
            maps: self.maps + o.maps,
            unmaps: self.unmaps + o.unmaps,
            creates: self.creates + o.creates,
            releases: self.releases + o.releases,
            set_access_calls: self.set_access_calls + o.set_access_calls,
            stream_waits: self.stream_waits + o.stream_waits,
            moves: self.moves + o.moves,
            lent: self.lent + o.lent,
        }
    }
}

/// What one window's growth may use: idle pages outside the window that may give their handles
/// (cold and hot, listed on first use), pages its stream freed that may lend theirs (listed on
/// first use) and new handles within its budget (asked on first use).
struct Growth {
    keep: (u64, u64),
    stream: Stream,
    listed: Option<(Vec<u64>, Vec<u64>)>,
    lendable: Option<Vec<u64>>,
    budget: Option<Budget>,
}

impl VmmResource {
    /// Backs the window's unmapped pages (see the module's order) and gives the device and its
    /// peers access. On failure every page of the window is left unmapped and every handle taken
    /// is kept as a spare.
    pub(super) fn map_window(
        &self,
        st: &mut VmmState,
        region: Region,
        window: &Window,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        if !st.captures.any_known() {
            return self.map_window_now(st, region, window, bytes, stream);
        }
        // While a graph is captured (in global mode, maybe on another thread), mapping calls
        // are allowed only in relaxed mode, as PyTorch makes its cudaMalloc for graph pools.
        let mut outcome = Ok(());
        let relaxed = self.driver.relaxed_capture(&mut || {
            outcome = self.map_window_now(st, region, window, bytes, stream);
            Ok(())
        });
        relaxed.and(outcome)
    }

    /// [`VmmResource::map_window`] in the thread's capture mode.
    fn map_window_now(
        &self,
        st: &mut VmmState,
        region: Region,
        window: &Window,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let now_ms = self.driver.now_ms();
        let mut growth = Growth {
            keep: (window.start, window.start + bytes),
            stream,
            listed: None,
            lendable: None,
            budget: None,
        };
        self.check_room(st, &mut growth, window.pages.len() as u64, now_ms)?;
        let mut mapped: Vec<u64> = Vec::with_capacity(window.pages.len());
        let outcome = (|| {
            for (i, &page) in window.pages.iter().enumerate() {
                let left = (window.pages.len() - i) as u64;
                let handle = self.take_handle(st, &mut growth, left, now_ms)?;
                if let Err(e) =
                    self.driver
                        .mem_map(self.device, DevicePtr(page), self.page_bytes, handle)
                {
                    if !self.return_moved(st, handle) {
                        st.spare_handles.push(handle);
                    }
                    return Err(e);
                }
                st.pages.insert(
                    page,
                    Page {
                        handle,
                        region,
                        last_used_ms: now_ms,
                    },
                );
                mapped.push(page);
            }
            let devices = self.access_list(st);
            self.set_access(st, &mapped, &devices)
        })();
        match outcome {
            Ok(()) => {
                for &page in &mapped {
                    let state = self.state_of_handle(st, st.pages[&page].handle);
                    st.region(region).retag(page, State::Unmapped, state);
                    self.count(Event::Map, page, st);
                }
                Ok(())
            }
            Err(e) => {
                for page in mapped {
                    let handle = st.pages.remove(&page).expect("mapped above").handle;
                    match self
                        .driver
                        .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
                    {
                        Ok(()) => {
                            if !self.return_moved(st, handle) {
                                st.spare_handles.push(handle);
                            }
                        }
                        // Mapped, maybe without access: no one may use it until that is fixed.
                        Err(_) => {
                            st.pages.insert(
                                page,
                                Page {
                                    handle,
                                    region,
                                    last_used_ms: now_ms,
                                },
                            );
                            st.region(region)
                                .retag(page, State::Unmapped, State::Blocked);
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
        for (region, page) in st.blocked_pages() {
            let devices = self.access_list(st);
            if self.set_access(st, &[page], &devices).is_ok() {
                let state = self.state_of_handle(st, st.pages[&page].handle);
                st.region(region).retag(page, State::Blocked, state);
                self.count(Event::Map, page, st);
            } else if self
                .driver
                .mem_unmap(self.device, DevicePtr(page), self.page_bytes)
                .is_ok()
            {
                let handle = st
                    .pages
                    .remove(&page)
                    .expect("a blocked page is mapped")
                    .handle;
                st.region(region)
                    .retag(page, State::Blocked, State::Unmapped);
                if !self.return_moved(st, handle) {
                    st.spare_handles.push(handle);
                }
            }
        }
    }

    /// Refuses a window of `pages` unmapped pages that spare handles, idle pages outside it and
    /// new handles within the budget cannot back together, before anything is done for it.
    fn check_room(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        pages: u64,
        now_ms: u64,
    ) -> Result<()> {
        let spares = st.spare_handles.len() as u64;
        if pages <= spares {
            return Ok(());
        }
        let budget = self.budget(st, growth, pages - spares);
        if pages <= spares.saturating_add(budget.pages) {
            return Ok(());
        }
        let (cold, hot) = self.donors(st, growth, now_ms);
        let idle = (cold.len() + hot.len()) as u64;
        let idle = idle + self.lendable(st, growth).len() as u64;
        match pages <= spares.saturating_add(budget.pages).saturating_add(idle) {
            true => Ok(()),
            false => Err(Error::Driver {
                call: "cuMemCreate",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY (too few idle pages, and the device's free \
                       memory less STREAMPOOL_VMM_HEADROOM, the memory limit or \
                       STREAMPOOL_MAX_POOL_SIZE allows no more)"
                    .into(),
            }),
        }
    }

    /// The growth's budget of new handles, asked for `wanted` of them on first use.
    fn budget(&self, st: &mut VmmState, growth: &mut Growth, wanted: u64) -> Budget {
        *growth
            .budget
            .get_or_insert_with(|| self.creatable(st, wanted))
    }

    /// A handle for a page, `left` pages of the window (this one included) still to back (see
    /// the module's order).
    fn take_handle(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        left: u64,
        now_ms: u64,
    ) -> Result<MemHandle> {
        if let Some(handle) = st.spare_handles.pop() {
            return Ok(handle);
        }
        if let Some(handle) = self.move_idle_page(st, growth, now_ms, true) {
            return Ok(handle);
        }
        // Beyond the slack over the most ever in use, idle memory is moved before the device
        // grows.
        if let Some(percent) = self.growth_slack_percent {
            let most_bytes = st.used_max_bytes.max(st.used_bytes);
            let slack_bytes = most_bytes.saturating_mul(percent.min(1000)) / 100;
            let allowed_bytes = most_bytes.saturating_add(slack_bytes);
            if st.physical_bytes(self.page_bytes) + self.page_bytes > allowed_bytes {
                if let Some(handle) = self.move_idle_page(st, growth, now_ms, false) {
                    return Ok(handle);
                }
                if let Some(handle) = self.lend(st, growth) {
                    return Ok(handle);
                }
            }
        }
        let budget = self.budget(st, growth, left);
        if budget.pages > 0 {
            let created = match self.exportable {
                true => self
                    .driver
                    .mem_create_exportable(self.device, self.page_bytes),
                false => self.driver.mem_create(self.device, self.page_bytes),
            };
            match created {
                Ok(handle) => {
                    st.counts.creates += 1;
                    st.physical_high_bytes = st
                        .physical_high_bytes
                        .max(st.physical_bytes(self.page_bytes) + self.page_bytes);
                    growth.budget = Some(Budget {
                        pages: budget.pages - 1,
                        ..budget
                    });
                    return Ok(handle);
                }
                // Others took the memory since it was read: no more creates in this growth.
                Err(e) if e.is_device_oom() => {
                    st.free_seen = None;
                    growth.budget = Some(Budget {
                        pages: 0,
                        device_bound: true,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        let moved = match self.move_idle_page(st, growth, now_ms, false) {
            Some(handle) => Some(handle),
            None => self.lend(st, growth),
        };
        match moved {
            Some(handle) => {
                if growth.budget.is_some_and(|b| b.device_bound) {
                    st.device_full = true;
                }
                Ok(handle)
            }
            None => Err(Error::Driver {
                call: "cuMemCreate",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY (no idle page left to move)".into(),
            }),
        }
    }

    /// The idle pages outside the window, cold and hot, each list popped from its back; listed
    /// on first use.
    fn donors<'g>(
        &self,
        st: &VmmState,
        growth: &'g mut Growth,
        now_ms: u64,
    ) -> &'g mut (Vec<u64>, Vec<u64>) {
        let keep = growth.keep;
        growth.listed.get_or_insert_with(|| {
            // Nothing is cold before the clock has run for `cold_after_ms`.
            let cold_before_ms = now_ms.checked_sub(self.cold_after_ms);
            let (mut cold, mut hot): (Vec<u64>, Vec<u64>) = idle_pages(st, keep)
                .into_iter()
                .partition(|p| cold_before_ms.is_some_and(|b| st.pages[p].last_used_ms <= b));
            // Popped from the back: the smallest holes first, as listed.
            cold.reverse();
            hot.reverse();
            (cold, hot)
        })
    }

    /// The pages the growth's stream freed outside the window, popped from the back; listed on
    /// first use.
    fn lendable<'g>(&self, st: &VmmState, growth: &'g mut Growth) -> &'g mut Vec<u64> {
        let (keep, stream) = (growth.keep, growth.stream);
        growth.lendable.get_or_insert_with(|| {
            let mut pages = self.lendable_pages(st, stream, keep);
            pages.reverse();
            pages
        })
    }

    /// The handle of a page the growth's stream freed, lent ([`super::lending`]).
    fn lend(&self, st: &mut VmmState, growth: &mut Growth) -> Option<MemHandle> {
        let page = self.lendable(st, growth).pop()?;
        Some(self.retire_page(st, page))
    }

    /// Takes the handle of an idle page outside the window (a cold one if `cold_only`); the page
    /// is unmapped later ([`super::lending`]).
    fn move_idle_page(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        now_ms: u64,
        cold_only: bool,
    ) -> Option<MemHandle> {
        let (cold, hot) = self.donors(st, growth, now_ms);
        let list = match cold_only {
            true => cold,
            false => hot,
        };
        let page = list.pop()?;
        Some(self.retire_page(st, page))
    }

    /// The device and every granted peer.
    pub(super) fn access_list(&self, st: &VmmState) -> Vec<usize> {
        std::iter::once(self.device)
            .chain(st.peers.iter().copied())
            .collect()
    }

    /// Gives `devices` access to `pages`, one call per run of contiguous pages.
    pub(super) fn set_access(
        &self,
        st: &mut VmmState,
        pages: &[u64],
        devices: &[usize],
    ) -> Result<()> {
        for run in super::runs(pages.len(), |i| pages[i] == pages[i - 1] + self.page_bytes) {
            let bytes = run.len() as u64 * self.page_bytes;
            st.counts.set_access_calls += 1;
            self.driver
                .mem_set_access(self.device, DevicePtr(pages[run.start]), bytes, devices)?;
        }
        Ok(())
    }

    /// Unmaps and releases spare handles and idle pages, the coldest first, until at most
    /// `keep_bytes` of physical memory is held; with `cold_before_ms`, only pages unused since
    /// then. Never during a
    /// capture; a page the driver refuses stays.
    pub(super) fn release_down_to(
        &self,
        st: &mut VmmState,
        keep_bytes: u64,
        cold_before_ms: Option<u64>,
    ) {
        if self.capturing(st) || st.asleep.is_some() {
            return;
        }
        // Each spare is tried once; one the driver refuses stays a spare (and counted).
        let mut refused = Vec::new();
        while st.physical_bytes(self.page_bytes) > keep_bytes {
            let Some(handle) = st.spare_handles.pop() else {
                break;
            };
            // Still mapped where a page retires (a failed window's): released once unmapped.
            if Self::retiring_handle(st, handle) {
                refused.push(handle);
                continue;
            }
            match self.driver.mem_release(self.device, handle) {
                Ok(()) => st.counts.releases += 1,
                Err(e) => {
                    log::warn!("device {}: releasing a spare page: {e}", self.device);
                    refused.push(handle);
                }
            }
        }
        st.spare_handles.append(&mut refused);
        if st.physical_bytes(self.page_bytes) <= keep_bytes {
            return;
        }
        let mut idle = idle_pages(st, (0, 0));
        // A page whose handle is still mapped at a retiring page is not released before that
        // unmap (its memory would stay in use, uncounted).
        idle.retain(|p| !Self::retiring_handle(st, st.pages[p].handle));
        if let Some(before_ms) = cold_before_ms {
            idle.retain(|p| st.pages[p].last_used_ms <= before_ms);
        }
        // The coldest first (unused the longest: the least likely to be asked for again), then
        // from the top of the address space down.
        idle.sort_unstable_by_key(|p| (st.pages[p].last_used_ms, std::cmp::Reverse(*p)));
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
            let p = st.pages.remove(&page).expect("an idle page is mapped");
            st.region(p.region).mark_unmapped(page);
            self.count(Event::Unmap, page, st);
            let handle = p.handle;
            match self.driver.mem_release(self.device, handle) {
                Ok(()) => st.counts.releases += 1,
                Err(e) => {
                    log::warn!("device {}: releasing a page: {e}", self.device);
                    st.spare_handles.push(handle);
                }
            }
        }
    }
}

/// Idle pages of both regions (the large blocks' smallest holes first, then the carriers'
/// region's), none inside `[keep.0, keep.1)`.
fn idle_pages(st: &VmmState, keep: (u64, u64)) -> Vec<u64> {
    let mut pages = st.large.idle_pages(keep.0, keep.1);
    pages.extend(st.carriers.idle_pages(keep.0, keep.1));
    pages
}

//! Mapping and unmapping pages of the virtual-memory resource: backing a window with the
//! handles [`super::backing`] finds (a mapping a handle: one page, or a span of them), giving
//! access, and releasing idle pages.
//!
//! Invariants: a page is mapped and given access (device and peers) before any of it is handed
//! out, and on failure nothing half done stays usable — every mapping of a window is unmapped
//! again and its handle put back (a page's kept as a spare, a span's released), or, if even that
//! fails, blocked until access can be set or it can be unmapped; nothing is unmapped during a
//! capture; physical memory never exceeds the pool cap or the memory limit through this module.

use super::backing::Growth;
use super::ranges::{State, Window};
use super::spans::Mapping;
use super::{Page, Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, Stream};
use crate::error::Result;
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

impl VmmResource {
    /// Backs the window's unmapped pages (see the module's order) and gives the device and its
    /// peers access; no handle backs pages on both sides of `split_at` (a page start), if given.
    /// On failure every page of the window is left unmapped and every handle taken is kept as a
    /// spare.
    pub(super) fn map_window(
        &self,
        st: &mut VmmState,
        region: Region,
        window: &Window,
        bytes: u64,
        stream: Stream,
        split_at: Option<u64>,
    ) -> Result<()> {
        let map =
            |st: &mut VmmState| self.map_window_now(st, region, window, bytes, stream, split_at);
        if !st.captures.any_known() {
            return map(st);
        }
        // While a graph is captured (in global mode, maybe on another thread), mapping calls
        // are allowed only in relaxed mode, as PyTorch makes its cudaMalloc for graph pools.
        crate::driver::in_relaxed_mode(self.driver.as_ref(), || map(st))
    }

    /// [`VmmResource::map_window`] in the thread's capture mode.
    fn map_window_now(
        &self,
        st: &mut VmmState,
        region: Region,
        window: &Window,
        bytes: u64,
        stream: Stream,
        split_at: Option<u64>,
    ) -> Result<()> {
        let now_ms = self.driver.now_ms();
        let mut growth = Growth::new((window.start, window.start + bytes), stream);
        self.check_room(st, &mut growth, window.pages.len() as u64, now_ms)?;
        let mut mapped: Vec<u64> = Vec::with_capacity(window.pages.len());
        let outcome = (|| {
            let pages = &window.pages;
            // How many adjacent pages of the window start at each one (a span may back them).
            let mut run = vec![1u64; pages.len()];
            for i in (0..pages.len().saturating_sub(1)).rev() {
                let next = pages[i + 1];
                if next == pages[i] + self.page_bytes && Some(next) != split_at {
                    run[i] = run[i + 1] + 1;
                }
            }
            let mut i = 0;
            while i < pages.len() {
                let left = (pages.len() - i) as u64;
                let (handle, n) = self.take_handle(st, &mut growth, left, run[i], now_ms)?;
                let first = pages[i];
                let bytes = n * self.page_bytes;
                if let Err(e) = (self.driver).mem_map(self.device, DevicePtr(first), bytes, handle)
                {
                    self.put_back_unmapped(st, handle, n);
                    return Err(e);
                }
                let mapping = Mapping { first, pages: n };
                for page in mapping.page_starts(self.page_bytes) {
                    let entry = Page::in_mapping(mapping, handle, region, now_ms);
                    st.pages.insert(page, entry);
                    mapped.push(page);
                }
                i += n as usize;
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
                // Mappings whole, in order: each is unmapped (its handle put back), or, if even
                // that fails, its pages stay mapped, maybe without access: blocked, so that no
                // one uses them until that is fixed.
                let mut i = 0;
                while i < mapped.len() {
                    let Page {
                        handle, mapping, ..
                    } = st.pages[&mapped[i]];
                    i += mapping.pages as usize;
                    match self.unmap_mapping(st, mapping.first) {
                        Ok(_) => self.put_back_unmapped(st, handle, mapping.pages),
                        Err(_) => {
                            for page in mapping.page_starts(self.page_bytes) {
                                st.region(region)
                                    .retag(page, State::Unmapped, State::Blocked);
                            }
                            st.blocked = true;
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// Blocked pages get access, or are unmapped (their handles put back), a mapping at a time;
    /// a mapping for which both fail stays blocked for the next try.
    pub(super) fn unblock(&self, st: &mut VmmState) {
        for (region, page) in st.blocked_pages() {
            // Done with the mapping's first page (a mapping's pages are blocked together; a span
            // unmapped there has left the page map).
            let Some(&Page {
                handle, mapping, ..
            }) = st.pages.get(&page)
            else {
                continue;
            };
            if mapping.first != page {
                continue;
            }
            let pages: Vec<u64> = mapping.page_starts(self.page_bytes).collect();
            let devices = self.access_list(st);
            if self.set_access(st, &pages, &devices).is_ok() {
                let state = self.state_of_handle(st, handle);
                for &page in &pages {
                    st.region(region).retag(page, State::Blocked, state);
                    self.count(Event::Map, page, st);
                }
            } else if self.unmap_mapping(st, page).is_ok() {
                for &page in &pages {
                    st.region(region)
                        .retag(page, State::Blocked, State::Unmapped);
                }
                self.put_back_unmapped(st, handle, mapping.pages);
            }
        }
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
    /// then; a span only once all its pages are idle. Never during a capture; a page the driver
    /// refuses stays.
    pub(super) fn release_down_to(
        &self,
        st: &mut VmmState,
        keep_bytes: u64,
        cold_before_ms: Option<u64>,
    ) {
        if self.capturing(st) || st.asleep.is_some() {
            return;
        }
        self.release_spare_spans(st);
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
        let mut idle = st.idle_pages((0, 0));
        // A page whose handle is still mapped at a retiring page is not released before that
        // unmap (its memory would stay in use, uncounted).
        idle.retain(|p| !Self::retiring_handle(st, st.pages[p].handle));
        if let Some(before_ms) = cold_before_ms {
            idle.retain(|&p| st.last_used_ms(p) <= before_ms);
        }
        // The coldest first (unused the longest: the least likely to be asked for again), then
        // from the top of the address space down.
        idle.sort_by_cached_key(|&p| (st.last_used_ms(p), std::cmp::Reverse(p)));
        let spans: std::collections::HashSet<u64> = (idle.iter().copied())
            .filter(|p| st.pages[p].mapping.is_span())
            .collect();
        for page in idle {
            if st.physical_bytes(self.page_bytes) <= keep_bytes {
                break;
            }
            // Gone already with its span, or a span not idle as a whole.
            let Some(&Page { mapping, .. }) = st.pages.get(&page) else {
                continue;
            };
            if mapping.is_span()
                && !mapping
                    .page_starts(self.page_bytes)
                    .all(|q| spans.contains(&q))
            {
                continue;
            }
            let p = match self.unmap_mapping(st, page) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("device {}: unmapping an idle page: {e}", self.device);
                    continue;
                }
            };
            for q in mapping.page_starts(self.page_bytes) {
                st.region(p.region).mark_unmapped(q);
                self.count(Event::Unmap, q, st);
            }
            self.release_handle(st, p.handle, mapping.pages);
        }
    }

    /// Counts a page mapped or unmapped, and notes it on the timeline.
    pub(super) fn count(&self, kind: Event, page: u64, st: &mut VmmState) {
        match kind {
            Event::Map => st.counts.maps += 1,
            _ => st.counts.unmaps += 1,
        }
        let reserved_bytes = st.physical_bytes(self.page_bytes);
        self.recorder
            .note_resource(kind, DevicePtr(page), self.page_bytes, reserved_bytes);
    }
}

//! Spans: one physical handle backing several adjacent pages. A growth that backs a run of a
//! window's pages with new memory creates one handle for up to `STREAMPOOL_VMM_SPAN_SIZE` of them
//! (auto: 256 MiB while memory cycles — the release threshold at a synchronisation, a second
//! `empty_cache()` since the device last idled, or a sleep gave memory back, and less than
//! the most held before is mapped again; an idle release ends it, but not while asleep — else
//! 8 MiB, or one page where a growth slack or a cold age makes pages move, so that each can).
//! While memory cycles by the release threshold or a sleep, a large block's growth also maps free
//! memory after the block, in a handle of its own, up to a span in all, never beyond the most
//! held before such a give-back nor past the growth slack, so that the blocks that follow fit
//! there: a step's memory comes back in a few handles, not one a block, as a CUDA pool grows.
//! Not after `empty_cache()`: it may end a phase as well as a step, and a smaller next phase
//! filled the last one's peak (multistream after churn in one process on an H200: 330 MiB at its
//! peak, alone 246). The driver's calls cost
//! per handle, hardly per byte (on an H200, 1 GiB takes 3.1 ms to create, map, give access to,
//! unmap and release in 32 MiB handles and 37 ms in 2 MiB ones), so a loop that gives its memory
//! back at every synchronisation and maps it again pays per handle (GPT-2 under a 1 GiB
//! threshold on an H200, a synchronisation a step: 66–70 ms a step mapped ahead, with the pool
//! backend at 71–72 and native at 46–48 in the same diagnostic, bench/results/2026-11-29-h200-d;
//! before, 98 with 32 MiB spans and a handle a block, 344 with a handle a page).
//! The price, where pages move, is memory: a span cannot move page by page to fill another
//! block's window, so where pages otherwise stay mapped and move to where they are needed, spans
//! hold more (GPT-2 replayed with a 2% slack: peak 1.18x live with 32 MiB spans always on, 1.01x
//! without). Where pages do not move (the defaults) they cost nothing at the peak (docs/replay.md,
//! "Spans").
//!
//! Invariants: a span is one mapping — its pages are mapped, given access, unmapped and released
//! together (the driver cannot unmap part of a mapping), and go back only when every one of them
//! is idle; a span's handle is never moved to another address, lent, or kept as a spare for a
//! single page; one the driver would not release is kept aside (counted as reserved) and
//! released at the next try, never mapped again; memory mapped ahead of a block never takes
//! what is held past the most held before the trim.

use super::{Page, Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, MemHandle, Stream};
use crate::error::Result;

/// The mapping a page lies in: its first page and how many pages it has (1: the page alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mapping {
    pub first: u64,
    pub pages: u64,
}

impl Mapping {
    /// Its pages, first to last.
    pub fn page_starts(self, page_bytes: u64) -> impl Iterator<Item = u64> {
        (0..self.pages).map(move |i| self.first + i * page_bytes)
    }

    pub fn is_span(self) -> bool {
        self.pages > 1
    }
}

/// What gave memory back ([`VmmResource::note_given_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// The release threshold, at a synchronisation of the program's.
    Threshold,
    /// A trim asked for: `empty_cache()`, `streampool.trim()`, the device making room.
    Asked,
    /// A sleep.
    Sleep,
}

/// Auto (`STREAMPOOL_VMM_SPAN_SIZE` unset): the most memory one new handle backs while memory
/// cycles.
const AUTO_SPAN_BYTES: u64 = 256 << 20;

/// Auto, where pages do not move (no growth slack, no cold age: the defaults) and memory does
/// not cycle: a span costs no memory at the peak then, as no page of it would have moved, and it
/// saves the driver's calls per handle. But it goes back only whole, so a span with one live page
/// holds the rest at a trim or an idle release. Replayed traces, one page a handle / 8 MiB / 32
/// MiB spans: the same peak on every trace; GPT-2's creates 6,943 / 1,819 / 589; held beyond live
/// after a trim at the end (the replay's "idle MiB"), GPT-2 27 / 61 / 173 MiB, churn 18 / 40 / 68.
const STILL_SPAN_BYTES: u64 = 8 << 20;

impl VmmResource {
    /// While memory cycles by the release threshold or a sleep, a large block whose growth would
    /// map new memory is placed with free memory after it, so that the blocks that follow fit
    /// there (a CUDA pool grows the same way): up to a span in all, in a handle of its own (the
    /// block's live pages do not hold it past a trim), never beyond the most held before the
    /// give-back, and only as much as new handles can back within the budget and the growth
    /// slack (nothing moved, lent or given back for it), in memory `stream` may use without a
    /// wait. `None` when memory does not cycle so or the span ahead does not fit: then the block
    /// alone is mapped.
    pub(super) fn place_ahead(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Option<u64> {
        let page = self.page_bytes;
        let held_bytes = st.physical_bytes(page);
        if held_bytes >= st.ahead_back_to_bytes {
            return None;
        }
        let block_pages = bytes.div_ceil(page);
        let mut room_bytes = st.ahead_back_to_bytes - held_bytes;
        if let Some(allowed_bytes) = self.slack_allowed_bytes(st, bytes) {
            room_bytes = room_bytes.min(allowed_bytes.saturating_sub(held_bytes));
        }
        let span_bytes = self.span_max_pages(st).saturating_mul(page);
        let ahead_pages = (span_bytes.min(room_bytes) / page).saturating_sub(block_pages);
        if ahead_pages == 0 {
            return None;
        }
        let budget_pages = self.creatable(st, block_pages + ahead_pages).pages;
        let ahead_pages = ahead_pages.min(budget_pages.saturating_sub(block_pages));
        if ahead_pages == 0 {
            return None;
        }
        let mapped_bytes = (block_pages.checked_add(ahead_pages)?).checked_mul(page)?;
        let window = st.large.window(mapped_bytes, stream, false).or_else(|| {
            let extent_bytes = mapped_bytes.max(self.extent_bytes);
            self.reserve(st, Region::Large, extent_bytes).ok()?;
            st.large.window(mapped_bytes, stream, false)
        })?;
        let split_at = (window.start.checked_add(bytes)?).checked_next_multiple_of(page)?;
        let mapped = self.map_window(
            st,
            Region::Large,
            &window,
            mapped_bytes,
            stream,
            Some(split_at),
        );
        if let Err(e) = mapped {
            log::debug!(
                "device {}: mapping {mapped_bytes} B ahead: {e}; the block alone",
                self.device
            );
            return None;
        }
        st.large.take(window.start, bytes);
        Some(window.start)
    }

    /// Memory went back from `before_bytes` held, by `cause`: until as much is held again,
    /// memory cycles — new memory comes in spans. The release threshold at a synchronisation and
    /// a sleep start a cycle at once (they repeat: a loop's steps, sleep and wake). A trim asked
    /// for (`empty_cache()`, `streampool.trim()`, the flush before an out-of-memory retry) does
    /// only from the second since the device last idled; the first is no loop (one
    /// `empty_cache()` after loading a model, before training), and cycling after it mapped
    /// the next phase's memory in spans and ahead of its blocks up to the last phase's peak.
    /// Up to the most held before such a give-back since the device last idled, not the last
    /// one's: where a step ends in two synchronisations, the second gives back less, and
    /// keeping only its figure made GPT-2 under a 1 GiB threshold map 3.6x as many handles in
    /// the replay (driver time 408 -> 1484 ms). Not up to the most ever held either (a peak an
    /// idle release gave back), which memory mapped ahead of a block would fill. A give-back
    /// of nothing (a second synchronisation in a row) changes nothing: ending the cycle there
    /// made the next step grow a page a handle (GPT-2 under a 1 GiB threshold on an H200: 124
    /// new handles a step instead of 47). A trim asked for that gives memory back also restarts
    /// the growth slack's measure; one that gives nothing back (the flush before a sleep, an
    /// empty cache emptied again) changes nothing.
    pub(super) fn note_given_back(&self, st: &mut VmmState, before_bytes: u64, cause: GiveBack) {
        if st.physical_bytes(self.page_bytes) >= before_bytes {
            return;
        }
        if cause == GiveBack::Asked {
            // A program that empties the cache starts afresh: the most it used before must not
            // let the next phase grow past its own needs before it reuses its own idle pages
            // (BERT after churn in one process held 0.52 GiB at its peak on an H200, alone 0.46).
            st.used_max_bytes = st.used_bytes;
        }
        let first = !std::mem::replace(&mut st.given_back_since_idle, true);
        if first && cause == GiveBack::Asked {
            return;
        }
        st.cycle_back_to_bytes = st.cycle_back_to_bytes.max(before_bytes);
        if cause != GiveBack::Asked {
            st.ahead_back_to_bytes = st.ahead_back_to_bytes.max(before_bytes);
        }
    }

    /// The most pages one new handle backs now.
    pub(super) fn span_max_pages(&self, st: &VmmState) -> u64 {
        let pages_of = |bytes: u64| (bytes / self.page_bytes).max(1);
        match self.span_pages {
            Some(pages) => pages,
            None if st.physical_bytes(self.page_bytes) < st.cycle_back_to_bytes => {
                pages_of(AUTO_SPAN_BYTES)
            }
            // Pages move to where they are needed: one a handle, so that each can.
            None if self.pages_move() => 1,
            None => pages_of(STILL_SPAN_BYTES),
        }
    }

    /// Whether idle pages move to back new blocks while the device has room: a growth slack or a
    /// cold age is set.
    fn pages_move(&self) -> bool {
        self.growth_slack_percent.is_some() || self.cold_after_ms != u64::MAX
    }

    /// Unmaps the whole mapping `page` lies in; on success its pages leave the page map, and the
    /// page's entry (its handle, mapping and region) is returned. On failure nothing changes.
    pub(super) fn unmap_mapping(&self, st: &mut VmmState, page: u64) -> Result<Page> {
        let p = st.pages[&page];
        let bytes = p.mapping.pages * self.page_bytes;
        (self.driver).mem_unmap(self.device, DevicePtr(p.mapping.first), bytes)?;
        for q in p.mapping.page_starts(self.page_bytes) {
            st.pages.remove(&q);
        }
        Ok(p)
    }

    /// A handle of `pages` pages, mapped nowhere now, that backs nothing any more: a page's is
    /// given back to the page it was moved out of ([`super::lending`]) or kept as a spare, a
    /// span's is released.
    pub(super) fn put_back_unmapped(&self, st: &mut VmmState, handle: MemHandle, pages: u64) {
        if pages > 1 {
            self.release_handle(st, handle, pages);
        } else if !self.return_moved(st, handle) {
            st.spare_handles.push(handle);
        }
    }

    /// Releases the handle of an unmapped mapping of `pages` pages; one the driver refuses stays
    /// held, as a spare (a page's) or aside (a span's). True if released.
    pub(super) fn release_handle(&self, st: &mut VmmState, handle: MemHandle, pages: u64) -> bool {
        match self.driver.mem_release(self.device, handle) {
            Ok(()) => {
                st.counts.releases += 1;
                true
            }
            Err(e) => {
                log::warn!("device {}: releasing {pages} page(s): {e}", self.device);
                match pages > 1 {
                    true => st.spare_spans.push((handle, pages)),
                    false => st.spare_handles.push(handle),
                }
                false
            }
        }
    }

    /// Tries again to release the spans the driver refused before.
    pub(super) fn release_spare_spans(&self, st: &mut VmmState) {
        for (handle, pages) in std::mem::take(&mut st.spare_spans) {
            self.release_handle(st, handle, pages);
        }
    }
}

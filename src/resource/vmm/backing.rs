//! Where a growth's handles come from ([`super::mapping`] maps them), in this order: spare
//! handles (unmapped already); handles moved out of cold idle pages (unused for
//! `cold_after_ms`: memory the program has stopped using, so moving it costs no future mapping);
//! new handles, within the growth's budget ([`super::growth`]: the pool cap, the memory limit, the
//! device's free memory less the headroom) — one for each run of adjacent pages, up to a span
//! ([`super::spans`]); and only then handles moved out of any idle page. So in a steady loop the
//! set of mapped pages settles and nothing is mapped on the allocating thread, while memory that
//! stays unused is reused before the device grows (where a cold age is set; by default none is,
//! and no slack, so that pages move only near a full device: [`crate::config::Config`]), and a
//! device near full is served from idle pages. A span cannot give its handle page by page: where
//! a page would be moved out of one, the whole span, wholly idle, goes back to the device
//! instead, and its memory counts in the budget.
//!
//! Invariants: a window that spares, idle memory and the budget cannot back together is refused
//! before anything is mapped or moved; after the device refuses a create, a growth creates only
//! what a fresh reading of the device's free memory allows (and what a span it gave back frees),
//! and after a second refusal nothing; the handle of a page is taken only from
//! an idle page (in a `Ready` range) or a page the growth's own stream freed, and such a page is
//! unmapped later, once no work can use it there ([`super::lending`]); a span goes back only
//! when all its pages are idle and outside the window, and never while a capture is known.

use super::clock::Marks;
use super::growth::Budget;
use super::{VmmResource, VmmState};
use crate::driver::{MemHandle, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::history::StreampoolEventKind as Event;

/// What one window's growth may use: idle memory outside the window (listed on first use), pages
/// its stream freed that may lend their handles (listed on first use) and new handles within its
/// budget (asked on first use).
pub(super) struct Growth {
    keep: (u64, u64),
    stream: Stream,
    donors: Option<Donors>,
    lendable: Option<Vec<u64>>,
    budget: Option<Budget>,
    /// The device refused a create in this growth.
    refused: bool,
}

impl Growth {
    /// The growth of the window `[keep.0, keep.1)` for `stream`.
    pub(super) fn new(keep: (u64, u64), stream: Stream) -> Growth {
        Growth {
            keep,
            stream,
            donors: None,
            lendable: None,
            budget: None,
            refused: false,
        }
    }

    /// Its budget was asked and the device's free memory bounds it: a page backed by idle memory
    /// rather than a new handle means the device was found full.
    fn device_bound(&self) -> bool {
        self.budget.is_some_and(|b| b.device_bound)
    }
}

/// Idle memory outside a growth's window, cold and hot: pages whose handles may move, and spans
/// (by their first pages) wholly idle, which may go back to the device. Each list is popped
/// from its back.
#[derive(Default)]
struct Donors {
    cold: Vec<u64>,
    hot: Vec<u64>,
    cold_spans: Vec<(u64, u64)>,
    hot_spans: Vec<(u64, u64)>,
}

impl Donors {
    fn pages(&self) -> u64 {
        let spans = self.cold_spans.iter().chain(&self.hot_spans);
        (self.cold.len() + self.hot.len()) as u64 + spans.map(|&(_, pages)| pages).sum::<u64>()
    }
}

impl VmmResource {
    /// Refuses a window of `pages` unmapped pages that spare handles, idle memory outside it and
    /// new handles within the budget cannot back together, before anything is done for it.
    pub(super) fn check_room(
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
        let idle = self.donors(st, growth, now_ms).pages();
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

    /// A handle for the next page, `left` pages of the window (this one included) still to
    /// back, `run` of them adjacent from this one (see the module's order); with how many pages it
    /// backs: one, or, for new memory, a span of up to `run`.
    pub(super) fn take_handle(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        left: u64,
        run: u64,
        now_ms: u64,
    ) -> Result<(MemHandle, u64)> {
        // (The call-counting build counts the handles by where they came from; the sections'
        // times say nothing.)
        if let Some(handle) = st.spare_handles.pop() {
            return timed_section!("vmm growth handle: a spare", Ok((handle, 1)));
        }
        if let Some(handle) = self.move_idle_page(st, growth, now_ms, true) {
            return timed_section!("vmm growth handle: a cold page's, moved", Ok((handle, 1)));
        }
        self.give_back_span(st, growth, now_ms, true);
        // Beyond the slack over the most in use (since the last empty_cache() that gave memory
        // back), idle memory is moved before the device grows.
        if let Some(allowed_bytes) = self.slack_allowed_bytes(st, 0) {
            if st.physical_bytes(self.page_bytes) + self.page_bytes > allowed_bytes {
                let moved = self.move_idle_page(st, growth, now_ms, false);
                if let Some(handle) = moved.or_else(|| self.lend(st, growth)) {
                    let moved = Ok((handle, 1));
                    return timed_section!("vmm growth handle: moved or lent, slack", moved);
                }
                self.give_back_span(st, growth, now_ms, false);
            }
        }
        loop {
            if let Some(created) = self.create_handle(st, growth, left, run)? {
                return timed_section!(
                    "vmm growth handle: created (a page or a span)",
                    Ok(created)
                );
            }
            let moved = self.move_idle_page(st, growth, now_ms, false);
            if let Some(handle) = moved.or_else(|| self.lend(st, growth)) {
                st.device_full |= growth.device_bound();
                return timed_section!(
                    "vmm growth handle: moved or lent, no room",
                    Ok((handle, 1))
                );
            }
            if !self.give_back_span(st, growth, now_ms, false) {
                return Err(Error::Driver {
                    call: "cuMemCreate",
                    code: CUDA_ERROR_OUT_OF_MEMORY,
                    name: "CUDA_ERROR_OUT_OF_MEMORY (no idle page left to move)".into(),
                });
            }
            // An idle span went back to make room, as a page moves where it can: the device was
            // found full.
            st.device_full |= growth.device_bound();
        }
    }

    /// A new handle within the growth's budget for up to `run` pages (a span where spans are
    /// on), and its pages; None once the budget or the device allows none. The first time the
    /// device refuses one (others took the memory since it was read), its free memory is read
    /// again and the budget follows it; after a second refusal the growth creates nothing more.
    fn create_handle(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        left: u64,
        run: u64,
    ) -> Result<Option<(MemHandle, u64)>> {
        loop {
            let budget = self.budget(st, growth, left);
            let pages = run.min(budget.pages).min(self.span_max_pages(st));
            if pages == 0 {
                return Ok(None);
            }
            let bytes = pages * self.page_bytes;
            match self.create_physical(st, bytes) {
                Ok(handle) => {
                    let held_bytes = st.physical_bytes(self.page_bytes) + bytes;
                    st.physical_high_bytes = st.physical_high_bytes.max(held_bytes);
                    st.physical_max_bytes = st.physical_max_bytes.max(held_bytes);
                    growth.budget = Some(Budget {
                        pages: budget.pages - pages,
                        ..budget
                    });
                    return Ok(Some((handle, pages)));
                }
                Err(e) if e.is_device_oom() => {
                    st.free_seen = None;
                    let first = !std::mem::replace(&mut growth.refused, true);
                    growth.budget = (!first).then_some(Budget {
                        pages: 0,
                        device_bound: true,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A new physical handle of `bytes`, exportable to other processes where the resource's
    /// pages are; counted (`num_mem_creates`) once made, whoever asked (growth, wake).
    pub(super) fn create_physical(&self, st: &mut VmmState, bytes: u64) -> Result<MemHandle> {
        let handle = match self.exportable {
            true => self.driver.mem_create_exportable(self.device, bytes),
            false => self.driver.mem_create(self.device, bytes),
        }?;
        st.counts.creates += 1;
        Ok(handle)
    }

    /// The idle memory outside the window, listed on first use: one sweep of the pages of each
    /// `Ready` range, the smallest range first (a page looked up one by one cost GPT-2's timed
    /// growths 61% of the allocator's instructions in the replay; a `Ready` range is mapped, so
    /// the page map holds each of its whole pages). A span is a donor when it lies wholly inside
    /// one such range and outside the window: two ready ranges next to each other inside one
    /// reservation always merge, and a span never crosses a reservation's end, so its pages are
    /// all idle exactly then.
    fn donors<'g>(&self, st: &VmmState, growth: &'g mut Growth, now_ms: u64) -> &'g mut Donors {
        let keep = growth.keep;
        growth.donors.get_or_insert_with(|| {
            // Nothing is cold before the clock has run for `cold_after_ms`.
            let cold_before_ms = now_ms.checked_sub(self.cold_after_ms);
            let cold = |marks: &Marks, page: u64, p: &super::Page| {
                cold_before_ms.is_some_and(|b| p.last_used_ms(marks.mark(page)) <= b)
            };
            let outside = |start: u64, end: u64| end <= keep.0 || keep.1 <= start;
            let page_bytes = self.page_bytes;
            let mut donors = Donors::default();
            // Nothing is unmapped while a capture is known: no span goes back then.
            let spans_may_go = !st.captures.any_known();
            let ready = st.large.ready_ranges().chain(st.carriers.ready_ranges());
            for (start, end) in ready {
                // A range lies in one reservation: its pages' marks in one slice.
                let marks = st.clock.extent_of(start);
                for (&page, p) in st.pages.range(start..end) {
                    if page + page_bytes > end || !outside(page, page + page_bytes) {
                        continue;
                    }
                    let mapping = p.mapping;
                    if !mapping.is_span() {
                        match cold(&marks, page, p) {
                            true => donors.cold.push(page),
                            false => donors.hot.push(page),
                        }
                        continue;
                    }
                    let span_end = mapping.first + mapping.pages * page_bytes;
                    if !spans_may_go || mapping.first != page || span_end > end {
                        continue;
                    }
                    if !outside(page, span_end) {
                        continue;
                    }
                    let span = (mapping.first, mapping.pages);
                    match st
                        .pages
                        .range(page..span_end)
                        .all(|(&q, qp)| cold(&marks, q, qp))
                    {
                        true => donors.cold_spans.push(span),
                        false => donors.hot_spans.push(span),
                    }
                }
            }
            // Popped from the back: the smallest holes first, as listed.
            donors.cold.reverse();
            donors.hot.reverse();
            donors.cold_spans.reverse();
            donors.hot_spans.reverse();
            donors
        })
    }

    /// The pages the growth's stream freed outside the window, popped from the back; listed on
    /// first use.
    fn lendable<'g>(&self, st: &VmmState, growth: &'g mut Growth) -> &'g mut Vec<u64> {
        let (keep, stream) = (growth.keep, growth.stream);
        growth.lendable.get_or_insert_with(|| {
            let mut pages = self.lendable_pages(st, stream, keep);
            pages.retain(|p| !st.pages[p].mapping.is_span());
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
        let donors = self.donors(st, growth, now_ms);
        let list = match cold_only {
            true => &mut donors.cold,
            false => &mut donors.hot,
        };
        let page = list.pop()?;
        Some(self.retire_page(st, page))
    }

    /// Gives a wholly idle span outside the window (a cold one if `cold_only`) back to the
    /// device: its pages count in the growth's budget of new handles. True if one went.
    fn give_back_span(
        &self,
        st: &mut VmmState,
        growth: &mut Growth,
        now_ms: u64,
        cold_only: bool,
    ) -> bool {
        loop {
            let donors = self.donors(st, growth, now_ms);
            let list = match cold_only {
                true => &mut donors.cold_spans,
                false => &mut donors.hot_spans,
            };
            let Some((first, pages)) = list.pop() else {
                return false;
            };
            let p = match self.unmap_mapping(st, first) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("device {}: unmapping an idle span: {e}", self.device);
                    continue;
                }
            };
            for q in p.mapping.page_starts(self.page_bytes) {
                st.region(p.region).mark_unmapped(q);
                self.count(Event::Unmap, q, st);
            }
            // Released: below the cap by as much again, and the device has the memory back (a
            // budget asked later counts it anyway).
            if self.release_handle(st, p.handle, pages) {
                if let Some(budget) = growth.budget.as_mut() {
                    budget.pages = budget.pages.saturating_add(pages);
                }
            }
            return true;
        }
    }
}

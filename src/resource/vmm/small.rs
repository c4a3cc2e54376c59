//! Small blocks of the virtual-memory resource: blocks up to `small_max_bytes` are carved out of
//! carriers — whole pages taken out of the address space's free ranges — best fit, split at 512
//! bytes, neighbours merged, so that they never split the ranges large blocks need.
//!
//! Invariants: a carrier is a run of adjacent pages of one reservation of the carriers' region
//! of the address space (apart from large blocks, so that it never splits a range they need; a
//! page taken beside a carrier joins it, so that a block may span its pages, as blocks span the
//! granules of PyTorch's segments) or, before that region grows, one page of a hole of at most
//! [`CARRIER_HOLE_PAGES`] pages between large blocks (a free range with no free or unmapped range
//! beside it: too small for most of them, and no part of a larger free run or of one a growth
//! would extend) that is a handle of its own (no span's other pages are kept by it), never joined;
//! a page is taken out of its region's free pages while any block on it is live or waits for its
//! fence, and given back to that region (in the state of the free range it lies in) as soon as it
//! is wholly free, splitting its carrier, so an idle page of a carrier is an idle page like any
//! other; the same stream-ordering rules apply inside carriers as outside (`Freed` pieces serve
//! their stream at once, other streams after a GPU-side wait or their fence).

use super::ranges::State;
use super::slabs::{class_of, slab_bytes, Emptied};
use super::{Region, VmmResource, VmmState};
use crate::driver::Stream;
use crate::error::Result;

/// A new carrier may be a page of a hole of the large blocks' ranges of at most this many pages.
const CARRIER_HOLE_PAGES: u64 = 2;

impl VmmResource {
    /// A small block for `stream`: a fit in a carrier it may use, a mapped page it may use as a
    /// new carrier (both without a driver call: a loop whose carrier empties and fills again
    /// asks the GPU nothing), after updating the ranges, after a GPU-side wait, in the room empty
    /// slabs leave, or in a carrier mapped now.
    pub(super) fn place_small(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Result<u64> {
        if let Some(start) = self.carve_at_hand(st, bytes, stream) {
            return Ok(start);
        }
        if let Some(start) = self.take_free(st, true, bytes, stream) {
            return Ok(start);
        }
        // Before a page is mapped: empty slabs go back to their carriers, where it may fit.
        if self.return_empty_slabs(st) {
            if let Some(start) = self.carve_at_hand(st, bytes, stream) {
                return Ok(start);
            }
        }
        let (page, state) = self.new_carrier(st, stream)?;
        Ok(self.carve(st, page, state, bytes, stream))
    }

    /// A small block `stream` may use at once, without a driver call: a fit in a carrier, or a
    /// mapped page made a carrier (of the carriers' region, else of a small hole).
    #[inline]
    pub(super) fn carve_at_hand(
        &self,
        st: &mut VmmState,
        bytes: u64,
        stream: Stream,
    ) -> Option<u64> {
        if let Some(start) = st.small.best_fit(bytes, stream) {
            st.small.take(start, bytes);
            return Some(start);
        }
        if let Some(page) = st.carriers.best_fit_page(stream) {
            let state = st.carriers.take(page, self.page_bytes);
            return Some(self.carve(st, page, state, bytes, stream));
        }
        let (page, state) = self.take_hole_page(st, stream)?;
        Some(self.carve(st, page, state, bytes, stream))
    }

    /// A page of a hole of at most [`CARRIER_HOLE_PAGES`] pages between large blocks that
    /// `stream` may use and that is a handle of its own, taken for a new carrier; with the state
    /// it was in. (Pages of any hole pinned BERT's next long sequence out of its hole, replayed:
    /// docs/replay.md, "Carriers in small holes".)
    fn take_hole_page(&self, st: &mut VmmState, stream: Stream) -> Option<(u64, State)> {
        let max_bytes = CARRIER_HOLE_PAGES * self.page_bytes;
        let alone = |page: u64| st.pages.get(&page).is_some_and(|p| !p.mapping.is_span());
        let page = (st.large).best_fit_page_in_hole(stream, max_bytes, alone)?;
        st.hole_carriers.insert(page, ());
        Some((page, st.large.take(page, self.page_bytes)))
    }

    /// `page`, taken out of its region's free pages in `state`, becomes a carrier (or part of
    /// one: a page of the carriers' region joins the carriers beside it in the same reservation);
    /// `bytes` of it are handed out — from the free end of the carrier before it where `stream`
    /// may use that end and it is too short alone (the block spans the two pages), else from its
    /// start. Either way the block lies on the page, which is then not wholly free.
    fn carve(&self, st: &mut VmmState, page: u64, state: State, bytes: u64, stream: Stream) -> u64 {
        if !st.hole_carriers.is_empty() && st.hole_carriers.get(page).is_some() {
            st.small.add_extent_in(page, self.page_bytes, state);
            st.small.take(page, bytes);
            return page;
        }
        let tail = st.small.add_page_joined(page, state, &st.carriers);
        let start = match tail {
            Some((start, tail_bytes, tail_state))
                if tail_bytes < bytes && tail_state.usable_by(stream) =>
            {
                start
            }
            _ => page,
        };
        st.small.take(start, bytes);
        start
    }

    /// A page for a new carrier: one of the carriers' region, mapped, that `stream` may use,
    /// else one another stream freed there (after a GPU-side wait for its fence), else one of a
    /// small hole between large blocks, else one of the carriers' region mapped now; with the
    /// state it was in.
    fn new_carrier(&self, st: &mut VmmState, stream: Stream) -> Result<(u64, State)> {
        if let Some(page) = st.carriers.best_fit_page(stream) {
            return Ok((page, st.carriers.take(page, self.page_bytes)));
        }
        // A page another stream freed, once `stream` has waited for its fence on the GPU, before
        // a new one: with a stream per request, each would otherwise map a page of its own until
        // the GPU caught up. (Not during a capture: no fence is recorded then.)
        let freed_by_other = match self.capturing(st) {
            true => None,
            false => st.carriers.page_freed_by_other(stream),
        };
        if let Some((page, other, seq)) = freed_by_other {
            if self.wait_for_fence(st, stream, other, seq) {
                return Ok((page, st.carriers.take(page, self.page_bytes)));
            }
        }
        // Before the carriers' region grows: a page of a small hole between large blocks (one
        // that a fence completed since the fast path looked may serve now).
        if let Some(taken) = self.take_hole_page(st, stream) {
            return Ok(taken);
        }
        let page_bytes = self.page_bytes;
        let window = match st
            .carriers
            .window_aligned(page_bytes, stream, page_bytes, false)
        {
            Some(window) => window,
            None => {
                self.reserve(st, Region::Carriers, self.extent_bytes)?;
                st.carriers
                    .window_aligned(page_bytes, stream, page_bytes, false)
                    .ok_or_else(|| {
                        crate::Error::Internal(
                            "no page for small blocks in a new reservation".into(),
                        )
                    })?
            }
        };
        self.map_window(st, Region::Carriers, &window, page_bytes, stream, None)?;
        Ok((window.start, st.carriers.take(window.start, page_bytes)))
    }

    /// Gives a small block back inside its carrier; a carrier that is wholly free goes back to
    /// the free pages of its region.
    pub(super) fn give_small(
        &self,
        st: &mut VmmState,
        start: u64,
        bytes: u64,
        state: State,
        now_ms: u64,
    ) {
        let (merged_start, merged_bytes) = st.small.give(start, bytes, state);
        if merged_bytes >= self.page_bytes {
            self.return_free_pages(st, merged_start, now_ms);
        }
    }

    /// The whole pages of the free range of the small ranges that begins at `start` (if one
    /// does) leave their carriers and go back to the free pages of their region.
    pub(super) fn return_free_pages(&self, st: &mut VmmState, start: u64, now_ms: u64) {
        let (first, pages_bytes) = st.small.whole_free_pages(start);
        if pages_bytes == 0 {
            return;
        }
        let state = st.small.remove_pages(start, first, pages_bytes);
        // To the region they came from (a hole of the large blocks' ranges — a carrier of one
        // page, never joined — or their own).
        let from_hole = !st.hole_carriers.is_empty() && st.hole_carriers.remove(first).is_some();
        let region = if from_hole {
            Region::Large
        } else {
            Region::Carriers
        };
        st.region(region).give(first, pages_bytes, state);
        st.clock.mark(first, pages_bytes, now_ms);
    }

    /// A block of up to `slab_max_bytes` for `stream`: a free slot of its stream's open slab of
    /// its class, else the first slot of a new slab, placed as a small block is.
    pub(super) fn place_in_slab(
        &self,
        st: &mut VmmState,
        bytes: u64,
        stream: Stream,
    ) -> Result<u64> {
        if let Some(start) = st.slabs.take(bytes, stream) {
            return Ok(start);
        }
        let slab = self.place_small(st, slab_bytes(class_of(bytes)), stream)?;
        Ok(st.slabs.add(slab, bytes, stream))
    }

    /// [`VmmResource::place_in_slab`] without a driver call: a free slot, or a new slab cut
    /// from a carrier at hand.
    #[inline]
    pub(super) fn slot_at_hand(
        &self,
        st: &mut VmmState,
        bytes: u64,
        stream: Stream,
    ) -> Option<u64> {
        if let Some(start) = st.slabs.take(bytes, stream) {
            return Some(start);
        }
        let slab = self.carve_at_hand(st, slab_bytes(class_of(bytes)), stream)?;
        Some(st.slabs.add(slab, bytes, stream))
    }

    /// The slot at `start`, freed in `state`, goes back to its slab; a slab that emptied goes
    /// back to its carrier.
    pub(super) fn give_to_slab(&self, st: &mut VmmState, start: u64, state: State, now_ms: u64) {
        match st.slabs.give(start, state, now_ms) {
            Some(Some(emptied)) => self.give_emptied(st, emptied),
            Some(None) => {}
            // The live blocks checked the free: a slot no slab has, or one freed on another
            // stream than its slab's, breaks the resource's contract. The block is left out of
            // every range (kept, not handed out twice).
            None => log::error!(
                "device {}: {start:#x} is no slab's slot freed on its stream; its memory stays \
                 unused",
                self.device
            ),
        }
    }

    /// Every slab whose slots are all free goes back to its carrier (before a release, a trim
    /// or a growth looks at the ranges: a carrier it empties is an idle page, to give back or
    /// to back new memory with). True if one went.
    pub(super) fn return_empty_slabs(&self, st: &mut VmmState) -> bool {
        let emptied = st.slabs.take_empty();
        let any = !emptied.is_empty();
        for e in emptied {
            self.give_emptied(st, e);
        }
        any
    }

    /// An emptied slab goes back to its carrier: freed on its stream behind the latest fence its
    /// frees took, or ready if that fence has completed.
    fn give_emptied(&self, st: &mut VmmState, e: Emptied) {
        let state = match e.state {
            State::Freed { stream, seq } if !st.fences.outstanding(stream, seq) => State::Ready,
            s => s,
        };
        self.give_small(st, e.start, e.bytes, state, e.freed_ms);
    }
}

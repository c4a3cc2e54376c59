//! Small blocks of the virtual-memory resource: blocks up to `small_max_bytes` are carved out of
//! carriers — whole pages taken out of the address space's free ranges — best fit, split at 512
//! bytes, neighbours merged, so that they never split the ranges large blocks need.
//!
//! Invariants: a carrier is one page of the carriers' region of the address space (apart from
//! large blocks, so that it never splits a range they need), taken out of its free pages while
//! any block in it is live or waits for its fence, and given back (in the state of its one free
//! range) as soon as it is wholly free, so an idle carrier is an idle page like any other; the
//! same stream-ordering rules apply inside carriers as outside (`Freed` pieces serve their stream
//! at once, other streams after a GPU-side wait or their fence).

use super::ranges::State;
use super::{Region, VmmResource, VmmState};
use crate::driver::Stream;
use crate::error::Result;

impl VmmResource {
    /// A small block for `stream`: a fit in a carrier it may use, a mapped page it may use as a
    /// new carrier (both without a driver call: a loop whose carrier empties and fills again
    /// asks the GPU nothing), after updating the ranges, after a GPU-side wait, or in a carrier
    /// mapped now.
    pub(super) fn place_small(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Result<u64> {
        if let Some(start) = self.carve_at_hand(st, bytes, stream) {
            return Ok(start);
        }
        if let Some(start) = self.take_free(st, true, bytes, stream) {
            return Ok(start);
        }
        let (page, state) = self.new_carrier(st, stream)?;
        Ok(self.carve(st, page, state, bytes))
    }

    /// A small block `stream` may use at once, without a driver call: a fit in a carrier, or a
    /// mapped page made a carrier.
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
        let page = st.carriers.best_fit_page(stream)?;
        let state = st.carriers.take(page, self.page_bytes);
        Some(self.carve(st, page, state, bytes))
    }

    /// `page`, taken out of the carriers' region in `state`, becomes a carrier; its first
    /// `bytes` are handed out.
    fn carve(&self, st: &mut VmmState, page: u64, state: State, bytes: u64) -> u64 {
        st.small.add_extent_in(page, self.page_bytes, state);
        st.small.take(page, bytes);
        page
    }

    /// A page for a new carrier, taken out of the carriers' region: a mapped one `stream` may
    /// use, else one another stream freed (after a GPU-side wait for its fence), else one mapped
    /// now; with the state it was in.
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
    /// the large ranges.
    pub(super) fn give_small(
        &self,
        st: &mut VmmState,
        start: u64,
        bytes: u64,
        state: State,
        now_ms: u64,
    ) {
        let (merged_start, merged_bytes) = st.small.give(start, bytes, state);
        self.return_carrier_if_empty(st, merged_start, merged_bytes, now_ms);
    }

    /// If the free range `[start, start + bytes)` of the small ranges is a whole carrier, the
    /// carrier goes back to the large ranges.
    pub(super) fn return_carrier_if_empty(
        &self,
        st: &mut VmmState,
        start: u64,
        bytes: u64,
        now_ms: u64,
    ) {
        if !st.small.is_whole_extent(start, bytes) {
            return;
        }
        if let Some(state) = st.small.remove_extent_if_free(start) {
            st.carriers.give(start, bytes, state);
            self.mark_used(st, start, bytes, now_ms);
        }
    }
}

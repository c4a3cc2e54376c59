//! Free ranges page by page: the whole pages inside ready or freed ranges (for releases and
//! moves), page-level changes of state (a page retires, is unmapped, is blocked), and the page
//! arithmetic, counted from each extent's base.
//!
//! Invariant: a page is whole — `page_bytes` from a page boundary of its extent — and a page
//! changes state only inside one free range that holds it all.

use super::{FreeRanges, SizeIndex, State};
use crate::driver::Stream;

impl FreeRanges {
    /// Whole mapped pages that no work uses (inside `Ready` ranges), smallest holes first, none
    /// inside `[keep_start, keep_end)`.
    pub fn idle_pages(&self, keep_start: u64, keep_end: u64) -> Vec<u64> {
        self.whole_pages(self.ready_ranges(), keep_start, keep_end)
    }

    /// Every `Ready` range as `(start, end)`, the smallest first (then by address).
    pub fn ready_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (self.ready_by_size.iter()).map(|(bytes, start)| (start, start + bytes))
    }

    /// Whole pages inside ranges freed on `stream` (memory `stream` may use at once, but other
    /// streams' work may not have finished with), none inside `[keep_start, keep_end)`, smallest
    /// ranges first.
    pub fn freed_pages(&self, stream: Stream, keep_start: u64, keep_end: u64) -> Vec<u64> {
        let mine = self.freed_by_size.get(stream).into_iter();
        let ranges = mine
            .flat_map(SizeIndex::iter)
            .map(|(bytes, start)| (start, start + bytes));
        self.whole_pages(ranges, keep_start, keep_end)
    }

    /// The whole pages inside `ranges` (as `(start, end)`), in their order, none inside
    /// `[keep_start, keep_end)`.
    fn whole_pages(
        &self,
        ranges: impl Iterator<Item = (u64, u64)>,
        keep_start: u64,
        keep_end: u64,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        for (start, end) in ranges {
            let mut page = self.page_ceil(start);
            while page + self.page_bytes <= end {
                if page + self.page_bytes <= keep_start || keep_end <= page {
                    out.push(page);
                }
                page += self.page_bytes;
            }
        }
        out
    }

    /// The whole page at `page`, inside a mapped free range, now retires (its physical memory
    /// backs another address); the state it was in (ready, or freed on a stream with its fence).
    pub fn retire(&mut self, page: u64) -> State {
        let (_, r) = self.containing(page).expect("a page inside a free range");
        assert!(r.state.is_mapped_free(), "retiring {:?} memory", r.state);
        self.retag(page, r.state, State::Retiring);
        r.state
    }

    /// The whole page at `page` (inside a `Ready` range) is now unmapped.
    pub fn mark_unmapped(&mut self, page: u64) {
        self.retag(page, State::Ready, State::Unmapped);
    }

    /// The whole page at `page`, inside a range in state `from`, is now in state `to` (for the
    /// `Blocked` transitions; the others have names above).
    pub fn retag(&mut self, page: u64, from: State, to: State) {
        let (s, r) = self.containing(page).expect("a page inside a free range");
        debug_assert!(r.state == from && page + self.page_bytes <= s + r.bytes);
        self.remove(s, r);
        if s < page {
            self.put(s, page - s, from);
        }
        let end = page + self.page_bytes;
        if end < s + r.bytes {
            self.put(end, s + r.bytes - end, from);
        }
        self.merge_in(page, self.page_bytes, to);
    }

    pub(super) fn extent_base(&self, addr: u64) -> u64 {
        *self
            .extents
            .range(..=addr)
            .next_back()
            .expect("an address inside an extent")
            .0
    }

    pub(super) fn page_floor(&self, addr: u64) -> u64 {
        let base = self.extent_base(addr);
        base + (addr - base) / self.page_bytes * self.page_bytes
    }

    pub(super) fn page_ceil(&self, addr: u64) -> u64 {
        let floor = self.page_floor(addr);
        match floor == addr {
            true => addr,
            false => floor + self.page_bytes,
        }
    }

    /// Starts of the pages in `Blocked` ranges.
    pub fn blocked_pages(&self) -> Vec<u64> {
        let starts = self.starts();
        let blocked = starts
            .iter()
            .map(|s| (*s, self.at(*s)))
            .filter(|(_, r)| r.state == State::Blocked);
        blocked
            .flat_map(|(s, r)| (s..s + r.bytes).step_by(self.page_bytes as usize))
            .collect()
    }
}

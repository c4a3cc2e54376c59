//! Extents that grow and shrink a page at a time, for the carriers of small blocks: a page added
//! beside an extent joins it (its free memory merges with the extent's free range at that end, so
//! that a block may span the two pages), and whole free pages leave an extent, splitting it.
//!
//! Invariant: extents never overlap and each is whole pages; a page leaves only from inside one
//! free range, which keeps the rest of its bytes, in its state, on either side.

use super::{FreeRanges, State};

impl FreeRanges {
    /// A page at `page`, taken out of `region` free in `state`, joins the extent that ends at it
    /// and the one that begins after it where their pages beside it lie in the same extent of
    /// `region` (a reservation: no extent spans two), or begins an extent of its own; its memory
    /// merges with the free ranges beside it where their states allow. The free range that ended
    /// at `page` before, as (start, bytes, state), if the page joined the extent before it.
    pub fn add_page_joined(
        &mut self,
        page: u64,
        state: State,
        region: &FreeRanges,
    ) -> Option<(u64, u64, State)> {
        let bytes = self.page_bytes;
        let may_join = |next: u64| region.same_extent(page, next);
        let before = self.extents.range(..page).next_back();
        let (base, mut len) = match before.map(|(&b, &l)| (b, l)) {
            Some((base, len)) if base + len == page && may_join(page - bytes) => {
                (base, len + bytes)
            }
            _ => (page, bytes),
        };
        let after = self.extents.get(&(page + bytes)).copied();
        if let Some(after_bytes) = after.filter(|_| may_join(page + bytes)) {
            self.extents.remove(&(page + bytes));
            len += after_bytes;
        }
        self.insert_extent(base, len);
        let tail = match base < page {
            true => self.by_end.get(page).map(|&s| (s, self.at(s))),
            false => None,
        };
        self.give(page, bytes, state);
        tail.map(|(s, r)| (s, r.bytes, r.state))
    }

    /// The whole pages of the free range that begins at `start` (none if no range begins there),
    /// as (first page, bytes); (0, 0) if there are none.
    pub fn whole_free_pages(&self, start: u64) -> (u64, u64) {
        let Some(&r) = self.ranges.get(start) else {
            return (0, 0);
        };
        if r.bytes < self.page_bytes || !r.state.is_mapped_free() {
            return (0, 0);
        }
        let first = self.page_ceil(start);
        let end = start + r.bytes;
        let pages_bytes = end.saturating_sub(first) / self.page_bytes * self.page_bytes;
        match pages_bytes {
            0 => (0, 0),
            _ => (first, pages_bytes),
        }
    }

    /// True if `a` and `b` lie in one extent.
    pub fn same_extent(&self, a: u64, b: u64) -> bool {
        let (lo, hi) = (a.min(b), a.max(b));
        let extent = self.extents.range(..=lo).next_back();
        extent.is_some_and(|(&base, &len)| hi < base + len)
    }

    /// The whole pages `[first, first + bytes)`, inside the mapped free range that begins at
    /// `start`, leave their extent (split in two where they lay inside it); the rest of the range
    /// stays free in its state. The state the pages were in.
    pub fn remove_pages(&mut self, start: u64, first: u64, bytes: u64) -> State {
        let end = first + bytes;
        let r = self.at(start);
        debug_assert!(r.state.is_mapped_free() && start <= first && end <= start + r.bytes);
        self.order.forget();
        self.remove(start, r);
        if start < first {
            self.put(start, first - start, r.state);
        }
        if end < start + r.bytes {
            self.put(end, start + r.bytes - end, r.state);
        }
        let base = self.extent_base(first);
        let len = self.extents[&base];
        debug_assert!(end <= base + len);
        match base < first {
            true => self.insert_extent(base, first - base),
            false => {
                self.extents.remove(&base);
            }
        }
        if end < base + len {
            self.insert_extent(end, base + len - end);
        }
        r.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Stream;

    const PAGE: u64 = 2 << 20;
    const BASE: u64 = 0x1000_0000;
    const S1: Stream = Stream(1);

    /// The carriers' region: one reservation of eight pages from BASE.
    fn region() -> FreeRanges {
        let mut r = FreeRanges::new(PAGE);
        r.add_extent(BASE, 8 * PAGE);
        r
    }

    #[test]
    fn a_page_beside_a_carrier_joins_it_and_a_block_spans_the_two() {
        let mut r = FreeRanges::new(PAGE);
        assert_eq!(r.add_page_joined(BASE, State::Ready, &region()), None);
        r.take(BASE, PAGE / 2);
        let tail = r.add_page_joined(BASE + PAGE, State::Ready, &region());
        assert_eq!(tail, Some((BASE + PAGE / 2, PAGE / 2, State::Ready)));
        assert_eq!(r.extents().collect::<Vec<_>>(), [(BASE, 2 * PAGE)]);
        assert_eq!(
            r.snapshot(),
            [(BASE + PAGE / 2, PAGE + PAGE / 2, State::Ready)]
        );
        assert_eq!(
            r.best_fit(PAGE, S1),
            Some(BASE + PAGE / 2),
            "across the pages"
        );
        // A page before the first joins it too, and one between two carriers joins them.
        r.add_page_joined(BASE + 3 * PAGE, State::Ready, &region());
        r.add_page_joined(BASE + 2 * PAGE, State::Ready, &region());
        assert_eq!(r.extents().collect::<Vec<_>>(), [(BASE, 4 * PAGE)]);
    }

    #[test]
    fn a_carrier_outside_the_region_stays_apart() {
        // A page of another region (a hole of the large blocks' ranges) before the region's
        // first page: a carrier of its own.
        let mut r = FreeRanges::new(PAGE);
        r.add_extent_in(BASE - PAGE, PAGE, State::Ready);
        let tail = r.add_page_joined(BASE, State::Ready, &region());
        assert_eq!(tail, None, "it joined nothing before it");
        assert_eq!(
            r.extents().collect::<Vec<_>>(),
            [(BASE - PAGE, PAGE), (BASE, PAGE)]
        );
        assert_eq!(
            r.best_fit(PAGE + 512, S1),
            None,
            "no range across the regions"
        );
    }

    #[test]
    fn two_reservations_side_by_side_are_two_extents() {
        // The carriers' region: two reservations that happen to be adjacent.
        let mut region = FreeRanges::new(PAGE);
        region.add_extent(BASE, 2 * PAGE);
        region.add_extent(BASE + 2 * PAGE, 2 * PAGE);
        assert!(region.same_extent(BASE, BASE + PAGE));
        assert!(!region.same_extent(BASE + PAGE, BASE + 2 * PAGE));
        assert!(!region.same_extent(BASE - PAGE, BASE), "before the first");
        let mut small = FreeRanges::new(PAGE);
        for page in [BASE + PAGE, BASE + 2 * PAGE] {
            small.add_page_joined(page, State::Ready, &region);
        }
        assert_eq!(
            small.extents().collect::<Vec<_>>(),
            [(BASE + PAGE, PAGE), (BASE + 2 * PAGE, PAGE)]
        );
        // Within a reservation they join.
        small.add_page_joined(BASE, State::Ready, &region);
        assert_eq!(
            small.extents().collect::<Vec<_>>(),
            [(BASE, 2 * PAGE), (BASE + 2 * PAGE, PAGE)]
        );
    }

    #[test]
    fn a_page_beside_memory_in_another_state_joins_the_extent_not_the_range() {
        let freed = State::Freed { stream: S1, seq: 4 };
        let mut r = FreeRanges::new(PAGE);
        r.add_page_joined(BASE, State::Ready, &region());
        r.take(BASE, PAGE);
        r.give(BASE + PAGE / 2, PAGE / 2, freed);
        let tail = r.add_page_joined(BASE + PAGE, State::Ready, &region());
        assert_eq!(tail, Some((BASE + PAGE / 2, PAGE / 2, freed)));
        assert_eq!(
            r.snapshot(),
            [
                (BASE + PAGE / 2, PAGE / 2, freed),
                (BASE + PAGE, PAGE, State::Ready)
            ]
        );
        // A block over both takes the later fence's state.
        assert_eq!(r.take(BASE + PAGE / 2, PAGE), freed);
        assert_eq!(
            r.snapshot(),
            [(BASE + PAGE + PAGE / 2, PAGE / 2, State::Ready)]
        );
    }

    #[test]
    fn whole_free_pages_leave_their_carrier_which_splits_around_them() {
        let mut r = FreeRanges::new(PAGE);
        for i in 0..3 {
            r.add_page_joined(BASE + i * PAGE, State::Ready, &region());
        }
        r.take(BASE, PAGE / 2);
        r.take(BASE + 2 * PAGE + PAGE / 2, PAGE / 2);
        assert_eq!(r.whole_free_pages(BASE + PAGE / 2), (BASE + PAGE, PAGE));
        assert_eq!(
            r.whole_free_pages(BASE + PAGE),
            (0, 0),
            "no range starts there"
        );
        assert_eq!(
            r.remove_pages(BASE + PAGE / 2, BASE + PAGE, PAGE),
            State::Ready
        );
        assert_eq!(
            r.extents().collect::<Vec<_>>(),
            [(BASE, PAGE), (BASE + 2 * PAGE, PAGE)]
        );
        assert_eq!(
            r.snapshot(),
            [
                (BASE + PAGE / 2, PAGE / 2, State::Ready),
                (BASE + 2 * PAGE, PAGE / 2, State::Ready)
            ]
        );
        // The rest of each carrier no longer merges across the gap.
        r.give(BASE, PAGE / 2, State::Ready);
        assert_eq!(r.whole_free_pages(BASE), (BASE, PAGE));
    }
}

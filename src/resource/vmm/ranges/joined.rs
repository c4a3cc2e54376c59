//! Extents that grow and shrink a page at a time, for the carriers of small blocks: a page added
//! beside an extent joins it (its free memory merges with the extent's free range at that end, so
//! that a block may span the two pages), and whole free pages leave an extent, splitting it.
//!
//! Invariant: extents never overlap and each is whole pages; a page leaves only from inside one
//! free range, which keeps the rest of its bytes, in its state, on either side.

use super::{FreeRanges, State};
use crate::driver::Stream;

impl FreeRanges {
    /// A page at `page`, free in `state`, joins the extent that ends at it and the one that
    /// begins after it (or begins an extent of its own); its memory merges with the free ranges
    /// beside it where their states allow. A `Ready` page after memory freed on `stream` (the
    /// stream it is taken for) is given in that memory's state, as memory freed on a stream takes
    /// ready neighbours in, so that `stream` sees the two as one free range. Extents whose base
    /// fails `may_join` stay apart.
    pub fn add_page_joined(
        &mut self,
        page: u64,
        state: State,
        stream: Stream,
        may_join: impl Fn(u64) -> bool,
    ) {
        let bytes = self.page_bytes;
        let before = self
            .extents
            .range(..page)
            .next_back()
            .map(|(&b, &l)| (b, l));
        match before {
            Some((base, len)) if base + len == page && may_join(base) => {
                self.extents.insert(base, len + bytes);
            }
            _ => {
                self.extents.insert(page, bytes);
                let bits = self.base_align | page;
                self.base_align = bits & bits.wrapping_neg();
            }
        }
        let after = self.extents.get(&(page + bytes)).copied();
        if let Some(after_bytes) = after.filter(|_| may_join(page + bytes)) {
            self.extents.remove(&(page + bytes));
            let base = self.extent_base(page);
            *self.extents.get_mut(&base).expect("the page's extent") += after_bytes;
        }
        let left = self.left_neighbour(page).map(|(_, r)| r.state);
        let state = match left {
            Some(freed @ State::Freed { stream: s, .. })
                if s == stream && state == State::Ready =>
            {
                freed
            }
            _ => state,
        };
        self.give(page, bytes, state);
    }

    /// The whole pages inside `[start, start + bytes)` that no block uses: those of the free
    /// range holding that span which lie wholly inside it, as (first page, bytes); (0, 0) if none.
    pub fn whole_free_pages(&self, start: u64, bytes: u64) -> (u64, u64) {
        let Some(&r) = self.ranges.get(start) else {
            return (0, 0);
        };
        if r.bytes < bytes || !r.state.is_mapped_free() {
            return (0, 0);
        }
        let first = self.page_ceil(start);
        let end = start + bytes;
        let pages_bytes = end.saturating_sub(first) / self.page_bytes * self.page_bytes;
        match pages_bytes {
            0 => (0, 0),
            _ => (first, pages_bytes),
        }
    }

    /// The whole pages `[first, first + bytes)`, inside one mapped free range, leave their
    /// extent (split in two where they lay inside it); the rest of the range stays free in its
    /// state. The state the pages were in.
    pub fn remove_pages(&mut self, first: u64, bytes: u64) -> State {
        let end = first + bytes;
        let (s, r) = self.containing(first).expect("pages inside a free range");
        debug_assert!(r.state.is_mapped_free() && end <= s + r.bytes);
        self.order.forget();
        self.remove(s, r);
        if s < first {
            self.put(s, first - s, r.state);
        }
        if end < s + r.bytes {
            self.put(end, s + r.bytes - end, r.state);
        }
        let base = self.extent_base(first);
        let len = self.extents[&base];
        debug_assert!(end <= base + len);
        match base < first {
            true => {
                self.extents.insert(base, first - base);
            }
            false => {
                self.extents.remove(&base);
            }
        }
        if end < base + len {
            self.extents.insert(end, base + len - end);
            let bits = self.base_align | end;
            self.base_align = bits & bits.wrapping_neg();
        }
        r.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;
    const BASE: u64 = 0x1000_0000;
    const S1: Stream = Stream(1);

    fn any(_: u64) -> bool {
        true
    }

    #[test]
    fn a_page_beside_a_carrier_joins_it_and_a_block_spans_the_two() {
        let mut r = FreeRanges::new(PAGE);
        r.add_page_joined(BASE, State::Ready, S1, any);
        r.take(BASE, PAGE / 2);
        r.add_page_joined(BASE + PAGE, State::Ready, S1, any);
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
        r.add_page_joined(BASE + 3 * PAGE, State::Ready, S1, any);
        r.add_page_joined(BASE + 2 * PAGE, State::Ready, S1, any);
        assert_eq!(r.extents().collect::<Vec<_>>(), [(BASE, 4 * PAGE)]);
    }

    #[test]
    fn a_carrier_whose_base_may_not_join_stays_apart() {
        let mut r = FreeRanges::new(PAGE);
        r.add_page_joined(BASE, State::Ready, S1, any);
        r.add_page_joined(BASE + 2 * PAGE, State::Ready, S1, any);
        r.add_page_joined(BASE + PAGE, State::Ready, S1, |base| base != BASE);
        assert_eq!(
            r.extents().collect::<Vec<_>>(),
            [(BASE, PAGE), (BASE + PAGE, 2 * PAGE)]
        );
        assert_eq!(
            r.best_fit(2 * PAGE + 512, S1),
            None,
            "no range across BASE's end"
        );
    }

    #[test]
    fn a_ready_page_beside_memory_freed_on_a_stream_joins_in_its_state() {
        let freed = State::Freed { stream: S1, seq: 4 };
        let mut r = FreeRanges::new(PAGE);
        r.add_page_joined(BASE, State::Ready, S1, any);
        r.take(BASE, PAGE);
        r.give(BASE + PAGE / 2, PAGE / 2, freed);
        let mut other = FreeRanges::new(PAGE);
        other.add_page_joined(BASE, State::Ready, S1, any);
        other.take(BASE, PAGE);
        other.give(BASE + PAGE / 2, PAGE / 2, freed);
        r.add_page_joined(BASE + PAGE, State::Ready, S1, any);
        assert_eq!(r.snapshot(), [(BASE + PAGE / 2, PAGE + PAGE / 2, freed)]);
        // Taken for another stream, the page stays ready, apart (that stream may use it).
        other.add_page_joined(BASE + PAGE, State::Ready, Stream(2), any);
        assert_eq!(
            other.snapshot(),
            [
                (BASE + PAGE / 2, PAGE / 2, freed),
                (BASE + PAGE, PAGE, State::Ready)
            ]
        );
    }

    #[test]
    fn whole_free_pages_leave_their_carrier_which_splits_around_them() {
        let mut r = FreeRanges::new(PAGE);
        for i in 0..3 {
            r.add_page_joined(BASE + i * PAGE, State::Ready, S1, any);
        }
        r.take(BASE, PAGE / 2);
        r.take(BASE + 2 * PAGE + PAGE / 2, PAGE / 2);
        let free = (BASE + PAGE / 2, 2 * PAGE);
        assert_eq!(r.whole_free_pages(free.0, free.1), (BASE + PAGE, PAGE));
        assert_eq!(
            r.whole_free_pages(BASE + PAGE, PAGE),
            (0, 0),
            "no range starts there"
        );
        assert_eq!(r.remove_pages(BASE + PAGE, PAGE), State::Ready);
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
        assert_eq!(r.whole_free_pages(BASE, PAGE), (BASE, PAGE));
    }
}

//! When each page was last used, kept flat per address reservation: a free marks the pages under
//! its block with one slice fill, not a walk of the page map (the walk was 4-6% of vmm's
//! instructions per timed allocation in the replays of vision_sizes, bert and GPT-2).
//!
//! A page's last use is the later of this clock's mark and the time its `Page` was made
//! ([`super::VmmState::last_used_ms`]): a page mapped now is used now, whatever an earlier block
//! at its address left here.
//!
//! Invariants: each reservation of the resource is an extent here, from its reservation to the
//! resource's end, with an entry for each page up to the highest marked (pages counted from the
//! reservation's base, which need not be a multiple of the page); a mark never decreases an entry
//! (the clock only moves on); an address outside every extent is never marked, and reads as never
//! used.

/// The last use of every page of the resource's reservations, in milliseconds of the driver's
/// clock (0: never marked).
#[derive(Debug, Default)]
pub(super) struct PageClock {
    page_bytes: u64,
    /// In no particular order: there are few (one per reservation).
    extents: Vec<Extent>,
}

/// One reservation's marks: entries up to the highest page ever marked (a reservation is twice
/// the device's memory, and only pages that back blocks are marked).
#[derive(Debug)]
struct Extent {
    base: u64,
    bytes: u64,
    used: Vec<u64>,
}

impl PageClock {
    pub fn new(page_bytes: u64) -> PageClock {
        PageClock {
            page_bytes,
            extents: Vec::new(),
        }
    }

    /// A new reservation of `bytes` (whole pages) at `base`, never used.
    pub fn add_extent(&mut self, base: u64, bytes: u64) {
        self.extents.push(Extent {
            base,
            bytes,
            used: Vec::new(),
        });
    }

    /// The extent holding `addr`, and `addr`'s offset from its base.
    #[inline]
    fn locate(&self, addr: u64) -> Option<(usize, u64)> {
        self.extents.iter().enumerate().find_map(|(i, e)| {
            let offset = addr.checked_sub(e.base)?;
            (offset < e.bytes).then_some((i, offset))
        })
    }

    /// The pages `[start, start + bytes)` overlaps (inside one extent; pages counted from its
    /// base) were used at `now_ms`.
    #[inline]
    pub fn mark(&mut self, start: u64, bytes: u64, now_ms: u64) {
        if bytes == 0 {
            return;
        }
        let Some((i, offset)) = self.locate(start) else {
            debug_assert!(false, "{start:#x} is in no reservation");
            return;
        };
        let extent = &mut self.extents[i];
        let first = (offset / self.page_bytes) as usize;
        let end = offset.saturating_add(bytes - 1).min(extent.bytes - 1);
        let last = (end / self.page_bytes) as usize;
        if extent.used.len() <= last {
            extent.used.resize(last + 1, 0);
        }
        for entry in &mut extent.used[first..=last] {
            *entry = (*entry).max(now_ms);
        }
    }

    /// When the page at `page` was last marked (0: never).
    #[inline]
    pub fn get(&self, page: u64) -> u64 {
        self.extent_of(page).mark(page)
    }

    /// The marks of the extent holding `addr`, for a walk over many of its pages: a page's mark
    /// is `marks.mark(page)`, as [`PageClock::get`] reads it.
    pub fn extent_of(&self, addr: u64) -> Marks<'_> {
        let extent = self.locate(addr).map(|(i, _)| &self.extents[i]);
        Marks {
            page_bytes: self.page_bytes,
            extent: extent.map(|e| (e.base, &e.used[..])),
        }
    }
}

/// One extent's marks ([`PageClock::extent_of`]).
pub(super) struct Marks<'c> {
    page_bytes: u64,
    extent: Option<(u64, &'c [u64])>,
}

impl Marks<'_> {
    /// The mark of the page at `page` (0 outside the extent).
    #[inline]
    pub fn mark(&self, page: u64) -> u64 {
        let Some((base, used)) = self.extent else {
            return 0;
        };
        let at = page
            .checked_sub(base)
            .map(|offset| offset / self.page_bytes);
        at.and_then(|at| used.get(at as usize))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    #[test]
    fn a_mark_covers_every_page_its_block_overlaps_and_no_other() {
        let mut c = PageClock::new(PAGE);
        c.add_extent(100 * PAGE, 8 * PAGE);
        c.add_extent(10 * PAGE, 4 * PAGE);
        // From the middle of page 101 to one byte into page 103.
        c.mark(101 * PAGE + 512, 2 * PAGE - 511, 7);
        let marks: Vec<u64> = (100..108).map(|p| c.get(p * PAGE)).collect();
        assert_eq!(marks, [0, 7, 7, 7, 0, 0, 0, 0]);
        c.mark(10 * PAGE, PAGE, 9);
        assert_eq!(
            (c.get(10 * PAGE), c.get(11 * PAGE)),
            (9, 0),
            "the other extent"
        );
        let marks = c.extent_of(102 * PAGE);
        let walked: Vec<u64> = (99..109).map(|p| marks.mark(p * PAGE)).collect();
        assert_eq!(
            walked,
            [0, 0, 7, 7, 7, 0, 0, 0, 0, 0],
            "one extent's walk, as get reads it"
        );
        assert_eq!(c.extent_of(10 * PAGE).mark(10 * PAGE), 9);
        assert_eq!(
            c.extent_of(99 * PAGE).mark(99 * PAGE),
            0,
            "outside every extent"
        );
        assert_eq!(c.get(99 * PAGE), 0, "outside every extent");
        assert_eq!(c.get(108 * PAGE), 0, "past the first extent's end");
        c.mark(104 * PAGE, PAGE, 5);
        assert_eq!(
            (c.get(104 * PAGE), c.get(105 * PAGE)),
            (5, 0),
            "a whole page, no more"
        );
    }

    /// Pages are counted from their reservation's base, which need not be a multiple of the
    /// page: a block across two pages marks both, a page-long block at a page marks one.
    #[test]
    fn pages_are_counted_from_the_reservations_base() {
        const BIG: u64 = 4 * PAGE;
        let mut c = PageClock::new(BIG);
        let base = PAGE; // 2 MiB: aligned to the granularity, not to the page
        c.add_extent(base, 4 * BIG);
        c.mark(base + BIG - PAGE, 2 * PAGE, 3); // the end of page 0, the start of page 1
        assert_eq!(
            [c.get(base), c.get(base + BIG), c.get(base + 2 * BIG)],
            [3, 3, 0]
        );
        c.mark(base + 2 * BIG, BIG, 4);
        assert_eq!([c.get(base + 2 * BIG), c.get(base + 3 * BIG)], [4, 0]);
        c.mark(base, 0, 9);
        assert_eq!(c.get(base), 3, "an empty block marks nothing");
    }

    /// A reservation costs nothing until its pages are marked (the simulator's largest device
    /// reserves 2^42 pages).
    #[test]
    fn a_huge_reservation_holds_only_its_marked_pages() {
        let mut c = PageClock::new(PAGE);
        c.add_extent(PAGE, 1 << 63);
        c.mark(PAGE + 3 * PAGE, PAGE, 5);
        assert_eq!(c.get(PAGE + 3 * PAGE), 5);
        assert_eq!(c.get(PAGE + (1 << 62)), 0);
        assert_eq!(c.extents[0].used.len(), 4);
    }

    #[test]
    fn a_mark_never_moves_a_page_back_and_stops_at_its_extents_end() {
        let mut c = PageClock::new(PAGE);
        c.add_extent(0, 2 * PAGE);
        c.mark(PAGE, PAGE, 20);
        c.mark(0, 2 * PAGE, 10);
        assert_eq!((c.get(0), c.get(PAGE)), (10, 20));
        c.mark(PAGE, 5 * PAGE, 30);
        assert_eq!(c.get(PAGE), 30);
    }
}

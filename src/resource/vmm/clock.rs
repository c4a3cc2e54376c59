//! When each page was last used, kept flat per address reservation: a free marks the pages under
//! its block with one slice fill, not a walk of the page map (the walk was 4-6% of vmm's
//! instructions per timed allocation in the replays of vision_sizes, bert and GPT-2).
//!
//! A page's last use is the later of this clock's mark and the time its `Page` was made
//! ([`super::VmmState::last_used_ms`]): a page mapped now is used now, whatever an earlier block
//! at its address left here.
//!
//! Invariants: each reservation of the resource is an extent here, with one entry per page, from
//! its reservation to the resource's end; a mark never decreases an entry (the clock only moves
//! on); an address outside every extent is never marked, and reads as never used.

/// The last use of every page of the resource's reservations, in milliseconds of the driver's
/// clock (0: never marked).
#[derive(Debug, Default)]
pub(super) struct PageClock {
    page_bytes: u64,
    /// (base, the last use of each page from the base on), in no particular order: there are
    /// few (one per reservation).
    extents: Vec<(u64, Vec<u64>)>,
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
        let pages = (bytes / self.page_bytes) as usize;
        self.extents.push((base, vec![0; pages]));
    }

    /// The extent holding `addr`, and its page's index there.
    #[inline]
    fn locate(&self, addr: u64) -> Option<(usize, usize)> {
        self.extents
            .iter()
            .enumerate()
            .find_map(|(i, (base, used))| {
                let page = addr.checked_sub(*base)? / self.page_bytes;
                ((page as usize) < used.len()).then_some((i, page as usize))
            })
    }

    /// The pages `[start, start + bytes)` overlaps (`bytes` > 0, inside one extent) were used at
    /// `now_ms`.
    #[inline]
    pub fn mark(&mut self, start: u64, bytes: u64, now_ms: u64) {
        let Some((i, first)) = self.locate(start) else {
            debug_assert!(false, "{start:#x} is in no reservation");
            return;
        };
        let used = &mut self.extents[i].1;
        let last = (first + ((start % self.page_bytes + bytes - 1) / self.page_bytes) as usize)
            .min(used.len() - 1);
        for entry in &mut used[first..=last] {
            *entry = (*entry).max(now_ms);
        }
    }

    /// When the page at `page` was last marked (0: never).
    #[inline]
    pub fn get(&self, page: u64) -> u64 {
        self.locate(page).map_or(0, |(i, at)| self.extents[i].1[at])
    }

    /// The marks of the extent holding `addr`, for a walk over many of its pages: a page's mark
    /// is `marks.mark(page)`, as [`PageClock::get`] reads it.
    pub fn extent_of(&self, addr: u64) -> Marks<'_> {
        let extent = self.locate(addr).map(|(i, _)| &self.extents[i]);
        Marks {
            page_bytes: self.page_bytes,
            extent: extent.map(|(base, used)| (*base, &used[..])),
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

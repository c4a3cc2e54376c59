//! The free ranges' starts in address order, for the paths that walk or search the ranges by
//! address (windows, the range a page lies in, a block spanning several ranges). The
//! allocation fast path (a best fit taken at a range's start, a free merged with the ranges
//! that end and begin where it does) finds its neighbours by hash and never needs the order, so
//! it drops it; the next path that needs it sorts the starts again, and keeps them sorted while
//! it changes the ranges.
//!
//! Invariant: while valid, `starts` holds exactly the starts of the free ranges, ascending.

use std::cell::{Cell, Ref, RefCell};

#[derive(Debug, Default)]
pub(super) struct AddressOrder {
    starts: RefCell<Vec<u64>>,
    valid: Cell<bool>,
}

impl AddressOrder {
    /// The fast path changed the ranges without keeping the order: sorted again when needed.
    #[inline]
    pub fn forget(&self) {
        self.valid.set(false);
    }

    /// A range begins at `start` now.
    #[inline]
    pub fn inserted(&self, start: u64) {
        if self.valid.get() {
            let mut starts = self.starts.borrow_mut();
            let at = starts.partition_point(|&s| s < start);
            starts.insert(at, start);
        }
    }

    /// No range begins at `start` any more.
    #[inline]
    pub fn removed(&self, start: u64) {
        if self.valid.get() {
            let mut starts = self.starts.borrow_mut();
            if let Ok(at) = starts.binary_search(&start) {
                starts.remove(at);
            }
        }
    }

    /// The starts in address order, sorted again from `all` (every range's start) if the order
    /// was dropped. The caller releases it before changing the ranges.
    pub fn get(&self, all: impl Iterator<Item = u64>) -> Ref<'_, Vec<u64>> {
        if !self.valid.get() {
            let mut starts = self.starts.borrow_mut();
            starts.clear();
            starts.extend(all);
            starts.sort_unstable();
            self.valid.set(true);
        }
        self.starts.borrow()
    }
}

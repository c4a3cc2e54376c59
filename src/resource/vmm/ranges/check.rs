//! The free ranges' invariants, checked whole (for tests: a randomised test runs it after every
//! step).

use super::{FreeRanges, State};

impl FreeRanges {
    /// Every invariant of the module's notes that its tables can show: extents apart, each range
    /// inside one extent, ranges apart and merged where their states merge, every table and
    /// index naming the same ranges, every extent's base a multiple of `base_align`.
    pub fn check_invariants(&self) -> Result<(), String> {
        let extents: Vec<(u64, u64)> = self.extents().collect();
        if let Some(w) = extents.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(format!("extents overlap: {w:x?}"));
        }
        if let Some((b, _)) =
            (extents.iter()).find(|(b, _)| self.base_align != 0 && b % self.base_align != 0)
        {
            return Err(format!(
                "extent {b:#x} is no multiple of {:#x}",
                self.base_align
            ));
        }
        let ranges = self.snapshot();
        let (mut ready, mut freed) = (0, 0);
        for &(start, bytes, state) in &ranges {
            let extent = extents.iter().rev().find(|(b, _)| *b <= start);
            if extent.is_none_or(|&(b, l)| start + bytes > b + l) {
                return Err(format!(
                    "{start:#x}+{bytes:#x} lies outside one extent ({extent:x?})"
                ));
            }
            if self.by_end.get(start + bytes) != Some(&start) {
                return Err(format!("{start:#x}+{bytes:#x} has no end entry"));
            }
            let indexed = match state {
                State::Ready => {
                    ready += 1;
                    self.ready_by_size.iter().any(|e| e == (bytes, start))
                }
                State::Freed { stream, .. } => {
                    freed += 1;
                    (self.freed_by_size.get(stream))
                        .is_some_and(|f| f.iter().any(|e| e == (bytes, start)))
                }
                State::Unmapped | State::Blocked | State::Retiring => true,
            };
            if !indexed {
                return Err(format!(
                    "{start:#x}+{bytes:#x} ({state:?}) is not in its size index"
                ));
            }
        }
        for w in ranges.windows(2) {
            let ((s0, b0, st0), (s1, _, st1)) = (w[0], w[1]);
            if s0 + b0 > s1 {
                return Err(format!("ranges at {s0:#x} and {s1:#x} overlap"));
            }
            if s0 + b0 == s1 && !self.extents.contains_key(&s1) && st0.merges_with(st1).is_some() {
                return Err(format!("{st0:?} and {st1:?} apart at {s1:#x}"));
            }
        }
        let counts = (self.ranges.iter().count(), self.by_end.iter().count());
        let indexed_freed: usize = self.freed_by_size.values().map(|f| f.iter().count()).sum();
        if counts != (ranges.len(), ranges.len())
            || self.ready_by_size.iter().count() != ready
            || indexed_freed != freed
        {
            return Err("the tables and indexes hold other ranges than the ranges".into());
        }
        Ok(())
    }
}

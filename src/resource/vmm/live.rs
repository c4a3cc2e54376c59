//! The resource's live blocks, to check each free against: a map, and beside it the block handed
//! out last, so that a loop that allocates and frees one block at a time touches no map.
//!
//! Beside them, the marks of each live block that has any: its tag ([`crate::tag`]), and how many
//! exports of its pages to other processes are not released yet ([`super::export`]).
//!
//! Invariant: every live block is in exactly one of the two places, with its size; a free that
//! names no live block, or a live block with another size, changes nothing; a block has a marks
//! entry only while it is live, and only if it was allocated under a tag or an export of it began
//! (so that the table is empty, and costs a length check a free, while neither is used); an
//! export mark names one block for its life, never a later one at its address.

use crate::fasthash::{WordMap, WordTable};
use crate::resource::ExportMark;
use crate::tag::TagId;

#[derive(Default)]
pub(super) struct Live {
    /// Every live block but the last: start -> bytes (a start is never 0).
    blocks: WordTable<u64>,
    /// The block handed out last: (start, bytes).
    last: Option<(u64, u64)>,
    /// The marks of the live blocks that have any, by start.
    marks: WordMap<u64, Marks>,
    /// The export mark the next block exported for the first time gets (from 1).
    next_export_mark: u64,
}

/// What is known of a live block beyond its size.
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    /// Allocated under this tag.
    tag: Option<TagId>,
    /// Exports of its pages to other processes not released yet.
    exports: u32,
    /// Which block these exports are of (an [`ExportMark`]; 0 before its first export).
    export_mark: u64,
}

/// Why a free was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// No live block starts there.
    Unknown,
    /// The live block there has this size.
    Size(u64),
}

impl Live {
    /// `[start, start + bytes)` is live, allocated under `tag`.
    #[inline]
    pub fn insert(&mut self, start: u64, bytes: u64, tag: Option<TagId>) {
        if let Some((s, b)) = self.last.replace((start, bytes)) {
            self.blocks.insert(s, b);
        }
        if let Some(tag) = tag {
            let tag = Some(tag);
            let marks = Marks {
                tag,
                ..Marks::default()
            };
            self.marks.insert(start, marks);
        }
    }

    /// Every live block, as (start, bytes), in no particular order.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.last
            .into_iter()
            .chain(self.blocks.iter().map(|(s, &b)| (s, b)))
    }

    /// The tag of the live block at `start`, if it was allocated under one.
    pub fn tag(&self, start: u64) -> Option<TagId> {
        self.marks.get(&start).and_then(|m| m.tag)
    }

    /// The mark that names the live block at `start` (the caller checked that it is live) to
    /// [`Live::mark_exported`] and [`Live::unmark_exported`]: given at its first export.
    pub fn export_mark(&mut self, start: u64) -> ExportMark {
        let marks = self.marks.entry(start).or_default();
        if marks.export_mark == 0 {
            self.next_export_mark += 1;
            marks.export_mark = self.next_export_mark;
        }
        ExportMark(marks.export_mark)
    }

    /// One more export of the live block at `start` that `mark` names; false, counting nothing,
    /// if the block `mark` named was freed (another block, or none, lies there now).
    pub fn mark_exported(&mut self, start: u64, mark: ExportMark) -> bool {
        match self.marks.get_mut(&start) {
            Some(marks) if marks.export_mark == mark.0 => {
                marks.exports = marks.exports.saturating_add(1);
                true
            }
            _ => false,
        }
    }

    /// An export `mark`ed on the live block at `start` was released (nothing if that block is
    /// gone: another block there has another mark, or none).
    pub fn unmark_exported(&mut self, start: u64, mark: ExportMark) {
        if let Some(marks) = self.marks.get_mut(&start) {
            if marks.export_mark == mark.0 {
                marks.exports = marks.exports.saturating_sub(1);
            }
        }
    }

    /// Every live block with an export not released yet, as (start, bytes).
    pub fn exported(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let starts = self.marks.iter().filter(|(_, m)| m.exports > 0);
        starts.filter_map(|(&start, _)| self.bytes(start).map(|bytes| (start, bytes)))
    }

    /// The size of the live block at `start`.
    fn bytes(&self, start: u64) -> Option<u64> {
        match self.last {
            Some((s, b)) if s == start => Some(b),
            _ => self.blocks.get(start).copied(),
        }
    }

    /// Forgets the marks of the block at `start`, freed.
    #[inline]
    fn untag(&mut self, start: u64) {
        if !self.marks.is_empty() {
            self.marks.remove(&start);
        }
    }

    /// True if `[start, start + bytes)` is a live block.
    pub fn contains(&self, start: u64, bytes: u64) -> bool {
        match self.last {
            Some((s, b)) if s == start => b == bytes,
            _ => self.blocks.get(start) == Some(&bytes),
        }
    }

    /// The live block at `start`, of `bytes`, is freed.
    #[inline]
    pub fn remove(&mut self, start: u64, bytes: u64) -> Result<(), Refused> {
        match self.last {
            Some((s, b)) if s == start => match b == bytes {
                true => {
                    self.last = None;
                    self.untag(start);
                    Ok(())
                }
                false => Err(Refused::Size(b)),
            },
            _ => match self.blocks.get(start) {
                Some(&b) if b == bytes => {
                    self.blocks.remove(start);
                    self.untag(start);
                    Ok(())
                }
                Some(&b) => Err(Refused::Size(b)),
                None => Err(Refused::Unknown),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_block_and_the_map_check_frees_alike() {
        let mut live = Live::default();
        live.insert(8, 10, None);
        live.insert(100, 20, None); // 8 moves to the map, 100 is the last
        for (start, bytes, refused) in [
            (100, 21, Refused::Size(20)),
            (8, 11, Refused::Size(10)),
            (50, 10, Refused::Unknown),
        ] {
            assert_eq!(live.remove(start, bytes), Err(refused));
        }
        assert_eq!(live.remove(100, 20), Ok(()));
        assert_eq!(live.remove(100, 20), Err(Refused::Unknown), "freed twice");
        assert_eq!(live.remove(8, 10), Ok(()));
        assert_eq!(live.remove(8, 10), Err(Refused::Unknown));
    }
}

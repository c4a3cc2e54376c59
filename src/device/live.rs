//! The live blocks of a device, by address: a [`WordTable`], and beside it the block handed out
//! last, so that a loop that allocates and frees one block at a time touches no table (the
//! vmm resource keeps its own live blocks the same way).
//!
//! Invariant: every live block is in exactly one of the two places; an address is live at most
//! once — an insert of a live address replaces its record wherever it is and hands back the old
//! one; NULL is never a key (its record is handed back, nothing changed).

use crate::driver::Stream;
use crate::fasthash::WordTable;
use crate::resource::SourceId;

/// A live block's record: plain data, five words, so that the live table copies it in and out.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct LiveBlock {
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub stream: Stream,
    pub source: SourceId,
    /// How many other streams used the block (record_stream).
    pub other_streams: u32,
    /// The first of them; if there are more, the ledger's `more_streams` lists them all.
    pub first_other_stream: Stream,
}

/// A block taken off the live list ([`super::ledger::Ledger::remove_live`]).
pub(super) struct Removed {
    pub live: LiveBlock,
    /// Every other stream that used it, if there were more than one (else the record names the
    /// one, if any).
    pub all_other_streams: Option<Vec<Stream>>,
}

impl Removed {
    /// The other streams that used the block, oldest first: `one` holds the record's only one.
    pub fn other_streams<'a>(&'a self, one: &'a mut [Stream; 1]) -> &'a [Stream] {
        match (&self.all_other_streams, self.live.other_streams) {
            (Some(all), _) => all,
            (None, 0) => &[],
            (None, _) => {
                one[0] = self.live.first_other_stream;
                one
            }
        }
    }
}

/// The key of no block: `last_ptr` when no block is kept beside the table.
const NONE: u64 = 0;

#[derive(Default)]
pub(super) struct LiveBlocks {
    /// The address of the block handed out last, if it is still live and not in the table
    /// ([`NONE`] otherwise).
    last_ptr: u64,
    /// Its record (meaningless while `last_ptr` is [`NONE`]).
    last: LiveBlock,
    table: WordTable<LiveBlock>,
}

impl LiveBlocks {
    /// `ptr` is live with `block`; the record it replaces, if `ptr` was live already (or `block`
    /// itself for NULL, which is never a key).
    #[inline(always)]
    pub fn insert(&mut self, ptr: u64, block: LiveBlock) -> Option<LiveBlock> {
        if ptr == self.last_ptr || ptr == NONE {
            return Some(match ptr {
                NONE => block,
                _ => std::mem::replace(&mut self.last, block),
            });
        }
        // (An address in the table is live already: a bug below, which the caller reports.)
        let replaced = match self.table.is_empty() {
            true => None,
            false => self.table.remove(ptr),
        };
        if self.last_ptr != NONE {
            // Not in the table: every live block is in one place only.
            self.table.insert(self.last_ptr, self.last);
        }
        self.last_ptr = ptr;
        self.last = block;
        replaced
    }

    /// Takes `ptr`'s record out, if it is live.
    #[inline(always)]
    pub fn remove(&mut self, ptr: u64) -> Option<LiveBlock> {
        if ptr == self.last_ptr && ptr != NONE {
            self.last_ptr = NONE;
            return Some(self.last);
        }
        self.table.remove(ptr)
    }

    pub fn get(&self, ptr: u64) -> Option<&LiveBlock> {
        match ptr == self.last_ptr && ptr != NONE {
            true => Some(&self.last),
            false => self.table.get(ptr),
        }
    }

    pub fn get_mut(&mut self, ptr: u64) -> Option<&mut LiveBlock> {
        match ptr == self.last_ptr && ptr != NONE {
            true => Some(&mut self.last),
            false => self.table.get_mut(ptr),
        }
    }

    /// Every live block, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &LiveBlock)> + '_ {
        let last = (self.last_ptr != NONE).then_some((self.last_ptr, &self.last));
        last.into_iter().chain(self.table.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(requested_bytes: u64) -> LiveBlock {
        LiveBlock {
            requested_bytes,
            ..LiveBlock::default()
        }
    }

    #[test]
    fn the_last_block_and_the_table_hold_each_block_once() {
        let mut live = LiveBlocks::default();
        assert!(live.insert(0x1000, block(1)).is_none());
        assert!(live.insert(0x2000, block(2)).is_none()); // 0x1000 moves to the table
        assert_eq!(live.iter().count(), 2);
        // A live address handed out again is reported, wherever its record is, and kept once.
        assert_eq!(
            live.insert(0x1000, block(3)).map(|b| b.requested_bytes),
            Some(1)
        );
        assert_eq!(
            live.insert(0x1000, block(4)).map(|b| b.requested_bytes),
            Some(3)
        );
        assert_eq!(live.iter().count(), 2);
        assert_eq!(live.get(0x2000).map(|b| b.requested_bytes), Some(2));
        live.get_mut(0x1000).expect("live").other_streams = 1;
        assert_eq!(live.remove(0x1000).map(|b| b.other_streams), Some(1));
        assert!(live.remove(0x1000).is_none(), "freed twice");
        assert_eq!(live.remove(0x2000).map(|b| b.requested_bytes), Some(2));
        assert!(live.remove(0x2000).is_none());
        assert_eq!(live.iter().count(), 0);
        // NULL is never live.
        assert!(live.remove(0).is_none() && live.get(0).is_none());
        assert_eq!(live.insert(0, block(5)).map(|b| b.requested_bytes), Some(5));
        assert_eq!(live.iter().count(), 0);
    }
}

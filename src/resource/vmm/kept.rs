//! The blocks freed last, kept aside: at most [`KEPT_BLOCKS`], each handed out again at once to
//! the next request of its stream and exact size (the newest first), and given back to the ranges
//! when [`KEPT_BLOCKS`] more frees have come after it, or when the resource needs the memory.
//!
//! A free fills the ring's next entry; the block there before (the oldest kept, unless a reuse
//! took it) goes back. An entry whose block went back early keeps its size, so that a request of
//! that size tells a reuse the ring would have served from one it would not: where fewer than a
//! quarter of the recent requests found their size among the recent frees (blocks of random
//! sizes), keeping them only holds memory out of the ranges ([`Kept::cold`]): the caller keeps
//! only the block freed last, and gives it back at a miss, so that it serves the next request of
//! any size that fits it, as one slot did.
//!
//! Invariants: a block is here at most once and is neither live nor in any range; every kept
//! block was freed on one stream, `stream` (the caller gives them back before it keeps one of
//! another: a program with a stream per request would otherwise keep each request's blocks from
//! the next, where given back they serve it after a GPU-side wait); an entry's block is kept if
//! and only if its bit of `kept` is set, and its size is [`EMPTY`] once its block was reused;
//! every size in `sizes` other than [`EMPTY`] has its bit in `recent`; while `cold`, at most one
//! block is kept; a lookup moves the share once a request (the same size asked for again, with
//! no free between, is the same request, looked up again on the device's slow path).

use crate::driver::Stream;

/// Blocks kept at most. Replays of vision_sizes, BERT and ResNet-50 counted 5-25% fewer
/// instructions an allocation with 8 than with the last block alone; 16 made BERT's replay move
/// twice the pages (777 mapped against 401).
pub(super) const KEPT_BLOCKS: usize = 8;
const _: () = assert!(KEPT_BLOCKS < 32, "one bit of `Kept::kept` an entry");
/// The size of an entry whose block was reused (no block has it: sizes are those of blocks
/// handed out).
const EMPTY: u64 = u64::MAX;
/// The share of requests, out of 256, that found their size among the recent frees: a moving
/// average over about the last 16 lookups. Below [`KEEP_RATE`], blocks go back at each miss.
const RATE_SHIFT: u32 = 4;
const KEEP_RATE: u32 = 64;

/// A freed block: where, how large, the stream it was freed on, the fence number its free took,
/// and when (the driver's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Freed {
    pub start: u64,
    pub bytes: u64,
    pub stream: Stream,
    pub seq: u64,
    pub freed_ms: u64,
}

/// Where a kept block starts, its fence, when it was freed.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    start: u64,
    seq: u64,
    freed_ms: u64,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    Kept(Freed),
    /// None kept; the kept blocks should stay (requests often reuse the sizes of recent frees).
    Keep,
    /// None kept; the kept blocks should go back (requests seldom reuse them).
    GiveBack,
}

#[derive(Debug, Clone)]
pub(super) struct Kept {
    /// The size of each entry's block, apart from the rest: a lookup reads one cache line.
    /// Filled in turn: the entry at `next` is the oldest.
    sizes: [u64; KEPT_BLOCKS],
    entries: [Entry; KEPT_BLOCKS],
    /// Bit `i`: entry `i`'s block is kept.
    kept: u32,
    next: usize,
    /// The stream of every kept block (meaningless while none is kept).
    stream: Stream,
    rate: u32,
    /// A bit for each size freed since the ring last came round (`recent[0]`) and in the round
    /// before (`recent[1]`): a superset of the sizes in `sizes`.
    recent: [u64; 2],
    /// The size of the last lookup, if it missed and nothing was kept since ([`EMPTY`] if not).
    missed: u64,
}

/// A size's bit in `Kept::recent`.
#[inline(always)]
fn size_bit(bytes: u64) -> u64 {
    1 << (bytes.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58)
}

impl Default for Kept {
    fn default() -> Kept {
        Kept {
            sizes: [EMPTY; KEPT_BLOCKS],
            entries: [Entry::default(); KEPT_BLOCKS],
            kept: 0,
            next: 0,
            stream: Stream(0),
            rate: 0,
            recent: [0; 2],
            missed: EMPTY,
        }
    }
}

impl Kept {
    /// True if blocks freed on a stream other than `stream` are kept.
    #[inline(always)]
    pub fn holds_other_than(&self, stream: Stream) -> bool {
        self.kept != 0 && self.stream != stream
    }

    /// The newest kept block of `bytes`, taken out; the caller has given back the blocks of any
    /// other stream ([`Kept::holds_other_than`]), so it is one freed on the caller's stream.
    /// Without one, whether the others should stay.
    #[inline]
    pub fn take(&mut self, bytes: u64) -> Found {
        // The size that missed last, asked for again with no free between: the same request
        // (the device's fast path, then its slow path), which must not move the share twice.
        if bytes == self.missed {
            return self.miss(bytes);
        }
        // A loop that frees and allocates one block finds it in the newest entry.
        let newest = (self.next + KEPT_BLOCKS - 1) % KEPT_BLOCKS;
        if self.sizes[newest] == bytes && self.kept & (1 << newest) != 0 {
            self.rate += (256 - self.rate) >> RATE_SHIFT;
            self.sizes[newest] = EMPTY;
            self.kept &= !(1 << newest);
            self.missed = EMPTY;
            return Found::Kept(self.freed(newest, bytes));
        }
        self.rate -= self.rate >> RATE_SHIFT;
        // Sizes none of the last frees had are told from their bits without reading the ring.
        if (self.recent[0] | self.recent[1]) & size_bit(bytes) == 0 {
            return self.miss(bytes);
        }
        let mut same = 0u32;
        for (i, &size) in self.sizes.iter().enumerate() {
            same |= u32::from(size == bytes) << i;
        }
        // The newest entry of that size: the highest bit of the ring's order.
        let Some(i) = self.newest(same) else {
            return self.miss(bytes);
        };
        // Found among the recent frees: kept, or given back early (reused, it would have been).
        self.rate += 256 >> RATE_SHIFT;
        self.sizes[i] = EMPTY;
        if self.kept & (1 << i) == 0 {
            return self.miss(bytes);
        }
        self.kept &= !(1 << i);
        self.missed = EMPTY;
        Found::Kept(self.freed(i, bytes))
    }

    /// `entries` (a bit an entry) in the ring's order, the oldest (at `next`) in bit 0.
    #[inline(always)]
    fn in_order(&self, entries: u32) -> u32 {
        let all = (1u32 << KEPT_BLOCKS) - 1;
        ((entries >> self.next) | (entries << (KEPT_BLOCKS - self.next))) & all
    }

    /// The newest of `entries`, if any.
    #[inline(always)]
    fn newest(&self, entries: u32) -> Option<usize> {
        let ordered = self.in_order(entries);
        let back = ordered.checked_ilog2()? as usize;
        Some((self.next + back) % KEPT_BLOCKS)
    }

    /// A lookup of `bytes` found no kept block.
    fn miss(&mut self, bytes: u64) -> Found {
        self.missed = bytes;
        match self.cold() {
            false => Found::Keep,
            true => Found::GiveBack,
        }
    }

    /// Requests seldom find their size among the recent frees: only the block freed last stays
    /// (the caller gives the others back before it keeps one), as one slot would.
    #[inline(always)]
    pub fn cold(&self) -> bool {
        self.rate < KEEP_RATE
    }

    fn freed(&self, i: usize, bytes: u64) -> Freed {
        let Entry {
            start,
            seq,
            freed_ms,
        } = self.entries[i];
        Freed {
            start,
            bytes,
            stream: self.stream,
            seq,
            freed_ms,
        }
    }

    /// Keeps `slot`, whose stream must be that of every kept block ([`Kept::holds_other_than`]);
    /// the block it displaces, which goes back to its ranges, if any.
    #[inline]
    pub fn keep(&mut self, slot: Freed) -> Option<Freed> {
        debug_assert!(
            !self.holds_other_than(slot.stream),
            "kept blocks of two streams"
        );
        debug_assert_ne!(slot.bytes, EMPTY);
        let i = self.next;
        let out = (self.kept & (1 << i) != 0).then(|| self.freed(i, self.sizes[i]));
        self.sizes[i] = slot.bytes;
        self.entries[i] = Entry {
            start: slot.start,
            seq: slot.seq,
            freed_ms: slot.freed_ms,
        };
        self.kept |= 1 << i;
        self.missed = EMPTY;
        self.stream = slot.stream;
        self.next = (i + 1) % KEPT_BLOCKS;
        self.recent[0] |= size_bit(slot.bytes);
        if self.next == 0 {
            self.recent = [0, self.recent[0]];
        }
        out
    }

    /// The oldest kept block, taken out (its size stays, as a recent free's).
    #[inline]
    pub fn take_oldest(&mut self) -> Option<Freed> {
        if self.kept == 0 {
            return None;
        }
        let ordered = self.in_order(self.kept);
        let i = (self.next + ordered.trailing_zeros() as usize) % KEPT_BLOCKS;
        self.kept &= !(1 << i);
        Some(self.freed(i, self.sizes[i]))
    }
}

#[cfg(test)]
mod tests;

//! Size classes for the smallest blocks of the virtual-memory resource: a block of up to
//! [`SLAB_MAX_BYTES`] is a slot of a slab — a piece of a carrier ([`super::small`]) cut into equal
//! slots of one class, kept per stream and class — so that handing one out or taking it back is a
//! bit in a mask, not a search and a merge in the free ranges.
//!
//! Invariants: a slab belongs to one stream and one class (a stream has as many slabs of a class
//! as its live blocks of it fill); its slots are handed out to that stream only and taken back
//! only from frees on it (the allocation stream, as `Resource::deallocate` has it), so a slot
//! freed there is reusable at once (the rules of [`crate::stream_order`] hold as they do for any
//! block freed and reused on its stream); every slot's start names its slab in `slot_owner` for
//! as long as the slab exists; a slab with a free slot is in its stream and class's open list (at
//! `open_at`), a full one is in none; a slab that empties while another slab of its stream and
//! class is open, or while [`KEPT_EMPTY`] empty slabs are kept already (`kept_empty` counts
//! them), is given back whole — to the carrier it was cut from, freed on its stream behind the
//! latest fence its frees took — and the ones kept are given back by [`Slabs::take_empty`] before
//! a release, a trim, a sleep or a growth looks at the ranges.

use super::ranges::State;
use crate::driver::Stream;
use crate::fasthash::{WordMap, WordTable};

/// The largest block served from a slab.
pub(super) const SLAB_MAX_BYTES: u64 = 16 << 10;
/// A slab's bytes at most (a class's slab is a whole number of its slots, and at most
/// [`MAX_SLOTS`] of them).
pub(super) const SLAB_BYTES: u64 = 64 << 10;
/// Slots of a slab at most: its free slots are the bits of one `u128`.
const MAX_SLOTS: u64 = 128;
/// Classes up to 4 KiB: every multiple of 512 bytes.
const FINE_CLASSES: usize = 8;
const FINE_STEP_BYTES: u64 = 512;
/// Classes above 4 KiB: four per doubling (a block takes at most 25% more than it asks for).
const PER_DOUBLING: usize = 4;
/// Empty slabs kept at most, over every stream and class (a program with a stream per request
/// keeps no slab per stream it used once).
const KEPT_EMPTY: usize = 16;
/// Every class: 512 B, 1 KiB, ..., 4 KiB, then 5, 6, 7, 8, 10, 12, 14 and 16 KiB.
pub(super) const CLASSES: usize = FINE_CLASSES + 2 * PER_DOUBLING;

/// The class of a block of `bytes` (at most [`SLAB_MAX_BYTES`]; 0 is served as 1).
#[inline]
pub(super) fn class_of(bytes: u64) -> usize {
    let b = bytes.max(1) - 1;
    let fine_max = FINE_CLASSES as u64 * FINE_STEP_BYTES;
    if b < fine_max {
        return (b / FINE_STEP_BYTES) as usize;
    }
    // b in [2^p, 2^(p+1)): four classes of 2^(p-2) bytes each, past the first four quarters.
    let p = 63 - b.leading_zeros() as u64;
    let quarter = b >> (p - 2);
    FINE_CLASSES
        + (p - fine_max.trailing_zeros() as u64) as usize * PER_DOUBLING
        + (quarter - PER_DOUBLING as u64) as usize
}

/// The bytes of a slot of `class`.
#[inline]
pub(super) fn class_bytes(class: usize) -> u64 {
    if class < FINE_CLASSES {
        return (class as u64 + 1) * FINE_STEP_BYTES;
    }
    let k = class - FINE_CLASSES;
    let fine_max = FINE_CLASSES as u64 * FINE_STEP_BYTES;
    let step = fine_max << (k / PER_DOUBLING) >> 2;
    (PER_DOUBLING + k % PER_DOUBLING + 1) as u64 * step
}

/// The slots of a slab of `class`.
#[inline]
fn slots_of(class: usize) -> u64 {
    (SLAB_BYTES / class_bytes(class)).min(MAX_SLOTS)
}

/// The bytes of a slab of `class` (all its slots).
#[inline]
pub(super) fn slab_bytes(class: usize) -> u64 {
    slots_of(class) * class_bytes(class)
}

/// A mask with the low `slots` bits set.
#[inline]
fn all_free(slots: u64) -> u128 {
    match slots {
        128 => u128::MAX,
        s => (1u128 << s) - 1,
    }
}

#[derive(Debug, Clone, Copy)]
struct Slab {
    start: u64,
    stream: Stream,
    class: u8,
    /// Its class's bytes, and the mask of all its slots (kept here: worked out once, not at
    /// every slot handed out or taken back).
    slot_bytes: u64,
    all: u128,
    /// Bit i set: slot i is free.
    free: u128,
    /// Its place in its open list, if it has a free slot.
    open_at: Option<u32>,
    /// What its frees left it in: freed on its stream behind the latest fence they took
    /// (joined, [`State::joined`]), or ready.
    state: State,
    /// When a slot of it was last freed (the driver's clock).
    freed_ms: u64,
}

/// A slab given back whole: where, how large, its stream, its state and when it was last freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Emptied {
    pub start: u64,
    pub bytes: u64,
    pub stream: Stream,
    pub state: State,
    pub freed_ms: u64,
}

#[derive(Default)]
pub(super) struct Slabs {
    /// Every slab, by id; a given-back slab's id is reused.
    slabs: Vec<Slab>,
    spare_ids: Vec<u32>,
    /// Every slot's start -> its slab's id.
    slot_owner: WordTable<u32>,
    /// The slabs with a free slot, per stream and class; the last one serves first.
    open: WordMap<Stream, [Vec<u32>; CLASSES]>,
    /// Open slabs whose slots are all free.
    kept_empty: usize,
}

impl Slabs {
    /// A free slot of a slab of `stream` for a block of `bytes`, taken.
    #[inline]
    pub fn take(&mut self, bytes: u64, stream: Stream) -> Option<u64> {
        let class = class_of(bytes);
        let &id = self.open.get(&stream)?[class].last()?;
        Some(self.take_from(id))
    }

    /// A free slot of slab `id`, taken; a slab left full leaves its open list (it is last).
    #[inline]
    fn take_from(&mut self, id: u32) -> u64 {
        let slab = &mut self.slabs[id as usize];
        if slab.free == slab.all {
            self.kept_empty -= 1;
        }
        let i = slab.free.trailing_zeros() as u64;
        slab.free &= !(1u128 << i);
        let start = slab.start + i * slab.slot_bytes;
        if slab.free == 0 {
            let (stream, class) = (slab.stream, slab.class as usize);
            slab.open_at = None;
            if let Some(lists) = self.open.get_mut(&stream) {
                lists[class].pop();
            }
        }
        start
    }

    /// `[start, start + slab_bytes(class_of(bytes)))`, cut from a carrier for `stream`, is a new
    /// slab; its first slot is handed out (its start).
    pub fn add(&mut self, start: u64, bytes: u64, stream: Stream) -> u64 {
        let class = class_of(bytes);
        let slots = slots_of(class);
        let slab = Slab {
            start,
            stream,
            class: class as u8,
            slot_bytes: class_bytes(class),
            all: all_free(slots),
            free: all_free(slots) & !1,
            open_at: None,
            state: State::Ready,
            freed_ms: 0,
        };
        let id = match self.spare_ids.pop() {
            Some(id) => {
                self.slabs[id as usize] = slab;
                id
            }
            None => {
                self.slabs.push(slab);
                (self.slabs.len() - 1) as u32
            }
        };
        for i in 0..slots {
            self.slot_owner.insert(start + i * class_bytes(class), id);
        }
        if slots > 1 {
            self.push_open(id);
        }
        start
    }

    /// Puts slab `id` last in its open list.
    fn push_open(&mut self, id: u32) {
        let (stream, class) = {
            let slab = &self.slabs[id as usize];
            (slab.stream, slab.class as usize)
        };
        let list = &mut self.open.entry(stream).or_default()[class];
        self.slabs[id as usize].open_at = Some(list.len() as u32);
        list.push(id);
    }

    /// The slot at `start` is free again, its free in `state` at `now_ms`; its slab, if that left
    /// it empty beside another open slab of its stream and class (or more empty slabs are kept
    /// than [`KEPT_EMPTY`]), is given back whole. `None` for a start no live slot has, or a free
    /// on another stream than the slab's (nothing changes).
    #[inline]
    pub fn give(&mut self, start: u64, state: State, now_ms: u64) -> Option<Option<Emptied>> {
        let id = *self.slot_owner.get(start)?;
        let slab = &mut self.slabs[id as usize];
        let bit = 1u128 << ((start - slab.start) / slab.slot_bytes);
        if slab.free & bit != 0 {
            return None; // (free already: the live blocks refuse a second free before this)
        }
        if matches!(state, State::Freed { stream, .. } if stream != slab.stream) {
            // Freed on another stream than its allocation's (the resource's callers never do:
            // `Resource::deallocate`): reused at once by its slab's stream, the slot could be
            // overwritten under that stream's work, so it is refused.
            return None;
        }
        slab.free |= bit;
        slab.state = slab.state.joined(state).unwrap_or(state);
        slab.freed_ms = now_ms;
        let (free, all, open_at) = (slab.free, slab.all, slab.open_at);
        if open_at.is_none() {
            self.push_open(id);
            return Some(None);
        }
        if free != all {
            return Some(None);
        }
        let (stream, class) = (slab.stream, slab.class as usize);
        let open = self.open.get(&stream).map_or(0, |lists| lists[class].len());
        if open > 1 || self.kept_empty >= KEPT_EMPTY {
            return Some(Some(self.remove(id)));
        }
        self.kept_empty += 1;
        Some(None)
    }

    /// Gives back every slab whose slots are all free.
    pub fn take_empty(&mut self) -> Vec<Emptied> {
        let empty: Vec<u32> = (0..self.slabs.len() as u32)
            .filter(|&id| {
                let slab = &self.slabs[id as usize];
                slab.open_at.is_some() && slab.free == slab.all
            })
            .collect();
        self.kept_empty = 0;
        empty.into_iter().map(|id| self.remove(id)).collect()
    }

    /// Slab `id` (open, every slot free) leaves its open list and the owners' table.
    fn remove(&mut self, id: u32) -> Emptied {
        let slab = self.slabs[id as usize];
        let class = slab.class as usize;
        if let (Some(at), Some(lists)) = (slab.open_at, self.open.get_mut(&slab.stream)) {
            let list = &mut lists[class];
            list.swap_remove(at as usize);
            if let Some(&moved) = list.get(at as usize) {
                self.slabs[moved as usize].open_at = Some(at);
            }
            if lists.iter().all(Vec::is_empty) {
                self.open.remove(&slab.stream);
            }
        }
        for i in 0..u64::from(slab.all.count_ones()) {
            self.slot_owner.remove(slab.start + i * slab.slot_bytes);
        }
        self.slabs[id as usize].open_at = None;
        self.spare_ids.push(id);
        Emptied {
            start: slab.start,
            bytes: slab_bytes(class),
            stream: slab.stream,
            state: slab.state,
            freed_ms: slab.freed_ms,
        }
    }
}

#[cfg(test)]
mod tests;

//! Tiny hashing for pointer and stream keys on the hot path: a hasher for std's maps
//! ([`WordMap`]), and a table of its own for the live blocks of a device ([`WordTable`]).
//!
//! Invariants: keys are machine words whose low bits are often zero (512-byte aligned pointers),
//! so both hashes take their bits from a multiplication that carries every key bit upward
//! (the hasher folds the high half into the low bits that std's tables index with; the table
//! indexes with the top bits). A [`WordTable`] is at most half full and has no tombstones: a
//! key's entry lies between its home slot and the next empty slot, so a lookup stops there.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct WordHasher(u64);

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for WordHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(MULTIPLIER);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub type WordMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// The key of an empty slot: no entry has it ([`WordTable::insert`] refuses it).
const EMPTY: u64 = 0;
/// Slots of a table's first allocation.
const MIN_SLOTS: usize = 16;

#[derive(Default)]
struct Slot<V> {
    /// [`EMPTY`] for a free slot (whose value means nothing: what a removal left, or the default).
    key: u64,
    value: V,
}

/// A map from non-zero words (device pointers) to plain values (`Copy`: copied in and out, never
/// dropped), cheaper than a [`WordMap`] where one entry is added and one removed per allocation: open addressing, linear probing in a
/// power-of-two table kept at most half full (a lookup probes about 1.5 slots), Fibonacci
/// hashing, and removal by moving later entries of the run back (no tombstones, so the table
/// needs no rebuild however many entries come and go). It never shrinks, like std's maps.
pub struct WordTable<V> {
    /// Empty, or a power of two of slots.
    slots: Vec<Slot<V>>,
    /// Entries.
    len: usize,
    /// `slots.len() - 1` (0 when empty).
    mask: usize,
    /// 64 - log2(`slots.len()`): the hash's top bits index the table (63 when empty).
    shift: u32,
}

impl<V> std::fmt::Debug for WordTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WordTable({} entries)", self.len)
    }
}

impl<V: Copy + Default> Default for WordTable<V> {
    fn default() -> Self {
        WordTable {
            slots: Vec::new(),
            len: 0,
            mask: 0,
            shift: 63,
        }
    }
}

impl<V: Copy + Default> WordTable<V> {
    /// The slot a key's run starts at.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(MULTIPLIER) >> self.shift) as usize & self.mask
    }

    /// The slot holding `key`, if any.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = self.home(key);
        loop {
            // `get` fails only on the empty table: `i` is masked to its length.
            let k = self.slots.get(i)?.key;
            if k == EMPTY {
                return None;
            }
            if k == key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Its entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it holds no entry.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value under `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        let i = self.find(key)?;
        Some(&self.slots[i].value)
    }

    /// The value under `key`, to change in place.
    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let i = self.find(key)?;
        Some(&mut self.slots[i].value)
    }

    /// Puts `value` under `key`; the value it replaces, if any. [`EMPTY`] (NULL) is never a key:
    /// its value is handed back, the table unchanged.
    #[inline(always)]
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        debug_assert_ne!(key, EMPTY, "NULL is not a key of a WordTable");
        if key == EMPTY {
            return Some(value);
        }
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(key);
        loop {
            let slot = &mut self.slots[i];
            if slot.key == EMPTY {
                *slot = Slot { key, value };
                self.len += 1;
                return None;
            }
            if slot.key == key {
                return Some(std::mem::replace(&mut slot.value, value));
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Takes `key`'s entry out; later entries of its run move back into the gap, each only
    /// towards its home slot, so every entry stays between its home and the next empty slot.
    #[inline(always)]
    pub fn remove(&mut self, key: u64) -> Option<V> {
        let mut gap = self.find(key)?;
        let value = self.slots[gap].value;
        let mut j = gap;
        loop {
            j = (j + 1) & self.mask;
            let k = self.slots[j].key;
            if k == EMPTY {
                break;
            }
            // The entry at `j` may fill the gap if the gap lies between its home and `j`.
            let home = self.home(k);
            if j.wrapping_sub(home) & self.mask >= j.wrapping_sub(gap) & self.mask {
                self.slots.swap(gap, j);
                gap = j;
            }
        }
        self.slots[gap].key = EMPTY;
        self.len -= 1;
        Some(value)
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, &s.value))
    }

    /// Doubles the slots (or makes the first ones) and puts every entry back.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let slots = (2 * self.slots.len()).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, Vec::with_capacity(slots));
        self.slots.resize_with(slots, Slot::default);
        self.mask = slots - 1;
        self.shift = 64 - slots.trailing_zeros();
        self.len = 0;
        for slot in old.into_iter().filter(|s| s.key != EMPTY) {
            self.insert(slot.key, slot.value);
        }
    }
}

#[cfg(test)]
mod tests;

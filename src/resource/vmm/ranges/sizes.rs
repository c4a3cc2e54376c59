//! Free ranges by size, for best fit: one bin per size class (four classes per power of two),
//! each sorted by (size, start), and a bitmap of the bins that hold any. The smallest range of at
//! least a size is in its class's bin or first in the next bin the bitmap names: the answer a set
//! ordered by (size, start) gives, without walking a tree (segregated fit, as TLSF and mimalloc
//! keep their free blocks, but exact).
//!
//! A bin is a sorted vector; one that grows past [`TREE_ABOVE`] entries (many free ranges of
//! nearly one size) becomes a tree, and a vector again below [`VECTOR_BELOW`], so that no insert
//! moves more than a few kilobytes.
//!
//! Invariants: an entry (bytes, start) lies in the bin of `class(bytes)`; classes grow with
//! size, so bins in class order, each in (size, start) order, list every entry in (size, start)
//! order; a bin's bit is set if and only if the bin holds an entry; `len` counts the entries.

use std::collections::BTreeSet;

/// Classes: four per power of two up to 2^63 (`class` is below 256).
const BINS: usize = 256;
const TREE_ABOVE: usize = 256;
const VECTOR_BELOW: usize = 64;

/// Free ranges as (bytes, start), in (bytes, start) order.
#[derive(Debug, Default)]
pub(crate) struct SizeIndex {
    /// Grown to the highest class used.
    bins: Vec<Bin>,
    nonempty: [u64; BINS / 64],
    len: usize,
}

#[derive(Debug)]
enum Bin {
    Sorted(Vec<(u64, u64)>),
    Tree(BTreeSet<(u64, u64)>),
}

impl Default for Bin {
    fn default() -> Bin {
        Bin::Sorted(Vec::new())
    }
}

/// The class of a size: 0-3 for 0-3 bytes, then four classes per power of two (the top bit's
/// position and the two bits below it); never smaller for a larger size.
#[inline]
fn class(bytes: u64) -> usize {
    if bytes < 4 {
        return bytes as usize;
    }
    let top = 63 - bytes.leading_zeros() as usize;
    4 * (top - 1) + ((bytes >> (top - 2)) & 3) as usize
}

impl Bin {
    fn len(&self) -> usize {
        match self {
            Bin::Sorted(v) => v.len(),
            Bin::Tree(t) => t.len(),
        }
    }

    /// Adds `entry`; false if it was there already (a set's answer).
    fn insert(&mut self, entry: (u64, u64)) -> bool {
        match self {
            Bin::Sorted(v) => match v.binary_search(&entry) {
                Ok(_) => false,
                Err(_) if v.len() >= TREE_ABOVE => {
                    let mut tree: BTreeSet<(u64, u64)> = v.drain(..).collect();
                    tree.insert(entry);
                    *self = Bin::Tree(tree);
                    true
                }
                Err(at) => {
                    v.insert(at, entry);
                    true
                }
            },
            Bin::Tree(t) => t.insert(entry),
        }
    }

    fn remove(&mut self, entry: (u64, u64)) -> bool {
        match self {
            Bin::Sorted(v) => match v.binary_search(&entry) {
                Ok(at) => {
                    v.remove(at);
                    true
                }
                Err(_) => false,
            },
            Bin::Tree(t) => {
                let removed = t.remove(&entry);
                if t.len() < VECTOR_BELOW {
                    *self = Bin::Sorted(std::mem::take(t).into_iter().collect());
                }
                removed
            }
        }
    }

    /// The first entry of at least `bytes`.
    fn first_at_least(&self, bytes: u64) -> Option<(u64, u64)> {
        match self {
            Bin::Sorted(v) => v.get(v.partition_point(|&(b, _)| b < bytes)).copied(),
            Bin::Tree(t) => t.range((bytes, 0)..).next().copied(),
        }
    }

    /// The entries of at least `bytes`, in order.
    fn from(&self, bytes: u64) -> BinIter<'_> {
        match self {
            Bin::Sorted(v) => BinIter::Sorted(v[v.partition_point(|&(b, _)| b < bytes)..].iter()),
            Bin::Tree(t) => BinIter::Tree(t.range((bytes, 0)..)),
        }
    }
}

/// A bin's entries from a size on, in order.
enum BinIter<'a> {
    Sorted(std::slice::Iter<'a, (u64, u64)>),
    Tree(std::collections::btree_set::Range<'a, (u64, u64)>),
}

impl Iterator for BinIter<'_> {
    type Item = (u64, u64);

    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        match self {
            BinIter::Sorted(i) => i.next().copied(),
            BinIter::Tree(i) => i.next().copied(),
        }
    }
}

impl SizeIndex {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds (bytes, start); false if it was there already (nothing changes then).
    pub fn insert(&mut self, bytes: u64, start: u64) -> bool {
        let c = class(bytes);
        if self.bins.len() <= c {
            self.bins.resize_with(c + 1, Bin::default);
        }
        if !self.bins[c].insert((bytes, start)) {
            return false;
        }
        self.nonempty[c / 64] |= 1 << (c % 64);
        self.len += 1;
        true
    }

    /// Removes (bytes, start); false if it was not there.
    pub fn remove(&mut self, bytes: u64, start: u64) -> bool {
        let c = class(bytes);
        let Some(bin) = self.bins.get_mut(c) else {
            return false;
        };
        if !bin.remove((bytes, start)) {
            return false;
        }
        if bin.len() == 0 {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        true
    }

    /// The smallest entry of at least `bytes` (the lowest start among equals).
    #[inline]
    pub fn first_at_least(&self, bytes: u64) -> Option<(u64, u64)> {
        let c = class(bytes);
        if let Some(found) = self.bins.get(c).and_then(|bin| bin.first_at_least(bytes)) {
            return Some(found);
        }
        let next = self.next_nonempty(c + 1)?;
        self.bins[next].first_at_least(0)
    }

    /// The first class at or after `c` whose bin holds an entry.
    fn next_nonempty(&self, c: usize) -> Option<usize> {
        let mut word = c / 64;
        if word >= self.nonempty.len() {
            return None;
        }
        let mut bits = self.nonempty[word] & (u64::MAX << (c % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.nonempty.get(word)?;
        }
    }

    /// Every entry of at least `bytes`, in (bytes, start) order. Only the bins the bitmap names
    /// are visited: walking every bin up to the largest class cost multistream's replay 29% of
    /// the allocator's instructions (a stream's few freed ranges, listed at each completed fence).
    pub fn iter_from(&self, bytes: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let c = class(bytes);
        let classes = std::iter::successors(self.next_nonempty(c), |&i| self.next_nonempty(i + 1));
        classes.flat_map(move |i| self.bins[i].from(if i == c { bytes } else { 0 }))
    }

    /// Every entry, in (bytes, start) order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.iter_from(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_never_shrink_as_sizes_grow() {
        let mut last = 0;
        let sizes = (0..4096u64).chain((12..64).flat_map(|p| {
            let top = 1u64 << p;
            [
                top - 1,
                top,
                top + 1,
                top + top / 4,
                top + top / 2,
                top + top / 4 * 3,
            ]
        }));
        let mut sizes: Vec<u64> = sizes.chain([u64::MAX]).collect();
        sizes.sort_unstable();
        for bytes in sizes {
            let c = class(bytes);
            assert!(c >= last && c < BINS, "class({bytes}) = {c} after {last}");
            last = c;
        }
    }

    /// Against the set it stands for, over inserts and removes of sizes that crowd a few bins
    /// (so that bins become trees and vectors again) and spread over many.
    #[test]
    fn it_answers_as_a_set_ordered_by_size_and_start() {
        let mut index = SizeIndex::default();
        assert_eq!(
            index.iter_from(0).count() + index.iter_from(u64::MAX).count(),
            0
        );
        let mut set = BTreeSet::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000u64 {
            let bytes = match next() % 3 {
                0 => 512 * (1 + next() % 4),
                1 => 1 << (next() % 40),
                _ => next() % (1 << 30),
            };
            let start = next() % 512 * 4096;
            if next() % 3 == 0 && !set.is_empty() {
                let &(b, s) = set
                    .iter()
                    .nth((next() % set.len() as u64) as usize)
                    .unwrap();
                assert!(index.remove(b, s) && set.remove(&(b, s)));
            } else {
                assert_eq!(index.insert(bytes, start), set.insert((bytes, start)));
            }
            assert_eq!(index.len, set.len(), "round {round}");
            assert!(
                !index.remove(bytes, start + 1),
                "removed an entry it never had"
            );
            let probe = next() % (1 << (next() % 41));
            let expected = set.range((probe, 0)..).next().copied();
            assert_eq!(index.first_at_least(probe), expected, "round {round}");
            assert_eq!(index.is_empty(), set.is_empty());
            if round % 997 == 0 {
                for probe in [probe, 0, 1 << 39, 1 << 63, u64::MAX] {
                    let all: Vec<_> = index.iter_from(probe).collect();
                    let want: Vec<_> = set.range((probe, 0)..).copied().collect();
                    assert_eq!(all, want, "round {round}, from {probe}");
                }
            }
        }
        let crowded = index.bins.iter().any(|b| matches!(b, Bin::Tree(_)));
        assert!(crowded, "no bin became a tree: the test misses that path");
    }
}

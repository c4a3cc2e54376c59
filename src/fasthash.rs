//! A tiny hasher for pointer and stream keys on the hot path.
//!
//! Invariant: keys are machine words whose low bits are often zero (512-byte aligned pointers), so
//! the hash folds high bits into the low bits that hash tables index with.

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

//! The size indexes of freed ranges, one per stream: a vector sorted by stream. A program has a
//! few streams, so a lookup (one on most frees and takes) is a short binary search, where a tree
//! walked its nodes and a map hashed.
//!
//! Invariant: one entry per stream, sorted by stream, so that iteration is in stream order.

use super::sizes::SizeIndex;
use crate::driver::Stream;

#[derive(Debug, Default)]
pub(super) struct ByStream(Vec<(Stream, SizeIndex)>);

impl ByStream {
    #[inline]
    fn find(&self, stream: Stream) -> Result<usize, usize> {
        self.0.binary_search_by_key(&stream, |&(s, _)| s)
    }

    #[inline]
    pub fn get(&self, stream: Stream) -> Option<&SizeIndex> {
        let at = self.find(stream).ok()?;
        Some(&self.0[at].1)
    }

    #[inline]
    pub fn get_mut(&mut self, stream: Stream) -> Option<&mut SizeIndex> {
        let at = self.find(stream).ok()?;
        Some(&mut self.0[at].1)
    }

    /// `stream`'s index, made empty if it had none.
    #[inline]
    pub fn get_or_default(&mut self, stream: Stream) -> &mut SizeIndex {
        let at = match self.find(stream) {
            Ok(at) => at,
            Err(at) => {
                self.0.insert(at, (stream, SizeIndex::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    pub fn remove(&mut self, stream: Stream) {
        if let Ok(at) = self.find(stream) {
            self.0.remove(at);
        }
    }

    /// Streams with an index, empty ones included.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Every stream's index, in stream order.
    pub fn iter(&self) -> impl Iterator<Item = (Stream, &SizeIndex)> + '_ {
        self.0.iter().map(|(s, index)| (*s, index))
    }

    pub fn values(&self) -> impl Iterator<Item = &SizeIndex> + '_ {
        self.0.iter().map(|(_, index)| index)
    }
}

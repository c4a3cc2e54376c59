//! The cache in front of the pool: freed blocks kept per stream for reuse without a driver call.
//!
//! Invariants: a cached block is handed out again only on the stream it was freed on (stream
//! order makes that safe without events); a block serves a request only when it is at most 1/8
//! larger than the request; `cached_bytes` equals the sum of cached block sizes and never exceeds
//! `limit_bytes`; no block larger than `max_block_bytes` is kept.

use crate::driver::{DevicePtr, Stream};
use std::ops::RangeInclusive;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedBlock {
    pub ptr: DevicePtr,
    pub block_bytes: u64,
    pub stream: Stream,
}

/// Blocks of one stream, as (block size, pointers) sorted by size. Emptied entries stay until the
/// next drain, so a size that recurs costs a binary search and a push, no allocation.
#[derive(Debug, Default)]
struct Bins {
    by_size: Vec<(u64, Vec<DevicePtr>)>,
}

impl Bins {
    #[inline]
    fn first_at_least(&self, bytes: u64) -> usize {
        self.by_size.partition_point(|(size, _)| *size < bytes)
    }

    #[inline]
    fn push(&mut self, bytes: u64, ptr: DevicePtr) {
        let i = self.first_at_least(bytes);
        match self.by_size.get_mut(i) {
            Some((size, list)) if *size == bytes => list.push(ptr),
            _ => self.by_size.insert(i, (bytes, vec![ptr])),
        }
    }
}

/// A process has a handful of streams per device: a linear scan beats hashing.
#[derive(Debug, Default)]
pub struct Cache {
    streams: Vec<(Stream, Bins)>,
    cached_bytes: u64,
    limit_bytes: u64,
    max_block_bytes: u64,
}

impl Cache {
    pub fn new(limit_bytes: u64, max_block_bytes: u64) -> Cache {
        Cache {
            limit_bytes,
            max_block_bytes,
            ..Cache::default()
        }
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    #[inline]
    fn bins_mut(&mut self, stream: Stream) -> Option<&mut Bins> {
        self.streams
            .iter_mut()
            .find(|(s, _)| *s == stream)
            .map(|(_, b)| b)
    }

    /// The smallest cached block of `stream` that fits `block_bytes` with little waste.
    #[inline]
    pub fn take(&mut self, stream: Stream, block_bytes: u64) -> Option<CachedBlock> {
        let bins = self.bins_mut(stream)?;
        let largest_fit = block_bytes + block_bytes / 8;
        let start = bins.first_at_least(block_bytes);
        let (size, list) = bins.by_size[start..]
            .iter_mut()
            .take_while(|(size, _)| *size <= largest_fit)
            .find(|(_, list)| !list.is_empty())?;
        let (size, ptr) = (*size, list.pop()?);
        self.cached_bytes -= size;
        Some(CachedBlock {
            ptr,
            block_bytes: size,
            stream,
        })
    }

    /// Keeps `block` for reuse, or hands it back when the cache is full or the block too large.
    #[inline]
    pub fn put(&mut self, block: CachedBlock) -> Result<(), CachedBlock> {
        if block.block_bytes > self.max_block_bytes
            || self.cached_bytes + block.block_bytes > self.limit_bytes
        {
            return Err(block);
        }
        self.cached_bytes += block.block_bytes;
        let bins = match self.streams.iter().position(|(s, _)| *s == block.stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                self.streams.push((block.stream, Bins::default()));
                &mut self.streams.last_mut().expect("just pushed").1
            }
        };
        bins.push(block.block_bytes, block.ptr);
        Ok(())
    }

    /// Removes blocks totalling at least `wanted_bytes` (or everything), largest first, those of
    /// `prefer_stream` first: the pool can reuse a block freed on the requesting stream at once.
    pub fn evict(&mut self, wanted_bytes: u64, prefer_stream: Stream) -> Vec<CachedBlock> {
        let mut out = Vec::new();
        let mut freed_bytes = 0;
        let mut order: Vec<Stream> = self
            .streams
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| *s != prefer_stream)
            .collect();
        order.insert(0, prefer_stream);
        for stream in order {
            let Some(bins) = self.bins_mut(stream) else {
                continue;
            };
            for (size, list) in bins.by_size.iter_mut().rev() {
                while freed_bytes < wanted_bytes {
                    let Some(ptr) = list.pop() else { break };
                    freed_bytes += *size;
                    out.push(CachedBlock {
                        ptr,
                        block_bytes: *size,
                        stream,
                    });
                }
            }
        }
        self.cached_bytes -= freed_bytes;
        out
    }

    /// Every cached block, for snapshots.
    pub fn blocks(&self) -> impl Iterator<Item = CachedBlock> + '_ {
        self.streams.iter().flat_map(|(stream, bins)| {
            bins.by_size.iter().flat_map(move |(size, list)| {
                list.iter().map(move |&ptr| CachedBlock {
                    ptr,
                    block_bytes: *size,
                    stream: *stream,
                })
            })
        })
    }

    /// Removes every block whose size is in `sizes` (the blocks of one pool).
    pub fn drain_sizes(&mut self, sizes: RangeInclusive<u64>) -> Vec<CachedBlock> {
        let mut out = Vec::new();
        for (stream, bins) in &mut self.streams {
            let start = bins.first_at_least(*sizes.start());
            let end = bins.first_at_least(sizes.end().saturating_add(1));
            for (size, list) in bins.by_size.drain(start..end) {
                out.extend(list.into_iter().map(|ptr| CachedBlock {
                    ptr,
                    block_bytes: size,
                    stream: *stream,
                }));
            }
        }
        self.cached_bytes -= out.iter().map(|b| b.block_bytes).sum::<u64>();
        out
    }

    /// Removes every block.
    pub fn drain(&mut self) -> Vec<CachedBlock> {
        let out = self.drain_sizes(0..=u64::MAX);
        self.streams.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ptr: u64, bytes: u64, stream: usize) -> CachedBlock {
        CachedBlock {
            ptr: DevicePtr(ptr),
            block_bytes: bytes,
            stream: Stream(stream),
        }
    }

    #[test]
    fn reuses_only_on_the_same_stream_and_close_sizes() {
        let mut c = Cache::new(u64::MAX, u64::MAX);
        c.put(block(0x1000, 4096, 1)).unwrap();
        assert_eq!(c.take(Stream(2), 4096), None, "another stream");
        assert_eq!(c.take(Stream(1), 1024), None, "4x too big for 1 KiB");
        assert_eq!(c.take(Stream(1), 3700), Some(block(0x1000, 4096, 1)));
        assert_eq!(c.cached_bytes(), 0);
    }

    #[test]
    fn respects_the_limit() {
        let mut c = Cache::new(8192, 4096);
        c.put(block(0x1000, 4096, 1)).unwrap();
        assert_eq!(
            c.put(block(0x2000, 4608, 1)),
            Err(block(0x2000, 4608, 1)),
            "block too large"
        );
        c.put(block(0x3000, 4096, 1)).unwrap();
        assert_eq!(
            c.put(block(0x4000, 512, 1)),
            Err(block(0x4000, 512, 1)),
            "cache full"
        );
    }

    #[test]
    fn evicts_preferred_stream_largest_first_then_drains() {
        let mut c = Cache::new(u64::MAX, u64::MAX);
        c.put(block(0x1000, 512, 1)).unwrap();
        c.put(block(0x2000, 8192, 1)).unwrap();
        c.put(block(0x9000, 65536, 2)).unwrap();
        let out = c.evict(4096, Stream(1));
        assert_eq!(out, vec![block(0x2000, 8192, 1)]);
        assert_eq!(c.cached_bytes(), 512 + 65536);
        assert_eq!(c.drain().len(), 2);
        assert_eq!(c.cached_bytes(), 0);
    }

    /// The hot path's promise: a size that recurs reuses its bin (no insertion, no growth).
    #[test]
    fn a_size_that_recurs_keeps_one_bin() {
        let mut c = Cache::new(u64::MAX, u64::MAX);
        for _ in 0..3 {
            c.put(block(0x1000, 4096, 1)).unwrap();
            c.put(block(0x2000, 4096, 1)).unwrap();
            assert_eq!(c.take(Stream(1), 4096), Some(block(0x2000, 4096, 1)));
            assert_eq!(c.take(Stream(1), 4096), Some(block(0x1000, 4096, 1)));
        }
        assert_eq!(c.streams.len(), 1);
        assert_eq!(c.streams[0].1.by_size.len(), 1, "{:?}", c.streams);
    }

    #[test]
    fn drains_one_pools_sizes_of_every_stream() {
        let mut c = Cache::new(u64::MAX, u64::MAX);
        c.put(block(0x1000, 512, 1)).unwrap();
        c.put(block(0x2000, 8192, 1)).unwrap();
        c.put(block(0x9000, 4096, 2)).unwrap();
        c.put(block(0xa000, 65536, 2)).unwrap();
        let mut small = c.drain_sizes(0..=4096);
        small.sort_by_key(|b| b.ptr);
        assert_eq!(small, vec![block(0x1000, 512, 1), block(0x9000, 4096, 2)]);
        assert_eq!(c.cached_bytes(), 8192 + 65536);
        assert_eq!(c.drain_sizes(4097..=u64::MAX).len(), 2);
        assert_eq!(c.cached_bytes(), 0);
        c.put(block(0x1000, 512, 1)).unwrap();
        assert_eq!(
            c.take(Stream(1), 512),
            Some(block(0x1000, 512, 1)),
            "bins still work"
        );
    }
}

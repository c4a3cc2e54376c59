//! A PyTorch graph pool (one `MempoolId` of one device): the memory that CUDA graphs captured
//! into the pool, and tensors allocated while the pool is active, are carved from. The pool
//! holds segments taken from the device's own resource and sub-allocates them; what its blocks
//! free is reused by later allocations into the same pool only, as PyTorch's private pools are.
//!
//! Invariants: live blocks never overlap and each lies in one segment; a free range is reused
//! on the stream it was freed on (a range never used yet, on any stream); adjacent free ranges
//! of one segment merge when their streams allow; a block can be made live again at its old
//! address ([`GraphPool::restore`]) only if that range is free; segments leave the pool only
//! when wholly free ([`GraphPool::take_free_segments`]) — the caller returns them to the
//! resource after a device synchronisation, since graph replays may still use them.

mod resource;
#[cfg(test)]
mod tests;

pub use resource::{GraphPoolResource, PoolId, SegmentLimit};

use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use std::collections::{BTreeMap, HashMap};

/// Blocks up to this size share segments of [`SMALL_SEGMENT_BYTES`].
pub const SMALL_BLOCK_MAX_BYTES: u64 = 1 << 20;
/// The segment small blocks are carved from, and the granule large segments are rounded to.
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;

/// A segment of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub ptr: DevicePtr,
    pub bytes: u64,
}

/// A free range of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FreeRange {
    bytes: u64,
    /// The stream that freed it; None for memory never handed out.
    stream: Option<Stream>,
}

/// A live block of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBlock {
    pub ptr: DevicePtr,
    pub bytes: u64,
    pub stream: Stream,
}

/// One graph pool's books.
#[derive(Debug, Default)]
pub struct GraphPool {
    /// PyTorch's references (captures, `MemPool` objects, `use_mem_pool` regions).
    use_count: u32,
    /// Allocations in the pool under way (not PyTorch's: its use count does not show them);
    /// they keep the pool as its users do, so that a flush meanwhile does not drop it.
    allocating: u32,
    /// Blocks take a whole free range rather than split it (`MemPool(no_split=True)`).
    no_split: bool,
    /// Its free ranges may serve allocations outside the pool that ran out of memory.
    use_on_oom: bool,
    /// Segment start -> segment.
    segments: BTreeMap<u64, Segment>,
    /// Free range start -> range.
    free: BTreeMap<u64, FreeRange>,
    live: HashMap<u64, PoolBlock>,
    reserved_bytes: u64,
}

/// `bytes` rounded up to `granule`; a size no device can hold (the rounding overflows) is out of
/// memory, as a resource reports it.
fn round_up(bytes: u64, granule: u64) -> Result<u64> {
    bytes
        .checked_next_multiple_of(granule)
        .ok_or_else(|| Error::Driver {
            call: "a graph pool's new segment",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: format!("{bytes} B is more than any device holds"),
        })
}

/// Whether a range freed on `range` can serve `stream`, and the stream the two share.
fn compatible(range: Option<Stream>, stream: Option<Stream>) -> Option<Option<Stream>> {
    match (range, stream) {
        (None, s) | (s, None) => Some(s),
        (Some(a), Some(b)) => (a == b).then_some(Some(a)),
    }
}

impl GraphPool {
    pub fn use_count(&self) -> u32 {
        self.use_count
    }

    pub fn incref(&mut self) {
        self.use_count = self.use_count.saturating_add(1);
    }

    /// Drops one reference; an error if there was none (the pool is left as it was).
    pub fn decref(&mut self) -> Result<u32> {
        self.use_count = self.use_count.checked_sub(1).ok_or_else(|| {
            Error::InvalidArgument("the graph pool was released more often than it was used".into())
        })?;
        Ok(self.use_count)
    }

    /// An allocation in the pool begins: the pool stays while it runs.
    pub fn begin_allocating(&mut self) {
        self.allocating = self.allocating.saturating_add(1);
    }

    /// An allocation in the pool has ended (served or refused).
    pub fn end_allocating(&mut self) {
        self.allocating = self.allocating.saturating_sub(1);
    }

    /// Nobody uses the pool: no PyTorch reference, no allocation under way.
    pub fn is_idle(&self) -> bool {
        self.use_count == 0 && self.allocating == 0
    }

    pub fn set_no_split(&mut self) {
        self.no_split = true;
    }

    pub fn set_use_on_oom(&mut self, on: bool) {
        self.use_on_oom = on;
    }

    pub fn use_on_oom(&self) -> bool {
        self.use_on_oom
    }

    /// Bytes of the segments the pool holds.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// Bytes of its live blocks.
    pub fn live_bytes(&self) -> u64 {
        self.live.values().map(|b| b.bytes).sum()
    }

    /// Nothing live and nobody holding it: the pool can go, with all its segments.
    pub fn is_unused(&self) -> bool {
        self.is_idle() && self.live.is_empty()
    }

    /// The live blocks, in no particular order.
    pub fn live_blocks(&self) -> impl Iterator<Item = &PoolBlock> {
        self.live.values()
    }

    /// The size of a new segment for a block of `bytes`.
    pub fn segment_bytes_for(bytes: u64) -> Result<u64> {
        match bytes <= SMALL_BLOCK_MAX_BYTES {
            true => Ok(SMALL_SEGMENT_BYTES),
            false => round_up(bytes, SMALL_SEGMENT_BYTES),
        }
    }

    /// A block of `bytes` (a multiple of 512) for `stream` from the pool's free ranges, or None
    /// if none fits: the smallest range that fits, the lowest address among equals.
    pub fn take(&mut self, bytes: u64, stream: Stream) -> Option<PoolBlock> {
        let (start, range) = self
            .free
            .iter()
            .filter(|(_, r)| r.bytes >= bytes && compatible(r.stream, Some(stream)).is_some())
            .min_by_key(|(start, r)| (r.bytes, **start))
            .map(|(s, r)| (*s, *r))?;
        self.free.remove(&start);
        let block_bytes = match self.no_split {
            true => range.bytes,
            false => bytes,
        };
        if range.bytes > block_bytes {
            let rest = FreeRange {
                bytes: range.bytes - block_bytes,
                stream: range.stream,
            };
            self.free.insert(start + block_bytes, rest);
        }
        let block = PoolBlock {
            ptr: DevicePtr(start),
            bytes: block_bytes,
            stream,
        };
        self.live.insert(start, block);
        Some(block)
    }

    /// Adds a segment, ready for any stream (its allocation has completed).
    pub fn add_segment(&mut self, segment: Segment) {
        debug_assert!(!self.segments.contains_key(&segment.ptr.0));
        self.segments.insert(segment.ptr.0, segment);
        self.reserved_bytes += segment.bytes;
        let range = FreeRange {
            bytes: segment.bytes,
            stream: None,
        };
        self.free.insert(segment.ptr.0, range);
    }

    /// The segment (start, bytes) that holds `ptr`.
    fn segment_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&start, segment) = self.segments.range(..=ptr).next_back()?;
        (ptr < start + segment.bytes).then_some((start, segment.bytes))
    }

    /// The segments, in address order.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// Frees the live block at `ptr`, of `bytes`, into the pool; returns it. An error (and no
    /// change) if `ptr` is not a live block of the pool or the block is not of `bytes`.
    pub fn give(&mut self, ptr: DevicePtr, bytes: u64) -> Result<PoolBlock> {
        let block = self.live.get(&ptr.0).copied().ok_or_else(|| {
            Error::InvalidArgument(format!("{ptr:#x} is not a live block of this graph pool"))
        })?;
        if block.bytes != bytes {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is a block of {} B of the graph pool, not {bytes} B",
                block.bytes
            )));
        }
        self.live.remove(&ptr.0);
        self.insert_free(block.ptr.0, block.bytes, Some(block.stream));
        Ok(block)
    }

    /// Inserts a free range, merging it with free neighbours of its segment whose streams allow.
    fn insert_free(&mut self, mut start: u64, mut bytes: u64, mut stream: Option<Stream>) {
        let (segment_start, segment_bytes) = self
            .segment_of(start)
            .expect("a pool block lies in one of the pool's segments");
        let segment_end = segment_start + segment_bytes;
        if let Some((&before, &range)) = self.free.range(segment_start..start).next_back() {
            if let (true, Some(s)) = (
                before + range.bytes == start,
                compatible(range.stream, stream),
            ) {
                self.free.remove(&before);
                (start, bytes, stream) = (before, bytes + range.bytes, s);
            }
        }
        let end = start + bytes;
        if end < segment_end {
            if let Some(&range) = self.free.get(&end) {
                if let Some(s) = compatible(range.stream, stream) {
                    self.free.remove(&end);
                    (bytes, stream) = (bytes + range.bytes, s);
                }
            }
        }
        self.free.insert(start, FreeRange { bytes, stream });
    }

    /// Makes `[ptr, ptr + bytes)` a live block again (a checkpoint being restored). An error,
    /// and no change, unless the range lies in one free range of the pool.
    pub fn restore(&mut self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        let end = ptr.0.checked_add(bytes).filter(|_| bytes > 0);
        let found = self
            .free
            .range(..=ptr.0)
            .next_back()
            .map(|(s, r)| (*s, *r))
            .filter(|(s, r)| end.is_some_and(|e| e <= s + r.bytes));
        let Some((start, range)) = found else {
            return Err(Error::InvalidArgument(format!(
                "cannot restore {bytes} bytes at {ptr:#x}: the range is not free in the graph pool"
            )));
        };
        let end = ptr.0 + bytes;
        self.free.remove(&start);
        if start < ptr.0 {
            let head = FreeRange {
                bytes: ptr.0 - start,
                stream: range.stream,
            };
            self.free.insert(start, head);
        }
        if end < start + range.bytes {
            let tail = FreeRange {
                bytes: start + range.bytes - end,
                stream: range.stream,
            };
            self.free.insert(end, tail);
        }
        self.live.insert(ptr.0, PoolBlock { ptr, bytes, stream });
        Ok(())
    }

    /// Removes and returns the segments that hold no live block (their free ranges may not
    /// have merged, having been freed on different streams).
    pub fn take_free_segments(&mut self) -> Vec<Segment> {
        let free_bytes = |free: &BTreeMap<u64, FreeRange>, s: &Segment| -> u64 {
            let end = s.ptr.0 + s.bytes;
            free.range(s.ptr.0..end).map(|(_, r)| r.bytes).sum()
        };
        let whole: Vec<Segment> = self
            .segments
            .values()
            .filter(|s| free_bytes(&self.free, s) == s.bytes)
            .copied()
            .collect();
        for s in &whole {
            self.segments.remove(&s.ptr.0);
            let end = s.ptr.0 + s.bytes;
            let ranges: Vec<u64> = self.free.range(s.ptr.0..end).map(|(r, _)| *r).collect();
            for r in ranges {
                self.free.remove(&r);
            }
            self.reserved_bytes -= s.bytes;
        }
        whole
    }

    /// The largest free range, in bytes.
    #[cfg(test)]
    pub fn largest_free_bytes(&self) -> u64 {
        self.free.values().map(|r| r.bytes).max().unwrap_or(0)
    }
}

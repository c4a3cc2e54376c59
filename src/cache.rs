//! The cache in front of the pool: freed blocks kept per stream for reuse without a driver call.
//!
//! Invariants: a cached block is handed out again only on the stream it was freed on (stream
//! order makes that safe without events); a block serves a request only when it is at most 1/8
//! larger than the request; `cached_bytes` equals the sum of cached block sizes and never exceeds
//! `limit_bytes`; no block larger than `max_block_bytes` is kept; a block keeps the id of its
//! source from put to take (a block of one source never comes back as another's).
//!
//! Streams come and go (a server may make one per request), so nothing here grows with the
//! number of streams ever seen: a stream is found by hashing, not by a scan; when the budget is
//! full, the blocks of the stream that cached a block longest ago leave first (streams no longer
//! used stop holding the budget); a stream's entry without blocks is dropped once it has been
//! idle for [`IDLE_PUTS`] puts, and stale entries of the eviction queue are dropped, both
//! amortised O(1) per put — so there are at most 2 x (streams holding blocks + `IDLE_PUTS`)
//! entries, and at most 2 x those streams + a constant in the queue (checked when an entry joins
//! it: only that lengthens it).

use crate::driver::{DevicePtr, Stream};
use crate::fasthash::WordMap;
use crate::resource::SourceId;
use std::collections::VecDeque;

/// A stream's entry without blocks is dropped after this many puts without one of its own.
pub(crate) const IDLE_PUTS: u64 = 4096;
/// Stale entries the eviction queue may hold beyond twice its live ones before it is compacted.
const QUEUE_SLACK: usize = 64;
/// [`Bins::queued_at`] of a stream that has no entry in the eviction queue yet (put counts start
/// at 1, so no entry has it).
const NOT_QUEUED: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedBlock {
    pub ptr: DevicePtr,
    pub block_bytes: u64,
    pub stream: Stream,
    /// Where it goes back to.
    pub source: SourceId,
}

/// Blocks of one size from one source.
#[derive(Debug)]
struct Bin {
    bytes: u64,
    source: SourceId,
    ptrs: Vec<DevicePtr>,
}

impl Bin {
    fn block(&self, ptr: DevicePtr, stream: Stream) -> CachedBlock {
        CachedBlock {
            ptr,
            block_bytes: self.bytes,
            stream,
            source: self.source,
        }
    }
}

/// Blocks of one stream, in bins sorted by size, then source. Emptied bins stay while the stream
/// is in use, so a size that recurs costs a binary search and a push, no allocation.
#[derive(Debug)]
struct Bins {
    by_size: Vec<Bin>,
    /// Blocks in `by_size`.
    blocks: usize,
    /// The cache's put count at this stream's last put (a stream idle for long is swept).
    last_put: u64,
    /// The put count of this stream's live entry in the eviction queue, [`NOT_QUEUED`] if none.
    queued_at: u64,
}

impl Default for Bins {
    fn default() -> Bins {
        Bins {
            by_size: Vec::new(),
            blocks: 0,
            last_put: 0,
            queued_at: NOT_QUEUED,
        }
    }
}

impl Bins {
    #[inline(always)]
    fn first_at_least(&self, bytes: u64) -> usize {
        partition(&self.by_size, |bin| bin.bytes < bytes)
    }

    #[inline(always)]
    fn push(&mut self, bytes: u64, source: SourceId, ptr: DevicePtr) {
        let i = partition(&self.by_size, |bin| {
            (bin.bytes, bin.source) < (bytes, source)
        });
        match self.by_size.get_mut(i) {
            Some(bin) if bin.bytes == bytes && bin.source == source => bin.ptrs.push(ptr),
            _ => self.by_size.insert(
                i,
                Bin {
                    bytes,
                    source,
                    ptrs: vec![ptr],
                },
            ),
        }
        self.blocks += 1;
    }

    /// Takes blocks, largest first, until `wanted_bytes` are out (or none is left); their bytes.
    fn take_largest(
        &mut self,
        stream: Stream,
        wanted_bytes: u64,
        out: &mut Vec<CachedBlock>,
    ) -> u64 {
        let mut taken_bytes = 0;
        for bin in self.by_size.iter_mut().rev() {
            while taken_bytes < wanted_bytes {
                let Some(ptr) = bin.ptrs.pop() else { break };
                taken_bytes += bin.bytes;
                self.blocks -= 1;
                out.push(bin.block(ptr, stream));
            }
        }
        taken_bytes
    }
}

/// The number of `bins` (sorted) for which `before` holds: `partition_point`, which the compiler
/// leaves out of line, as a binary search inlined into the hot path.
#[inline(always)]
fn partition(bins: &[Bin], before: impl Fn(&Bin) -> bool) -> usize {
    let (mut low, mut high) = (0, bins.len());
    while low < high {
        let middle = low + (high - low) / 2;
        match before(&bins[middle]) {
            true => low = middle + 1,
            false => high = middle,
        }
    }
    low
}

#[derive(Debug)]
pub struct Cache {
    /// Each stream's bins, found through `index`.
    slots: Vec<(Stream, Bins)>,
    index: WordMap<Stream, usize>,
    /// The stream used last and its slot: one compare instead of a hash on the hot path.
    last: Option<(Stream, usize)>,
    /// Streams in the order of their last put, oldest first, each with the put count at which it
    /// joined the queue (its `queued_at`); an entry whose stream has joined again since, or holds
    /// no block, is stale (skipped, and dropped in time). A stream that puts again while its
    /// entry is the newest keeps it.
    queue: VecDeque<(Stream, u64)>,
    /// The put count of the queue's newest entry (0 if the queue is empty).
    newest_at: u64,
    /// Puts so far (the clock of `last_put` and of the queue).
    puts: u64,
    /// The put count at which idle entries are next swept.
    sweep_due: u64,
    /// Streams holding at least one block.
    occupied: usize,
    cached_bytes: u64,
    limit_bytes: u64,
    max_block_bytes: u64,
}

impl Default for Cache {
    fn default() -> Cache {
        Cache::new(0, 0)
    }
}

impl Cache {
    pub fn new(limit_bytes: u64, max_block_bytes: u64) -> Cache {
        Cache {
            slots: Vec::new(),
            index: WordMap::default(),
            last: None,
            queue: VecDeque::new(),
            newest_at: 0,
            puts: 0,
            sweep_due: IDLE_PUTS,
            occupied: 0,
            cached_bytes: 0,
            limit_bytes,
            max_block_bytes,
        }
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// The slot of `stream`, if it has one.
    #[inline(always)]
    fn slot(&mut self, stream: Stream) -> Option<usize> {
        if let Some((s, i)) = self.last {
            if s == stream {
                return Some(i);
            }
        }
        let i = *self.index.get(&stream)?;
        self.last = Some((stream, i));
        Some(i)
    }

    /// The slot of `stream`, made if it has none.
    #[inline(always)]
    fn slot_or_new(&mut self, stream: Stream) -> usize {
        match self.slot(stream) {
            Some(i) => i,
            None => self.new_slot(stream),
        }
    }

    #[inline(never)]
    fn new_slot(&mut self, stream: Stream) -> usize {
        let i = self.slots.len();
        self.slots.push((stream, Bins::default()));
        self.index.insert(stream, i);
        self.last = Some((stream, i));
        i
    }

    /// The bins of `stream` if `put` is its last put and it holds blocks (a live queue entry).
    fn live_entry(&mut self, stream: Stream, put: u64) -> Option<&mut Bins> {
        let i = self.slot(stream)?;
        let bins = &mut self.slots[i].1;
        (bins.queued_at == put && bins.blocks > 0).then_some(bins)
    }

    /// The smallest cached block of `stream` that fits `block_bytes` with little waste.
    #[inline(always)]
    pub fn take(&mut self, stream: Stream, block_bytes: u64) -> Option<CachedBlock> {
        let i = self.slot(stream)?;
        let bins = &mut self.slots[i].1;
        let largest_fit = block_bytes.saturating_add(block_bytes / 8);
        let start = bins.first_at_least(block_bytes);
        let bin = bins.by_size[start..]
            .iter_mut()
            .take_while(|bin| bin.bytes <= largest_fit)
            .find(|bin| !bin.ptrs.is_empty())?;
        let ptr = bin.ptrs.pop()?;
        let block = bin.block(ptr, stream);
        bins.blocks -= 1;
        if bins.blocks == 0 {
            self.occupied -= 1;
        }
        self.cached_bytes -= block.block_bytes;
        Some(block)
    }

    /// True if a block of `block_bytes` can be kept at all (not larger than the largest block
    /// or the whole budget).
    #[inline]
    pub fn takes(&self, block_bytes: u64) -> bool {
        block_bytes <= self.max_block_bytes && block_bytes <= self.limit_bytes
    }

    /// Keeps `block` for reuse, or hands it back when it is too large. When the budget is full,
    /// blocks of the streams that put one longest ago go to `evicted` to make room.
    #[inline]
    pub fn put(
        &mut self,
        block: CachedBlock,
        evicted: &mut Vec<CachedBlock>,
    ) -> Result<(), CachedBlock> {
        if !self.takes(block.block_bytes) {
            return Err(block);
        }
        if !self.has_room(block.block_bytes) {
            self.evict_for_budget(block.block_bytes, evicted);
        }
        self.put_in_room(block);
        Ok(())
    }

    /// True if `block_bytes` more fit the budget without evicting.
    #[inline]
    pub fn has_room(&self, block_bytes: u64) -> bool {
        self.cached_bytes.saturating_add(block_bytes) <= self.limit_bytes
    }

    /// Keeps `block`, which the cache [`takes`](Cache::takes) and [`has_room`](Cache::has_room)
    /// for.
    #[inline(always)]
    pub fn put_in_room(&mut self, block: CachedBlock) {
        debug_assert!(self.takes(block.block_bytes) && self.has_room(block.block_bytes));
        self.cached_bytes += block.block_bytes;
        self.puts += 1;
        let i = self.slot_or_new(block.stream);
        let bins = &mut self.slots[i].1;
        if bins.blocks == 0 {
            self.occupied += 1;
        }
        bins.push(block.block_bytes, block.source, block.ptr);
        bins.last_put = self.puts;
        // A stream whose entry is the newest keeps it; another joins the queue's back.
        if bins.queued_at != self.newest_at {
            bins.queued_at = self.puts;
            self.newest_at = self.puts;
            self.queue.push_back((block.stream, self.puts));
            // Only a push lengthens the queue: stale entries are dropped once it is too long.
            if self.queue.len() > 2 * self.occupied + QUEUE_SLACK {
                self.compact_queue();
            }
        }
        if self.puts >= self.sweep_due {
            self.sweep();
        }
    }

    /// Notes the queue's newest entry after entries left it.
    fn newest_changed(&mut self) {
        self.newest_at = self.queue.back().map_or(0, |&(_, put)| put);
    }

    /// Evicts, oldest put first, until `bytes` more fit the budget.
    #[cold]
    fn evict_for_budget(&mut self, bytes: u64, evicted: &mut Vec<CachedBlock>) {
        while self.cached_bytes + bytes > self.limit_bytes {
            let Some(&(stream, put)) = self.queue.front() else {
                break;
            };
            let over_bytes = self.cached_bytes + bytes - self.limit_bytes;
            let Some(bins) = self.live_entry(stream, put) else {
                self.queue.pop_front();
                continue;
            };
            let taken_bytes = bins.take_largest(stream, over_bytes, evicted);
            let emptied = bins.blocks == 0;
            self.cached_bytes -= taken_bytes;
            if emptied {
                self.occupied -= 1;
            }
            // Each round empties a stream or frees bytes: no endless loop under the device lock.
            if emptied || taken_bytes == 0 {
                self.queue.pop_front();
            }
        }
        self.newest_changed();
    }

    /// Drops the queue's stale entries.
    #[cold]
    fn compact_queue(&mut self) {
        let (slots, index) = (&self.slots, &self.index);
        self.queue.retain(|&(stream, put)| {
            index
                .get(&stream)
                .map(|&i| &slots[i].1)
                .is_some_and(|b| b.queued_at == put && b.blocks > 0)
        });
        if self.queue.capacity() > 4 * (self.queue.len() + QUEUE_SLACK) {
            self.queue.shrink_to(2 * (self.queue.len() + QUEUE_SLACK));
        }
        self.newest_changed();
    }

    /// Drops the streams without blocks that put none in the last `IDLE_PUTS` puts. The next
    /// sweep is due after IDLE_PUTS puts, or as many puts as this one left streams, whichever is
    /// more: O(1) per put, and at most twice the streams this one left plus IDLE_PUTS.
    #[cold]
    fn sweep(&mut self) {
        let idle_before = self.puts - IDLE_PUTS;
        self.slots
            .retain(|(_, b)| b.blocks > 0 || b.last_put > idle_before);
        if self.slots.capacity() > 4 * self.slots.len() + 64 {
            self.slots.shrink_to(2 * self.slots.len() + 16);
        }
        self.index = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, (stream, _))| (*stream, i))
            .collect();
        self.last = None;
        self.sweep_due = self.puts + IDLE_PUTS.max(self.slots.len() as u64);
    }

    /// Removes blocks totalling at least `wanted_bytes` (or everything), largest first, those of
    /// `prefer_stream` first — the pool can reuse a block freed on the requesting stream at
    /// once — then those of the streams that put one longest ago.
    pub fn evict(&mut self, wanted_bytes: u64, prefer_stream: Stream) -> Vec<CachedBlock> {
        let prefer = self
            .slot(prefer_stream)
            .map(|i| (prefer_stream, self.slots[i].1.queued_at));
        let others = self.queue.iter().filter(|&&(s, _)| s != prefer_stream);
        let order: Vec<(Stream, u64)> = prefer.into_iter().chain(others.copied()).collect();
        let mut out = Vec::new();
        let mut freed_bytes = 0;
        for (stream, put) in order {
            if freed_bytes >= wanted_bytes {
                break;
            }
            let Some(bins) = self.live_entry(stream, put) else {
                continue;
            };
            freed_bytes += bins.take_largest(stream, wanted_bytes - freed_bytes, &mut out);
            if bins.blocks == 0 {
                self.occupied -= 1;
            }
        }
        self.cached_bytes -= freed_bytes;
        out
    }

    /// Every cached block, for snapshots.
    pub fn blocks(&self) -> impl Iterator<Item = CachedBlock> + '_ {
        self.slots.iter().flat_map(|(stream, bins)| {
            bins.by_size
                .iter()
                .flat_map(move |bin| bin.ptrs.iter().map(move |&ptr| bin.block(ptr, *stream)))
        })
    }

    /// Removes every block of `source`.
    pub fn drain_source(&mut self, source: SourceId) -> Vec<CachedBlock> {
        self.drain_where(|s| s == source)
    }

    /// Removes every block of the sources `of` names.
    fn drain_where(&mut self, of: impl Fn(SourceId) -> bool) -> Vec<CachedBlock> {
        let mut out = Vec::new();
        for (stream, bins) in &mut self.slots {
            let had_blocks = bins.blocks > 0;
            for bin in bins.by_size.extract_if(.., |bin| of(bin.source)) {
                bins.blocks -= bin.ptrs.len();
                out.extend(bin.ptrs.iter().map(|&ptr| bin.block(ptr, *stream)));
            }
            if had_blocks && bins.blocks == 0 {
                self.occupied -= 1;
            }
        }
        self.cached_bytes -= out.iter().map(|b| b.block_bytes).sum::<u64>();
        out
    }

    /// Removes every block.
    pub fn drain(&mut self) -> Vec<CachedBlock> {
        let out = self.drain_where(|_| true);
        *self = Cache::new(self.limit_bytes, self.max_block_bytes);
        out
    }
}

#[cfg(test)]
mod tests;

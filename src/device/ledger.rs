//! The ledger of one device: which blocks are live, the table of the sources they come from
//! (every record carries its source's id), the cache of freed blocks, the bytes held from the
//! sources, and the counters behind the statistics.
//!
//! Invariants (all under the device lock, so a snapshot is consistent): `allocated_bytes` is the
//! sum of requested bytes over live blocks; `held_bytes` is the block bytes of every block held
//! from a source whose blocks are held ([`crate::resource::Traits::held`]: graph memory is not)
//! — live, cached, waiting for other streams, refused by the driver on return — plus allocations
//! in flight that reserved their bytes ([`Ledger::reserve`]); a block is in exactly one place at
//! a time (live, cache, a wait, unreturned, or back at its source), and counts in its source's
//! blocks ([`Sources`]) until it is back — but for the fast own source's, whose count is not kept
//! ([`Sources::fast_own`]).

use super::freed::{FreedBlock, Kept, Returning, WaitingBlock};
use super::live::{LiveBlock, LiveBlocks, Removed};
use super::request::Request;
use crate::cache::{Cache, CachedBlock};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::fasthash::WordMap;
use crate::history::{Gauges, StreampoolBlock, StreampoolBlockState};
use crate::resource::Resource as _;
use crate::resource::{SourceId, Sources};
use crate::stats::DeviceCounters;
use std::collections::HashMap;

/// In the order an allocation on a fast path reads it (`repr(C)` keeps the order, so that the
/// fields every call reads share as few cache lines as they can).
#[derive(Default)]
#[repr(C)]
pub(super) struct Ledger {
    held_bytes: u64,
    counters: DeviceCounters,
    /// By address (never NULL: a source serves no block there).
    live: LiveBlocks,
    sources: Sources,
    cache: Cache,
    /// The other streams of each live block that more than one other stream used, oldest first
    /// (a block used by one names it in its record).
    more_streams: WordMap<u64, Vec<Stream>>,
    /// Blocks whose return failed; the next flush tries again, so a transient driver error loses
    /// no memory.
    unreturned: Vec<FreedBlock>,
}

impl Ledger {
    /// The sources and the cache of a device on its first use (the ledger holds no block then).
    pub fn provision(&mut self, sources: Sources, cache: Cache) {
        debug_assert_eq!(self.cache.cached_bytes(), 0);
        self.sources = sources;
        self.cache = cache;
    }

    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    pub fn sources_mut(&mut self) -> &mut Sources {
        &mut self.sources
    }

    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cache.cached_bytes()
    }

    /// The gauges a timeline event carries (reserved bytes are the recorder's).
    pub fn gauges(&self) -> Gauges {
        Gauges {
            allocated_bytes: self.counters.allocated_bytes.current,
            held_bytes: self.held_bytes,
            cached_bytes: self.cache.cached_bytes(),
            reserved_bytes: 0,
        }
    }

    pub fn counters_mut(&mut self) -> &mut DeviceCounters {
        &mut self.counters
    }

    /// Holds `block_bytes` more if that stays within `limit_bytes`; else how many bytes over.
    #[inline]
    pub fn reserve(&mut self, block_bytes: u64, limit_bytes: u64) -> Result<(), u64> {
        let after = self.held_bytes.saturating_add(block_bytes);
        match after <= limit_bytes {
            true => {
                self.held_bytes = after;
                Ok(())
            }
            false => Err(after - limit_bytes),
        }
    }

    /// Gives back a reservation whose allocation failed.
    pub fn unreserve(&mut self, block_bytes: u64) {
        self.held_bytes -= block_bytes;
    }

    /// `ptr`, of `source`, serves `request` (its block bytes those of the block).
    #[inline(always)]
    pub fn insert_live(&mut self, ptr: DevicePtr, request: Request, source: SourceId) {
        let c = &mut self.counters;
        let requested_bytes = request.requested_bytes;
        c.allocated_bytes.add(requested_bytes);
        c.active_bytes.add(requested_bytes);
        c.allocations.add(1);
        c.allocated_bytes_total += requested_bytes;
        c.num_allocs += 1;
        let block = LiveBlock {
            requested_bytes,
            block_bytes: request.block_bytes,
            stream: request.stream,
            source,
            other_streams: 0,
            first_other_stream: Stream(0),
        };
        if let Some(replaced) = self.live.insert(ptr.0, block) {
            self.live_twice(ptr, replaced);
        }
    }

    /// A source handed out an address that is live already: a bug below, kept from the hot path.
    #[cold]
    fn live_twice(&mut self, ptr: DevicePtr, replaced: LiveBlock) {
        debug_assert!(false, "{ptr:#x} handed out while live ({replaced:?})");
        log::error!(
            "device block {ptr:#x} was handed out while still live; its old record is dropped"
        );
        self.more_streams.remove(&ptr.0);
    }

    /// Takes `ptr` off the live list (it stays active until it no longer waits for streams);
    /// `None` if it is not live (the caller builds the error, off the hot path). A block other
    /// streams used goes on through [`Ledger::removed_used_elsewhere`].
    #[inline(always)]
    pub fn remove_live(&mut self, ptr: DevicePtr) -> Option<LiveBlock> {
        let block = self.live.remove(ptr.0)?;
        let c = &mut self.counters;
        c.allocated_bytes.sub(block.requested_bytes);
        c.allocations.sub(1);
        c.freed_bytes_total += block.requested_bytes;
        c.num_frees += 1;
        Some(block)
    }

    /// [`Ledger::remove_live`]'s `block` at `ptr`, which other streams used: its list of them
    /// leaves the ledger with it, if it had one (more than one stream).
    #[inline]
    pub fn removed_used_elsewhere(&mut self, ptr: DevicePtr, block: LiveBlock) -> Removed {
        let all_other_streams = match block.other_streams > 1 {
            true => self.more_streams.remove(&ptr.0),
            false => None,
        };
        Removed {
            live: block,
            all_other_streams,
        }
    }

    pub fn live(&self, ptr: DevicePtr) -> Option<&LiveBlock> {
        self.live.get(ptr.0)
    }

    /// Notes that `stream` uses the live block `ptr`.
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: Stream, device: usize) -> Result<()> {
        let Some(block) = self.live.get_mut(ptr.0) else {
            return Err(Error::UnknownPointer { ptr: ptr.0, device });
        };
        if stream == block.stream {
            return Ok(());
        }
        match block.other_streams {
            0 => block.first_other_stream = stream,
            1 if block.first_other_stream == stream => return Ok(()),
            1 => {
                let all = vec![block.first_other_stream, stream];
                self.more_streams.insert(ptr.0, all);
            }
            _ => {
                let all = self.more_streams.entry(ptr.0).or_default();
                if all.contains(&stream) {
                    return Ok(());
                }
                all.push(stream);
            }
        }
        block.other_streams = block.other_streams.saturating_add(1);
        Ok(())
    }

    /// A freed block stops being active (no stream uses it any more).
    pub fn deactivate(&mut self, requested_bytes: u64) {
        self.counters.active_bytes.sub(requested_bytes);
    }

    /// A cached block of `stream` that fits `block_bytes`, counted as a hit.
    #[inline(always)]
    pub fn take_cached(&mut self, stream: Stream, block_bytes: u64) -> Option<CachedBlock> {
        if self.cache.cached_bytes() == 0 {
            return None; // (always so over the vmm resource, whose blocks are never cached)
        }
        let block = self.cache.take(stream, block_bytes)?;
        self.counters.num_cache_hits += 1;
        Some(block)
    }

    /// True if `block` may be cached (its source's blocks may, and the cache takes its size):
    /// one that may not goes straight back.
    #[inline(always)]
    pub fn cacheable(&self, block: &FreedBlock) -> bool {
        self.sources.cacheable(block.source) && self.cache.takes(block.block_bytes)
    }

    /// True if `block`'s memory is streampool's to hold: it waits for the other streams that
    /// used it before it goes back (graph memory does not).
    #[inline(always)]
    pub fn held(&self, block: &FreedBlock) -> bool {
        self.sources.held(block.source)
    }

    /// Keeps a freed, inactive block in the cache if it may be cached and fits the cache's
    /// budget as it is: the common free, which builds no list. Else the block stays the caller's.
    #[inline(always)]
    pub fn try_keep(&mut self, block: &FreedBlock) -> Kept {
        if !self.cacheable(block) {
            return Kept::NotCacheable;
        }
        if !self.cache.has_room(block.block_bytes) {
            return Kept::OverBudget;
        }
        self.cache.put_in_room(CachedBlock {
            ptr: block.ptr,
            block_bytes: block.block_bytes,
            stream: block.stream,
            source: block.source,
        });
        Kept::Cached
    }

    /// Keeps a freed, inactive block in the cache. What must go back instead leaves the ledger
    /// for `to_return`: the block itself if it does not belong in the cache, and cached blocks
    /// of other streams evicted to make room for it.
    pub fn keep(&mut self, block: FreedBlock, to_return: &mut Vec<Returning>) {
        match self.cacheable(&block) {
            true => self.put_in_cache(block, to_return),
            false => to_return.push(self.release(block)),
        }
    }

    /// [`Ledger::keep`] for a block known to be [`Ledger::cacheable`].
    #[inline]
    pub fn put_in_cache(&mut self, block: FreedBlock, to_return: &mut Vec<Returning>) {
        let mut evicted = Vec::new();
        let cached = CachedBlock {
            ptr: block.ptr,
            block_bytes: block.block_bytes,
            stream: block.stream,
            source: block.source,
        };
        if self.cache.put(cached, &mut evicted).is_err() {
            to_return.push(self.release(block));
        }
        if !evicted.is_empty() {
            to_return.extend(self.take_cached_blocks(evicted));
        }
    }

    /// Gives `block` back to the device's fast own source ([`Sources::fast_own`]) on its fast
    /// path, here, under the device lock: `None` if it is another source's, or the fast path
    /// cannot serve now (then [`Ledger::release`] and a return outside the lock); else the
    /// return's outcome, booked ([`Ledger::record_return`]). The common outcome, a block taken
    /// back, is booked here; a refusal off the hot path (its error, a large value, is not moved
    /// through the bookkeeping).
    #[inline]
    pub fn return_fast(&mut self, block: &FreedBlock) -> Option<Result<()>> {
        let fast = self.sources.fast_own().filter(|f| f.id == block.source)?;
        let held = fast.held;
        let returned = timed_section!(
            "resource try_deallocate",
            fast.resource
                .try_deallocate(block.ptr, block.block_bytes, block.stream)
        );
        match returned? {
            Ok(()) => {
                if held {
                    self.held_bytes -= block.block_bytes;
                }
                self.counters.num_device_frees += 1;
                Some(Ok(()))
            }
            // (Still held: it never left `held_bytes`.)
            Err(e) => Some(Err(self.refused(*block, e))),
        }
    }

    /// A block of `request`'s size from the device's own source for it, on that source's fast
    /// path, reserved against `limit_bytes`; booked live. `None` if there is none at hand, or the
    /// device has no fast own source ([`Sources::fast_own`]: the vmm backend's one resource).
    #[inline(always)]
    pub fn take_fast(
        &mut self,
        request: Request,
        limit_bytes: u64,
    ) -> Option<(DevicePtr, SourceId)> {
        let fast = self.sources.fast_own()?;
        let held_bytes = self.held_bytes.checked_add(request.block_bytes)?;
        if held_bytes > limit_bytes {
            return None;
        }
        let id = fast.id;
        let ptr = timed_section!(
            "resource try_allocate",
            fast.resource
                .try_allocate(request.block_bytes, request.stream)
        )?;
        self.held_bytes = held_bytes;
        self.counters.num_device_allocs += 1;
        self.insert_live(ptr, request, id);
        Some((ptr, id))
    }

    /// A block leaves the ledger on its way back to its source.
    #[inline]
    pub fn release(&mut self, block: FreedBlock) -> Returning {
        if self.held(&block) {
            self.held_bytes -= block.block_bytes;
        }
        let resource = self.sources.get(block.source).ok().map(|s| s.resource);
        Returning { block, resource }
    }

    /// Books the outcome of a return: the block is back at its source, or, refused, held again
    /// in `unreturned` for the next flush to retry. Returns the error.
    pub fn record_return(&mut self, block: FreedBlock, result: Result<()>) -> Result<()> {
        match result {
            Ok(()) => {
                self.returned(block.source);
                Ok(())
            }
            Err(e) => {
                if self.held(&block) {
                    self.held_bytes += block.block_bytes;
                }
                Err(self.refused(block, e))
            }
        }
    }

    /// A block of `source` is back at it.
    #[inline(always)]
    fn returned(&mut self, source: SourceId) {
        self.counters.num_device_frees += 1;
        self.sources.returned(source);
    }

    /// `block`'s return is put off (its stream captures a graph: a free on it would be a node of
    /// the graph): held again, it waits in `unreturned` for the next flush or idle release.
    #[cold]
    pub fn put_off(&mut self, block: FreedBlock) {
        if self.held(&block) {
            self.held_bytes += block.block_bytes;
        }
        self.unreturned.push(block);
    }

    /// The driver refused `block` (held): it waits in `unreturned` for the next flush.
    #[cold]
    fn refused(&mut self, block: FreedBlock, e: Error) -> Error {
        self.unreturned.push(block);
        e
    }

    /// The blocks the driver refused earlier, for another try (they leave the ledger).
    pub fn take_unreturned(&mut self) -> Vec<Returning> {
        let blocks = std::mem::take(&mut self.unreturned);
        blocks.into_iter().map(|b| self.release(b)).collect()
    }

    /// Every cached block of `source`, out of the cache and the ledger.
    pub fn drain_cache_of(&mut self, source: SourceId) -> Vec<Returning> {
        let blocks = self.cache.drain_source(source);
        self.take_cached_blocks(blocks)
    }

    /// Every cached block, out of the cache and the ledger.
    pub fn drain_cache(&mut self) -> Vec<Returning> {
        let blocks = self.cache.drain();
        self.take_cached_blocks(blocks)
    }

    /// Cached blocks worth `wanted_bytes`, those of `prefer_stream` first, out of the ledger.
    pub fn evict(&mut self, wanted_bytes: u64, prefer_stream: Stream) -> Vec<Returning> {
        let blocks = self.cache.evict(wanted_bytes, prefer_stream);
        self.take_cached_blocks(blocks)
    }

    fn take_cached_blocks(&mut self, blocks: Vec<CachedBlock>) -> Vec<Returning> {
        blocks
            .into_iter()
            .map(|b| self.release(FreedBlock::from_cached(b)))
            .collect()
    }

    /// The bytes of every block held (live, cached, unreturned, waiting), by source.
    pub fn held_bytes_by_source<'a>(
        &'a self,
        waiting: impl Iterator<Item = &'a WaitingBlock> + 'a,
    ) -> HashMap<SourceId, u64> {
        let mut by_source: HashMap<SourceId, u64> = HashMap::new();
        let live = self.live.iter().map(|(_, b)| (b.source, b.block_bytes));
        let cached = self.cache.blocks().map(|b| (b.source, b.block_bytes));
        let unreturned = self.unreturned.iter().map(|b| (b.source, b.block_bytes));
        let waiting = waiting.map(|w| (w.block.source, w.block.block_bytes));
        for (source, bytes) in live.chain(cached).chain(unreturned).chain(waiting) {
            let sum = by_source.entry(source).or_default();
            *sum = sum.saturating_add(bytes);
        }
        by_source
    }

    /// Every block held, with what it is used for (waiting blocks come from the waits).
    pub fn blocks<'a>(
        &'a self,
        device: usize,
        waiting: impl Iterator<Item = &'a WaitingBlock> + 'a,
    ) -> Vec<StreampoolBlock> {
        let block =
            |ptr: DevicePtr, block_bytes, requested_bytes, stream: Stream, state| StreampoolBlock {
                address: ptr.0,
                block_bytes,
                requested_bytes,
                stream: stream.0 as u64,
                state: state as u32,
                device: device as i32,
            };
        let live = self.live.iter().map(|(ptr, b)| {
            let ptr = DevicePtr(ptr);
            let state = StreampoolBlockState::Live;
            block(ptr, b.block_bytes, b.requested_bytes, b.stream, state)
        });
        let cached = self
            .cache
            .blocks()
            .map(|b| (b.ptr, b.block_bytes, b.stream));
        let unreturned = self
            .unreturned
            .iter()
            .map(|b| (b.ptr, b.block_bytes, b.stream));
        let inactive = cached.chain(unreturned).map(|(ptr, bytes, stream)| {
            block(ptr, bytes, 0, stream, StreampoolBlockState::Inactive)
        });
        let waiting = waiting.map(|w| {
            let state = StreampoolBlockState::WaitingForStreams;
            block(
                w.block.ptr,
                w.block.block_bytes,
                w.requested_bytes,
                w.block.stream,
                state,
            )
        });
        live.chain(inactive).chain(waiting).collect()
    }
}

//! The ledger of one device: which blocks are live and where each goes back, the cache of freed
//! blocks, the bytes held from the device's resources, and the counters behind the statistics.
//!
//! Invariants (all under the device lock, so a snapshot is consistent): `allocated_bytes` is the
//! sum of requested bytes over live blocks; `held_bytes` is the block bytes of every block held
//! from a resource — live (graph memory aside), cached, waiting for other streams, refused by the
//! driver on return — plus allocations in flight that reserved their bytes ([`Ledger::reserve`]);
//! a block is in exactly one place at a time (live, cache, a wait, unreturned, or back home).

use crate::cache::{Cache, CachedBlock};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::fasthash::WordMap;
use crate::history::{Gauges, StreampoolBlock, StreampoolBlockState};
use crate::stats::DeviceCounters;

/// Where a block goes back to when streampool is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Home {
    /// The device's resource for its size class (cacheable).
    Small,
    Large,
    /// The shareable pool of `streampool.shareable()`: straight back, never cached.
    Shareable,
    /// Graph memory (allocated on a capturing stream): straight back to the driver when freed
    /// (a free node of the graph), never cached, never counted in `held_bytes`.
    Graph,
    /// A block the driver's own pool served because its resource could not map memory during a
    /// capture elsewhere: held (it counts against the memory limit) and waits for the streams
    /// that used it like any block, then goes back to the driver, never to the cache.
    DriverPool,
}

impl Home {
    /// Counted in `held_bytes` (graph memory belongs to its graph, not to streampool).
    #[inline]
    pub(crate) fn is_held(self) -> bool {
        self != Home::Graph
    }
}

#[derive(Debug)]
pub(super) struct LiveBlock {
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub stream: Stream,
    pub home: Home,
    /// Other streams that used the block (record_stream).
    pub recorded_streams: Vec<Stream>,
}

/// A block its caller freed that has not reached its home yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreedBlock {
    pub ptr: DevicePtr,
    pub block_bytes: u64,
    /// Its allocation stream: the one it is returned on.
    pub stream: Stream,
    pub home: Home,
}

impl FreedBlock {
    fn from_cached(b: CachedBlock, home: Home) -> FreedBlock {
        FreedBlock {
            ptr: b.ptr,
            block_bytes: b.block_bytes,
            stream: b.stream,
            home,
        }
    }
}

/// A freed block on its way home after the streams that used it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitingBlock {
    pub block: FreedBlock,
    /// Counted as active until it is handed back.
    pub requested_bytes: u64,
}

#[derive(Debug, Default)]
pub(super) struct Ledger {
    live: WordMap<DevicePtr, LiveBlock>,
    cache: Cache,
    held_bytes: u64,
    counters: DeviceCounters,
    /// Blocks whose return failed; the next flush tries again, so a transient driver error loses
    /// no memory.
    unreturned: Vec<FreedBlock>,
}

impl Ledger {
    /// The cache of a device whose resources were just created (the ledger is empty then).
    pub fn set_cache(&mut self, cache: Cache) {
        debug_assert_eq!(self.cache.cached_bytes(), 0);
        self.cache = cache;
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

    #[inline]
    pub fn insert_live(
        &mut self,
        ptr: DevicePtr,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
        home: Home,
    ) {
        let c = &mut self.counters;
        c.allocated_bytes.add(requested_bytes);
        c.active_bytes.add(requested_bytes);
        c.allocations.add(1);
        c.allocated_bytes_total += requested_bytes;
        c.num_allocs += 1;
        let block = LiveBlock {
            requested_bytes,
            block_bytes,
            stream,
            home,
            recorded_streams: Vec::new(),
        };
        self.live.insert(ptr, block);
    }

    /// Takes `ptr` off the live list (it stays active until it no longer waits for streams).
    #[inline]
    pub fn remove_live(&mut self, ptr: DevicePtr, device: usize) -> Result<LiveBlock> {
        // Not `ok_or`: building the error on every free costs the hot path its drop.
        let Some(block) = self.live.remove(&ptr) else {
            return Err(Error::UnknownPointer { ptr: ptr.0, device });
        };
        let c = &mut self.counters;
        c.allocated_bytes.sub(block.requested_bytes);
        c.allocations.sub(1);
        c.freed_bytes_total += block.requested_bytes;
        c.num_frees += 1;
        Ok(block)
    }

    pub fn live(&self, ptr: DevicePtr) -> Option<&LiveBlock> {
        self.live.get(&ptr)
    }

    /// Notes that `stream` uses the live block `ptr`.
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: Stream, device: usize) -> Result<()> {
        let Some(block) = self.live.get_mut(&ptr) else {
            return Err(Error::UnknownPointer { ptr: ptr.0, device });
        };
        if stream != block.stream && !block.recorded_streams.contains(&stream) {
            block.recorded_streams.push(stream);
        }
        Ok(())
    }

    /// A freed block stops being active (no stream uses it any more).
    pub fn deactivate(&mut self, requested_bytes: u64) {
        self.counters.active_bytes.sub(requested_bytes);
    }

    /// A cached block of `stream` that fits `block_bytes`, counted as a hit.
    #[inline]
    pub fn take_cached(&mut self, stream: Stream, block_bytes: u64) -> Option<CachedBlock> {
        let block = self.cache.take(stream, block_bytes)?;
        self.counters.num_cache_hits += 1;
        Some(block)
    }

    /// Keeps a freed, inactive block in the cache. What must go home instead leaves the ledger
    /// for `homeless`: the block itself if it does not belong in the cache (not cacheable, too
    /// large), and cached blocks of other streams evicted to make room for it (homes by size,
    /// from `home_of`).
    #[inline]
    pub fn keep(
        &mut self,
        block: FreedBlock,
        homeless: &mut Vec<FreedBlock>,
        home_of: impl Fn(u64) -> Home,
    ) {
        let mut evicted = Vec::new();
        let cached = matches!(block.home, Home::Small | Home::Large)
            && self
                .cache
                .put(
                    CachedBlock {
                        ptr: block.ptr,
                        block_bytes: block.block_bytes,
                        stream: block.stream,
                    },
                    &mut evicted,
                )
                .is_ok();
        if !cached {
            self.release(&block);
            homeless.push(block);
        }
        if !evicted.is_empty() {
            homeless.extend(self.take_cached_blocks(evicted, home_of));
        }
    }

    /// True if `block` may be cached (its home takes cached blocks, and the cache blocks of its
    /// size): one that may not goes straight home.
    #[inline]
    pub fn cacheable(&self, block: &FreedBlock) -> bool {
        matches!(block.home, Home::Small | Home::Large) && self.cache.takes(block.block_bytes)
    }

    /// A block leaves the ledger on its way home.
    #[inline]
    pub fn release(&mut self, block: &FreedBlock) {
        if block.home.is_held() {
            self.held_bytes -= block.block_bytes;
        }
    }

    /// Ledger the outcome of sending a block home: on failure it is held again, in `unreturned`,
    /// for the next flush to retry. Returns the error.
    pub fn settle_return(&mut self, block: FreedBlock, result: Result<()>) -> Result<()> {
        match result {
            Ok(()) => {
                self.counters.num_device_frees += 1;
                Ok(())
            }
            Err(e) => {
                if block.home.is_held() {
                    self.held_bytes += block.block_bytes;
                }
                self.unreturned.push(block);
                Err(e)
            }
        }
    }

    /// The blocks the driver refused earlier, for another try (they leave the ledger).
    pub fn take_unreturned(&mut self) -> Vec<FreedBlock> {
        let blocks = std::mem::take(&mut self.unreturned);
        blocks.iter().for_each(|b| self.release(b));
        blocks
    }

    /// Every cached block of the sizes `home` serves, out of the cache and the ledger.
    pub fn drain_cache_sizes(
        &mut self,
        sizes: std::ops::RangeInclusive<u64>,
        home: Home,
    ) -> Vec<FreedBlock> {
        let blocks = self.cache.drain_sizes(sizes);
        self.take_cached_blocks(blocks, |_| home)
    }

    /// Every cached block, out of the cache and the ledger; `home_of` names each one's home by size.
    pub fn drain_cache(&mut self, home_of: impl Fn(u64) -> Home) -> Vec<FreedBlock> {
        let blocks = self.cache.drain();
        self.take_cached_blocks(blocks, home_of)
    }

    /// Cached blocks worth `wanted_bytes`, those of `prefer_stream` first, out of the ledger.
    pub fn evict(
        &mut self,
        wanted_bytes: u64,
        prefer_stream: Stream,
        home_of: impl Fn(u64) -> Home,
    ) -> Vec<FreedBlock> {
        let blocks = self.cache.evict(wanted_bytes, prefer_stream);
        self.take_cached_blocks(blocks, home_of)
    }

    fn take_cached_blocks(
        &mut self,
        blocks: Vec<CachedBlock>,
        home_of: impl Fn(u64) -> Home,
    ) -> Vec<FreedBlock> {
        let blocks: Vec<FreedBlock> = blocks
            .into_iter()
            .map(|b| FreedBlock::from_cached(b, home_of(b.block_bytes)))
            .collect();
        blocks.iter().for_each(|b| self.release(b));
        blocks
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
        let live = self.live.iter().map(|(&ptr, b)| {
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

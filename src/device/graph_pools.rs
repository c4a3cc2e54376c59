//! PyTorch's memory pools on one device (`torch.cuda.graph` captures, `torch.compile`'s CUDA
//! graph trees, `torch.cuda.MemPool`), each a source of the device's table
//! ([`GraphPoolResource`]); which pool an allocation goes to is [`super::pool_routes`]'s.
//!
//! Invariants: a pool's users are counted under the pools' lock in the same section that finds
//! or makes it, so a flush never drops a pool someone is about to use; a pool's blocks carry its
//! source id, are never cached and go back into it only (a block other streams used waits for
//! them first, as any held block); a pool gives back only segments taken while nobody used it,
//! and only after a device synchronisation that began after they were taken; it leaves the
//! table once it holds nothing; the pools' lock is never held while a driver call is made or the
//! device lock is taken.

use super::request::Request;
use super::{DeviceAllocator, StreamFilter};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::foreign::{ForeignFree, ForeignMalloc, ForeignResource};
use crate::resource::graph_pool::{GraphPoolResource, PoolBlock, PoolId, Segment};
use crate::resource::{Resource, SourceId};
use std::collections::HashMap;
use std::sync::Arc;

/// A pool and its place in the device's table of sources.
type Entry = (SourceId, Arc<GraphPoolResource>);

/// Segments taken from pools nobody used, to give back after a synchronisation.
pub(super) type Taken = Vec<(Arc<GraphPoolResource>, Vec<Segment>)>;

#[derive(Default)]
pub(super) struct GraphPools {
    pools: HashMap<PoolId, Entry>,
    /// streampool's own stream of the device, made on first need.
    own_stream: Option<Stream>,
}

impl GraphPools {
    /// The table ids of the pools.
    pub(super) fn source_ids(&self) -> impl Iterator<Item = SourceId> + '_ {
        self.pools.values().map(|(source, _)| *source)
    }

    /// The pools.
    pub(super) fn pool_resources(&self) -> impl Iterator<Item = Arc<GraphPoolResource>> + '_ {
        self.pools.values().map(|(_, pool)| Arc::clone(pool))
    }
}

/// What to do with a pool's count of users when it is found or made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Users {
    /// Leave it (a look-up).
    Keep,
    /// One more, in the same locked section that finds or makes the pool.
    AddOne,
}

impl DeviceAllocator {
    /// Pool `id`, if it exists.
    fn existing_pool(&self, id: PoolId) -> Result<Entry> {
        let pools = self.graph_pools.lock();
        pools
            .pools
            .get(&id)
            .map(|(source, pool)| (*source, Arc::clone(pool)))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {}: no memory pool {id:?} (it was never used, or was released and \
                     emptied)",
                    self.device
                ))
            })
    }

    /// Pool `id`, made now if it does not exist, its users changed as `users` says.
    fn pool_for_use(&self, id: PoolId, users: Users) -> Result<Entry> {
        self.pool_for_use_from(id, users, None)
    }

    /// As [`DeviceAllocator::pool_for_use`]; a pool made now takes its segments from `parent`
    /// (a `MemPool`'s own allocator), else from the device's own resource.
    fn pool_for_use_from(
        &self,
        id: PoolId,
        users: Users,
        parent: Option<Arc<dyn Resource>>,
    ) -> Result<Entry> {
        let own_stream = {
            let pools = self.graph_pools.lock();
            if let Some((source, pool)) = pools.pools.get(&id) {
                if users == Users::AddOne {
                    pool.with(|p| p.incref());
                }
                return Ok((*source, Arc::clone(pool)));
            }
            pools.own_stream
        };
        // Made outside the pools' lock (a driver call, the device lock); a thread that made the
        // same pool meanwhile wins, and this one's source leaves the table again.
        let own = Arc::clone(
            self.setup()?
                .own
                .first()
                .ok_or_else(|| Error::Internal("the device has no resource".into()))?,
        );
        let parent = parent.unwrap_or(own);
        let own_stream = match own_stream {
            Some(s) => s,
            None => self.driver.stream_create(self.device)?,
        };
        let pool = Arc::new(GraphPoolResource::new(
            self.device,
            Arc::clone(&self.driver),
            parent,
            own_stream,
        ));
        let source = self.add_source(Arc::clone(&pool) as Arc<dyn Resource>)?;
        let (entry, lost) = {
            let mut pools = self.graph_pools.lock();
            // The first stream made is the device's for good (another, unused, lives on with the
            // process, as streams the driver makes do).
            pools.own_stream.get_or_insert(own_stream);
            let (entry, lost) = match pools.pools.get(&id) {
                Some((s, p)) => ((*s, Arc::clone(p)), Some(source)),
                None => {
                    pools.pools.insert(id, (source, Arc::clone(&pool)));
                    ((source, pool), None)
                }
            };
            if users == Users::AddOne {
                entry.1.with(|p| p.incref());
            }
            (entry, lost)
        };
        if let Some(unused) = lost {
            self.remove_source(unused)?;
        }
        Ok(entry)
    }

    /// `createOrIncrefPool`: one more user of pool `id` (a `torch.cuda.MemPool`).
    pub fn graph_pool_create_or_incref(&self, id: PoolId) -> Result<()> {
        self.pool_for_use(id, Users::AddOne).map(|_| ())
    }

    /// `createOrIncrefPool` with an allocator of the pool's own (`torch.cuda.MemPool(allocator)`):
    /// a pool made now takes its segments from `parent` and gives them back to it; an existing
    /// pool gets one more user and keeps its source.
    ///
    /// # Safety
    /// As `ForeignResource::new`: a matching pair, callable from any thread while the pool may
    /// hold memory of it, that does not unwind.
    pub unsafe fn graph_pool_create_or_incref_with_allocator(
        &self,
        id: PoolId,
        malloc: ForeignMalloc,
        free: ForeignFree,
    ) -> Result<()> {
        // SAFETY: as the caller promises.
        let parent = unsafe { ForeignResource::new(self.device, malloc, free) };
        self.pool_for_use_from(id, Users::AddOne, Some(Arc::new(parent)))
            .map(|_| ())
    }

    /// How many users pool `id` has (0 for a pool that does not exist).
    pub fn graph_pool_use_count(&self, id: PoolId) -> u32 {
        self.existing_pool(id)
            .map_or(0, |(_, p)| p.with(|p| p.use_count()))
    }

    /// `setNoSplit`: blocks of pool `id` take whole free ranges.
    pub fn graph_pool_set_no_split(&self, id: PoolId) -> Result<()> {
        self.pool_for_use(id, Users::Keep)?
            .1
            .with(|p| p.set_no_split());
        Ok(())
    }

    /// `setUseOnOOM`: whether the pool's free memory may serve allocations outside any pool
    /// that ran out of memory (`DeviceAllocator::allocate_from_oom_pools`). Turning it off
    /// for a pool that does not exist (any more) does nothing.
    pub fn graph_pool_set_use_on_oom(&self, id: PoolId, on: bool) -> Result<()> {
        let pool = match on {
            true => self.pool_for_use(id, Users::Keep)?,
            false => match self.existing_pool(id) {
                Ok(pool) => pool,
                Err(_) => return Ok(()),
            },
        };
        pool.1.with(|p| p.set_use_on_oom(on));
        Ok(())
    }

    /// `beginAllocateToPool`: allocations `filter` claims go to pool `id` (one more user) until
    /// [`DeviceAllocator::end_allocate_to_pool`].
    pub fn begin_allocate_to_pool(&self, id: PoolId, filter: Arc<dyn StreamFilter>) -> Result<()> {
        self.pool_for_use(id, Users::AddOne)?;
        self.routes.begin(id, filter);
        Ok(())
    }

    /// `endAllocateToPool`: the latest route to pool `id` ends.
    pub fn end_allocate_to_pool(&self, id: PoolId) -> Result<()> {
        let filter = self.routes.end(id, self.device)?;
        drop(filter); // PyTorch's std::function copy, destroyed outside every lock
        Ok(())
    }

    /// `releasePool`: one user less. The pool's memory goes back at a synchronising flush once
    /// nobody uses it (its blocks still live stay until freed).
    pub fn release_pool(&self, id: PoolId) -> Result<()> {
        self.existing_pool(id)?.1.with(|p| p.decref())?;
        Ok(())
    }

    /// The pool that claims an allocation on `stream`, if any (PyTorch's filters run here).
    #[inline]
    pub fn graph_pool_claiming(&self, stream: Stream) -> Option<PoolId> {
        self.routes.claim(stream)
    }

    /// Allocates `requested_bytes` on `stream` from pool `id`.
    pub(crate) fn allocate_in_graph_pool(
        &self,
        id: PoolId,
        requested_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.disabling(self.allocate_in_pool(id, requested_bytes, stream))
    }

    /// [`DeviceAllocator::allocate_in_graph_pool`]'s work.
    fn allocate_in_pool(
        &self,
        id: PoolId,
        requested_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.check_enabled()?;
        let request = Request::new(requested_bytes, stream)?;
        let (source, pool) = self.pool_for_use(id, Users::Keep)?;
        if self.driver.is_capturing(self.device, stream)? {
            self.notice_capture(stream)?;
        }
        self.begin_pool_allocation(source, request)?;
        let served = match pool.allocate_block(request.block_bytes, stream) {
            Err(e) if e.is_device_oom() => {
                self.state.lock().ledger.counters_mut().num_alloc_retries += 1;
                if let Err(e) = self.flush(0) {
                    log::warn!("device {}: before the retry: {e}", self.device);
                }
                pool.allocate_block(request.block_bytes, stream)
                    .map_err(|e| match e.is_device_oom() {
                        true => self.out_of_memory(requested_bytes, stream, None),
                        false => e,
                    })
            }
            other => other,
        };
        match served {
            Ok(block) => {
                self.book_pool_block(source, &block, request);
                Ok(block.ptr)
            }
            Err(e) => {
                self.abandon_pool_allocation(source, request);
                Err(e)
            }
        }
    }

    /// An allocation from pool `source` begins: finished waits are collected, the table counts
    /// it, and its bytes are held against the memory limit (a pool's blocks are held, so that
    /// they wait for other streams).
    fn begin_pool_allocation(&self, source: SourceId, request: Request) -> Result<()> {
        let mut to_return = Vec::new();
        let begun = {
            let mut st = self.lock_enabled()?;
            if !st.waits.is_idle() {
                self.collect_waits(&mut st, &mut to_return);
            }
            st.ledger.sources_mut().begin_allocation(source).map(|_| ())
        };
        if !to_return.is_empty() {
            let _ = self.return_blocks(to_return);
        }
        begun?;
        if let Err(e) = self.reserve_within_limit(request) {
            self.state
                .lock()
                .ledger
                .sources_mut()
                .allocation_failed(source);
            return Err(e);
        }
        Ok(())
    }

    fn abandon_pool_allocation(&self, source: SourceId, request: Request) {
        let mut st = self.state.lock();
        st.ledger.unreserve(request.block_bytes);
        st.ledger.sources_mut().allocation_failed(source);
    }

    fn book_pool_block(&self, source: SourceId, block: &PoolBlock, request: Request) {
        let mut st = self.state.lock();
        st.activity += 1;
        // The pool may hand out more than asked (no_split): the record keeps what it holds.
        let request = request.served_by(request.block_bytes.max(block.bytes));
        if block.bytes > request.block_bytes {
            let _ = st
                .ledger
                .reserve(block.bytes - request.block_bytes, u64::MAX);
        }
        st.ledger.insert_live(block.ptr, request, source);
        self.note(
            &st,
            Event::Alloc,
            request.stream,
            block.ptr,
            request.requested_bytes,
        );
    }

    /// After an allocation outside any pool ran out of memory: a free range of a pool marked
    /// `use_on_oom` (`torch.cuda.MemPool(use_on_oom=True)`) serves it if one fits, as in
    /// PyTorch; the block then belongs to that pool. None if none fits.
    pub(crate) fn allocate_from_oom_pools(
        &self,
        requested_bytes: u64,
        stream: Stream,
    ) -> Option<DevicePtr> {
        let request = Request::new(requested_bytes, stream).ok()?;
        let pools: Vec<Entry> = self.graph_pools.lock().pools.values().cloned().collect();
        pools.into_iter().find_map(|(source, pool)| {
            if !pool.with(|p| p.use_on_oom()) {
                return None;
            }
            self.begin_pool_allocation(source, request).ok()?;
            match pool.with(|p| p.take(request.block_bytes, stream)) {
                Some(block) => {
                    self.book_pool_block(source, &block, request);
                    Some(block.ptr)
                }
                None => {
                    self.abandon_pool_allocation(source, request);
                    None
                }
            }
        })
    }

    /// Makes a block of a checkpoint of pool `id` live again, at its old address.
    pub fn restore_in_graph_pool(
        &self,
        id: PoolId,
        ptr: DevicePtr,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.check_enabled()?;
        let (source, pool) = self.existing_pool(id)?;
        let request = Request::new(requested_bytes, stream)?.served_by(block_bytes);
        self.begin_pool_allocation(source, request)?;
        if let Err(e) = pool.with(|p| p.restore(ptr, block_bytes, stream)) {
            self.abandon_pool_allocation(source, request);
            return Err(e);
        }
        let block = PoolBlock {
            ptr,
            bytes: block_bytes,
            stream,
        };
        self.book_pool_block(source, &block, request);
        Ok(ptr)
    }

    /// The live blocks of pool `id`: (address, requested bytes, block bytes, stream).
    pub fn graph_pool_live_blocks(&self, id: PoolId) -> Result<Vec<(DevicePtr, u64, u64, Stream)>> {
        let (_, pool) = self.existing_pool(id)?;
        let blocks: Vec<PoolBlock> = pool.with(|p| p.live_blocks().copied().collect());
        let st = self.state.lock();
        Ok(blocks
            .into_iter()
            .map(|b| {
                let requested = st.ledger.live(b.ptr).map_or(b.bytes, |l| l.requested_bytes);
                (b.ptr, requested, b.bytes, b.stream)
            })
            .collect())
    }

    /// The segments of pool `id`: (address, bytes).
    pub fn graph_pool_segments(&self, id: PoolId) -> Result<Vec<(DevicePtr, u64)>> {
        let (_, pool) = self.existing_pool(id)?;
        Ok(pool.with(|p| p.segments().map(|s| (s.ptr, s.bytes)).collect()))
    }

    /// The ids of the device's pools.
    pub fn graph_pool_ids(&self) -> Vec<PoolId> {
        self.graph_pools.lock().pools.keys().copied().collect()
    }

    /// Before a flush's synchronisation: the free segments of every pool nobody uses, taken out
    /// of the pools (no replay can use them any more: no graph holds the pool).
    pub(super) fn take_unused_pool_segments(&self) -> Taken {
        let pools: Vec<Entry> = self.graph_pools.lock().pools.values().cloned().collect();
        pools
            .into_iter()
            .map(|(_, pool)| {
                let segments = pool.take_free_segments_if_unused();
                (pool, segments)
            })
            .filter(|(_, segments)| !segments.is_empty())
            .collect()
    }

    /// After the synchronisation: the taken segments go back to the device's resource, and pools
    /// left with nothing leave the table. The bytes given back.
    pub(super) fn give_back_pool_segments(&self, taken: Taken) -> Result<u64> {
        let mut released_bytes = 0;
        let mut first_error = Ok(());
        for (pool, segments) in taken {
            match pool.give_back_segments(segments) {
                Ok(bytes) => released_bytes += bytes,
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        let gone: Vec<SourceId> = {
            let mut registry = self.graph_pools.lock();
            let gone: Vec<(PoolId, SourceId)> = registry
                .pools
                .iter()
                .filter(|(_, (_, p))| p.with(|p| p.is_unused() && p.reserved_bytes() == 0))
                .map(|(id, (source, _))| (*id, *source))
                .collect();
            gone.iter()
                .map(|(id, source)| {
                    registry.pools.remove(id);
                    *source
                })
                .collect()
        };
        for source in gone {
            first_error = first_error.and(self.remove_source(source));
        }
        first_error.map(|()| released_bytes)
    }
}

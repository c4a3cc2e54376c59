//! PyTorch's memory pools on one device (`torch.cuda.graph` captures, `torch.compile`'s CUDA
//! graph trees, `torch.cuda.MemPool`): which pool an allocation goes to, and the pools
//! themselves ([`GraphPoolResource`]).
//!
//! Invariants: an allocation goes to a pool only while PyTorch routes to it
//! (`beginAllocateToPool` … `endAllocateToPool`) and the route's filter claims the allocating
//! stream (the routes begun last are asked first, as PyTorch does); a pool block is freed into its
//! pool only, never cached and never handed to other code; a pool gives memory back only after
//! a device synchronisation while nobody uses it, and is forgotten once it holds nothing; the
//! routes' lock is never held while a filter runs or a driver call is made.

use super::books::Home;
use super::{limit, DeviceAllocator};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::graph_pool::{GraphPoolResource, PoolBlock, PoolId};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Decides whether an allocation on a stream goes to a pool (PyTorch's capture filter: "is this
/// stream capturing into my graph", or "is this my thread").
pub trait StreamFilter: Send + Sync {
    fn claims(&self, stream: Stream) -> bool;
}

/// A pool and the filter that routes allocations to it.
pub type Route = (PoolId, Arc<dyn StreamFilter>);

/// The device's own number for a pool, what a block's record carries (small, so the records of
/// every block stay small): given at the pool's creation, never reused.
pub(crate) type PoolSlot = u32;

#[derive(Default)]
pub(super) struct GraphPools {
    pools: HashMap<PoolId, (PoolSlot, Arc<GraphPoolResource>)>,
    slots: HashMap<PoolSlot, Arc<GraphPoolResource>>,
    next_slot: PoolSlot,
    /// Routes begun and not ended, oldest first.
    routes: Vec<Route>,
    /// streampool's own stream of the device, made on first need.
    own_stream: Option<Stream>,
}

impl DeviceAllocator {
    /// The pool `id`, made now (with no user) if `create`.
    fn graph_pool(&self, id: PoolId, create: bool) -> Result<Arc<GraphPoolResource>> {
        self.graph_pool_and_slot(id, create).map(|(_, pool)| pool)
    }

    /// The pool `id` and its slot, made now (with no user) if `create`.
    fn graph_pool_and_slot(
        &self,
        id: PoolId,
        create: bool,
    ) -> Result<(PoolSlot, Arc<GraphPoolResource>)> {
        let mut pools = self.graph_pools.lock();
        if let Some((slot, pool)) = pools.pools.get(&id) {
            return Ok((*slot, Arc::clone(pool)));
        }
        if !create {
            return Err(Error::InvalidArgument(format!(
                "device {}: no memory pool {id:?}",
                self.device
            )));
        }
        let parent = self.resources()?.large_resource();
        let own_stream = match pools.own_stream {
            Some(s) => s,
            None => *pools
                .own_stream
                .insert(self.driver.stream_create(self.device)?),
        };
        let pool = Arc::new(GraphPoolResource::new(
            self.device,
            Arc::clone(&self.driver),
            parent,
            own_stream,
        ));
        let slot = pools.next_slot;
        pools.next_slot = slot
            .checked_add(1)
            .ok_or_else(|| Error::Internal("more memory pools than a device can number".into()))?;
        pools.pools.insert(id, (slot, Arc::clone(&pool)));
        pools.slots.insert(slot, Arc::clone(&pool));
        Ok((slot, pool))
    }

    /// `createOrIncrefPool`: one more user of pool `id` (a `torch.cuda.MemPool`).
    pub fn graph_pool_create_or_incref(&self, id: PoolId) -> Result<()> {
        self.graph_pool(id, true)?.with(|p| p.incref());
        Ok(())
    }

    /// How many users pool `id` has (0 for a pool that does not exist).
    pub fn graph_pool_use_count(&self, id: PoolId) -> u32 {
        self.graph_pool(id, false)
            .map_or(0, |p| p.with(|p| p.use_count()))
    }

    /// `setNoSplit`: blocks of pool `id` take whole free ranges.
    pub fn graph_pool_set_no_split(&self, id: PoolId) -> Result<()> {
        self.graph_pool(id, true)?.with(|p| p.set_no_split());
        Ok(())
    }

    /// `setUseOnOOM`: whether the pool's free memory may serve allocations outside any pool
    /// that ran out of memory ([`DeviceAllocator::allocate_from_oom_pools`]).
    pub fn graph_pool_set_use_on_oom(&self, id: PoolId, on: bool) -> Result<()> {
        self.graph_pool(id, true)?.with(|p| p.set_use_on_oom(on));
        Ok(())
    }

    /// `beginAllocateToPool`: allocations `filter` claims go to pool `id` (one more user) until
    /// [`DeviceAllocator::end_allocate_to_pool`].
    pub fn begin_allocate_to_pool(&self, id: PoolId, filter: Arc<dyn StreamFilter>) -> Result<()> {
        self.graph_pool(id, true)?.with(|p| p.incref());
        self.graph_pools.lock().routes.push((id, filter));
        self.routes_active.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// `endAllocateToPool`: the latest route to pool `id` ends.
    pub fn end_allocate_to_pool(&self, id: PoolId) -> Result<()> {
        let mut pools = self.graph_pools.lock();
        let Some(at) = pools.routes.iter().rposition(|(route, _)| *route == id) else {
            return Err(Error::InvalidArgument(format!(
                "device {}: allocations are not being routed to memory pool {id:?}",
                self.device
            )));
        };
        pools.routes.remove(at);
        self.routes_active.fetch_sub(1, Ordering::Release);
        Ok(())
    }

    /// `releasePool`: one user less. The pool's memory goes back at the next synchronising
    /// flush once nobody uses it (its blocks still live stay until freed).
    pub fn release_pool(&self, id: PoolId) -> Result<()> {
        self.graph_pool(id, false)?.with(|p| p.decref())?;
        Ok(())
    }

    /// The routes begun on the device, oldest first; None (one atomic load) when there are none.
    #[inline]
    pub fn graph_pool_routes(&self) -> Option<Vec<Route>> {
        if self.routes_active.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.graph_pools.lock().routes.clone())
    }

    /// Allocates `requested_bytes` on `stream` from pool `id`.
    pub fn allocate_in_graph_pool(
        &self,
        id: PoolId,
        requested_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.check_enabled()?;
        let block_bytes = limit::block_bytes(requested_bytes)?;
        let (slot, pool) = self.graph_pool_and_slot(id, true)?;
        if self.driver.is_capturing(self.device, stream)? {
            // Blocks freed meanwhile with other streams' uses wait for the capture to end.
            self.state.lock().waits.note_capturing(stream);
        }
        let block = match pool.allocate(block_bytes, stream) {
            Err(e) if e.is_device_oom() => {
                self.state.lock().books.counters_mut().num_alloc_retries += 1;
                if let Err(e) = self.flush(0) {
                    log::warn!("device {}: before the retry: {e}", self.device);
                }
                pool.allocate(block_bytes, stream)
                    .map_err(|e| match e.is_device_oom() {
                        true => self.out_of_memory(requested_bytes, stream, None),
                        false => e,
                    })?
            }
            other => other?,
        };
        self.book_pool_block(slot, &block, requested_bytes);
        Ok(block.ptr)
    }

    fn book_pool_block(&self, slot: PoolSlot, block: &PoolBlock, requested_bytes: u64) {
        let mut st = self.state.lock();
        st.activity += 1;
        st.books.insert_live(
            block.ptr,
            requested_bytes,
            block.bytes,
            block.stream,
            Home::GraphPool(slot),
        );
        self.note(&st, Event::Alloc, block.stream, block.ptr, requested_bytes);
    }

    /// After an allocation outside any pool ran out of memory: a free range of a pool marked
    /// `use_on_oom` (`torch.cuda.MemPool(use_on_oom=True)`) serves it if one fits, as in
    /// PyTorch; the block then belongs to that pool. None if none fits.
    pub fn allocate_from_oom_pools(
        &self,
        requested_bytes: u64,
        stream: Stream,
    ) -> Option<DevicePtr> {
        let block_bytes = limit::block_bytes(requested_bytes).ok()?;
        let pools: Vec<(PoolSlot, Arc<GraphPoolResource>)> = self
            .graph_pools
            .lock()
            .slots
            .iter()
            .map(|(slot, p)| (*slot, Arc::clone(p)))
            .collect();
        pools.into_iter().find_map(|(slot, pool)| {
            let block = pool.with(|p| p.use_on_oom().then(|| p.take(block_bytes, stream)))??;
            self.book_pool_block(slot, &block, requested_bytes);
            Some(block.ptr)
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
        let (slot, pool) = self.graph_pool_and_slot(id, false)?;
        pool.with(|p| p.restore(ptr, block_bytes, stream))?;
        let block = PoolBlock {
            ptr,
            bytes: block_bytes,
            stream,
        };
        self.book_pool_block(slot, &block, requested_bytes);
        Ok(ptr)
    }

    /// The live blocks of pool `id`: (address, requested bytes, block bytes, stream).
    pub fn graph_pool_live_blocks(&self, id: PoolId) -> Result<Vec<(DevicePtr, u64, u64, Stream)>> {
        let pool = self.graph_pool(id, false)?;
        let blocks: Vec<PoolBlock> = pool.with(|p| p.live_blocks().copied().collect());
        let st = self.state.lock();
        Ok(blocks
            .into_iter()
            .map(|b| {
                let requested = st.books.live(b.ptr).map_or(b.bytes, |l| l.requested_bytes);
                (b.ptr, requested, b.bytes, b.stream)
            })
            .collect())
    }

    /// The segments of pool `id` and its live blocks, for snapshots.
    pub fn graph_pool_segments(&self, id: PoolId) -> Result<Vec<(DevicePtr, u64)>> {
        let pool = self.graph_pool(id, false)?;
        Ok(pool.with(|p| p.segments().map(|s| (s.ptr, s.bytes)).collect()))
    }

    /// A freed block goes back into the pool of `slot`.
    pub(super) fn return_to_graph_pool(&self, slot: PoolSlot, ptr: DevicePtr) -> Result<()> {
        let pool = self.graph_pools.lock().slots.get(&slot).cloned();
        pool.ok_or_else(|| Error::Internal(format!("{ptr:#x}: its memory pool is gone")))?
            .deallocate(ptr)
    }

    /// After a device synchronisation: pools nobody uses give their free segments back, and
    /// those left with nothing are forgotten. Returns the bytes given back.
    pub(super) fn release_unused_graph_pools(&self) -> Result<u64> {
        let pools: Vec<Arc<GraphPoolResource>> =
            self.graph_pools.lock().slots.values().cloned().collect();
        let mut released_bytes = 0;
        let mut first_error = Ok(());
        for pool in &pools {
            match pool.release_free_segments() {
                Ok(bytes) => released_bytes += bytes,
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        let gone = |p: &GraphPoolResource| p.with(|p| p.is_unused() && p.reserved_bytes() == 0);
        let mut pools = self.graph_pools.lock();
        pools.pools.retain(|_, (_, p)| !gone(p));
        pools.slots.retain(|_, p| !gone(p));
        first_error.map(|()| released_bytes)
    }
}

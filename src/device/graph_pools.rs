//! PyTorch's memory pools on one device (`torch.cuda.graph` captures, `torch.compile`'s CUDA
//! graph trees, `torch.cuda.MemPool`): which pool an allocation goes to, and the pools, each a
//! source of the device's table ([`GraphPoolResource`]).
//!
//! Invariants: an allocation goes to a pool only while PyTorch routes to it
//! (`beginAllocateToPool` … `endAllocateToPool`) and the route's filter claims the allocating
//! stream (the routes begun last are asked first, as PyTorch does); a pool's blocks carry its
//! source id, are never cached and go back into it only (a block other streams used waits for
//! them first, as any held block); a pool gives memory back only after a device synchronisation
//! while nobody uses it, and leaves the table once it holds nothing; the pools' lock is never
//! held while a filter runs, a driver call is made or the device lock is taken.

use super::request::Request;
use super::DeviceAllocator;
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::graph_pool::{GraphPoolResource, PoolBlock, PoolId};
use crate::resource::{Resource, SourceId};
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

/// A pool and its place in the device's table of sources.
type Entry = (SourceId, Arc<GraphPoolResource>);

#[derive(Default)]
pub(super) struct GraphPools {
    pools: HashMap<PoolId, Entry>,
    /// Routes begun and not ended, oldest first.
    routes: Vec<Route>,
    /// streampool's own stream of the device, made on first need.
    own_stream: Option<Stream>,
}

impl DeviceAllocator {
    /// The pool `id` and its source id, made now (with no user) if `create`.
    fn graph_pool(&self, id: PoolId, create: bool) -> Result<Entry> {
        let own_stream = {
            let pools = self.graph_pools.lock();
            if let Some((source, pool)) = pools.pools.get(&id) {
                return Ok((*source, Arc::clone(pool)));
            }
            pools.own_stream
        };
        if !create {
            return Err(Error::InvalidArgument(format!(
                "device {}: no memory pool {id:?}",
                self.device
            )));
        }
        // Made outside the pools' lock (a driver call, the device lock); a thread that made the
        // same pool meanwhile wins, and this one's source leaves the table again.
        let parent = Arc::clone(
            self.setup()?
                .own
                .first()
                .ok_or_else(|| Error::Internal("the device has no resource".into()))?,
        );
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
            // The first stream made is the device's for good (a later one, unused, is leaked
            // with the process, as streams made by the driver are).
            pools.own_stream.get_or_insert(own_stream);
            match pools.pools.get(&id) {
                Some((s, p)) => ((*s, Arc::clone(p)), Some(source)),
                None => {
                    pools.pools.insert(id, (source, Arc::clone(&pool)));
                    ((source, pool), None)
                }
            }
        };
        if let Some(unused) = lost {
            self.remove_source(unused)?;
        }
        Ok(entry)
    }

    /// `createOrIncrefPool`: one more user of pool `id` (a `torch.cuda.MemPool`).
    pub fn graph_pool_create_or_incref(&self, id: PoolId) -> Result<()> {
        self.graph_pool(id, true)?.1.with(|p| p.incref());
        Ok(())
    }

    /// How many users pool `id` has (0 for a pool that does not exist).
    pub fn graph_pool_use_count(&self, id: PoolId) -> u32 {
        self.graph_pool(id, false)
            .map_or(0, |(_, p)| p.with(|p| p.use_count()))
    }

    /// `setNoSplit`: blocks of pool `id` take whole free ranges.
    pub fn graph_pool_set_no_split(&self, id: PoolId) -> Result<()> {
        self.graph_pool(id, true)?.1.with(|p| p.set_no_split());
        Ok(())
    }

    /// `setUseOnOOM`: whether the pool's free memory may serve allocations outside any pool
    /// that ran out of memory ([`DeviceAllocator::allocate_from_oom_pools`]).
    pub fn graph_pool_set_use_on_oom(&self, id: PoolId, on: bool) -> Result<()> {
        self.graph_pool(id, true)?.1.with(|p| p.set_use_on_oom(on));
        Ok(())
    }

    /// `beginAllocateToPool`: allocations `filter` claims go to pool `id` (one more user) until
    /// [`DeviceAllocator::end_allocate_to_pool`].
    pub fn begin_allocate_to_pool(&self, id: PoolId, filter: Arc<dyn StreamFilter>) -> Result<()> {
        self.graph_pool(id, true)?.1.with(|p| p.incref());
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
        self.graph_pool(id, false)?.1.with(|p| p.decref())?;
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
        let request = Request::new(requested_bytes, stream)?;
        let (source, pool) = self.graph_pool(id, true)?;
        if self.driver.is_capturing(self.device, stream)? {
            // Blocks freed meanwhile with other streams' uses wait for the capture to end.
            self.state.lock().waits.note_capturing(stream);
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

    /// An allocation from pool `source` begins: counted by the table, its bytes held against
    /// the memory limit (a pool's blocks are held, so that they wait for other streams).
    fn begin_pool_allocation(&self, source: SourceId, request: Request) -> Result<()> {
        self.lock_enabled()?
            .ledger
            .sources_mut()
            .begin_allocation(source)?;
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
    pub fn allocate_from_oom_pools(
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
        let (source, pool) = self.graph_pool(id, false)?;
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
        let (_, pool) = self.graph_pool(id, false)?;
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
        let (_, pool) = self.graph_pool(id, false)?;
        Ok(pool.with(|p| p.segments().map(|s| (s.ptr, s.bytes)).collect()))
    }

    /// After a device synchronisation: pools nobody uses give their free segments back, and
    /// those left with nothing leave the table. Returns the bytes given back.
    pub(super) fn release_unused_graph_pools(&self) -> Result<u64> {
        let pools: Vec<Entry> = self.graph_pools.lock().pools.values().cloned().collect();
        let mut released_bytes = 0;
        let mut first_error = Ok(());
        for (_, pool) in &pools {
            match pool.release_free_segments() {
                Ok(bytes) => released_bytes += bytes,
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        let gone: Vec<(PoolId, SourceId)> = {
            let mut registry = self.graph_pools.lock();
            let gone: Vec<(PoolId, SourceId)> = registry
                .pools
                .iter()
                .filter(|(_, (_, p))| p.with(|p| p.is_unused() && p.reserved_bytes() == 0))
                .map(|(id, (source, _))| (*id, *source))
                .collect();
            gone.iter().for_each(|(id, _)| {
                registry.pools.remove(id);
            });
            gone
        };
        for (_, source) in gone {
            first_error = first_error.and(self.remove_source(source));
        }
        first_error.map(|()| released_bytes)
    }
}

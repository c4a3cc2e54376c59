//! The device's side of PyTorch's memory pools ([`super::graph_pools`]): a pool's blocks in the
//! ledger — allocated in a pool (with the memory limit, a retry after a flush and the typed
//! out-of-memory error), taken from a pool marked `use_on_oom` after an allocation outside any
//! pool ran out, made live again at a checkpoint's address — and what the pools need of the
//! device ([`PoolDevice`]).
//!
//! Invariants: a pool's blocks carry its source id, are never cached and go back into it only
//! (a block other streams used waits for them first, as any held block); an allocation in a pool
//! counts as one of its users while it runs; one the pool refuses leaves the ledger as it was
//! (its bytes unreserved, its source's count undone).

use super::graph_pools::{Entry, PoolDevice, Users};
use super::request::Request;
use super::DeviceAllocator;
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::graph_pool::{GraphPoolResource, PoolBlock, PoolId, SegmentLimit};
use crate::resource::{Resource, SourceId};
use std::sync::Arc;

impl PoolDevice for DeviceAllocator {
    fn add_source(&self, resource: Arc<dyn Resource>) -> Result<SourceId> {
        DeviceAllocator::add_source(self, resource)
    }

    fn remove_source(&self, id: SourceId) -> Result<()> {
        DeviceAllocator::remove_source(self, id)
    }

    fn own_resource(&self) -> Result<Arc<dyn Resource>> {
        let own = self.setup()?.own.first();
        own.cloned()
            .ok_or_else(|| Error::Internal("the device has no resource".into()))
    }

    fn segment_limit(&self) -> Result<SegmentLimit> {
        Ok(SegmentLimit {
            limit_bytes: Arc::clone(self.limit.shared()),
            own: self.setup()?.own.clone(),
        })
    }
}

/// An allocation under way in a pool; ended when dropped.
struct AllocatingIn<'a>(&'a GraphPoolResource);

impl Drop for AllocatingIn<'_> {
    fn drop(&mut self) {
        self.0.with(|p| p.end_allocating());
    }
}

impl DeviceAllocator {
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
        // Asleep, a pool's free blocks lie on pages given back: none is handed out.
        self.refuse_while_asleep()?;
        // Counted in the pool while it runs: a flush meanwhile (another thread's) leaves the
        // pool in the table, rather than drop a pool about to get a new segment (which nothing
        // would give back then). Ended however this returns (a panic included).
        let entry = self.graph_pools.for_use(id, Users::Allocating, None)?;
        let _under_way = AllocatingIn(&entry.1);
        self.allocate_in_held_pool(&entry, request, stream)
    }

    /// [`DeviceAllocator::allocate_in_pool`] with the pool held.
    fn allocate_in_held_pool(
        &self,
        (source, pool): &Entry,
        request: Request,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let (source, requested_bytes) = (*source, request.requested_bytes);
        if self.captures(stream)? {
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
        if let Err(e) = self.limit.reserve(self, request) {
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
        // Taken from a resource (the pool), as a block from the device's own is: the free back
        // into it counts as a device free.
        st.ledger.counters_mut().num_device_allocs += 1;
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
        // Asleep, their free blocks lie on pages given back.
        self.refuse_while_asleep().ok()?;
        let pools: Vec<Entry> = self.graph_pools.entries();
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
        // Asleep, the block's pages are given back: it is not made live on them.
        self.refuse_while_asleep()?;
        let (source, pool) = self.graph_pools.existing(id)?;
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
        let (_, pool) = self.graph_pools.existing(id)?;
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
}

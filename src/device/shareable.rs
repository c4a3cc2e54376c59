//! Shareable memory of one device: allocations inside `streampool.shareable()` (or every one,
//! with `STREAMPOOL_IPC`) and their export to other processes.
//!
//! Invariants: a shareable block comes from the shareable pool, never from the cache, and goes
//! straight back to it; only a live block of a shareable pool is exported; the shareable pool's
//! bytes count against the memory limit like any other.

use super::ledger::Home;
use super::DeviceAllocator;
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::ipc::StreampoolIpcHandle;
use crate::resource::cuda_pool::CudaPoolResource;
use crate::resource::Resource;
use std::sync::Arc;

impl DeviceAllocator {
    /// Inside `streampool.shareable()`: straight from the shareable pool, never from the cache.
    pub(super) fn allocate_shareable(
        &self,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let pool = self.shareable_pool()?;
        self.reserve_within_limit(requested_bytes, block_bytes, stream)?;
        let ptr = match self.allocate_or_retry(pool.as_ref(), requested_bytes, block_bytes, stream)
        {
            Ok(ptr) => ptr,
            Err(e) => {
                self.state.lock().ledger.unreserve(block_bytes);
                return Err(e);
            }
        };
        let mut st = self.state.lock();
        st.ledger.counters_mut().num_device_allocs += 1;
        st.ledger
            .insert_live(ptr, requested_bytes, block_bytes, stream, Home::Shareable);
        self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
        self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
        Ok(ptr)
    }

    /// The pool of `streampool.shareable()`, created on first use (the device's own pool with
    /// `STREAMPOOL_IPC`); other devices get access to it as `STREAMPOOL_PEER_ACCESS` says.
    pub(super) fn shareable_pool(&self) -> Result<Arc<dyn Resource>> {
        let resources = self.resources()?;
        self.exporter.pool(|| {
            if self.config.ipc {
                return Ok(Arc::clone(resources.all().next().expect("a resource")));
            }
            let total_bytes = self.provisioned()?.total_bytes;
            let pool = CudaPoolResource::create(
                &self.driver,
                self.device,
                &self.config,
                total_bytes,
                true,
                "shareable pool",
            )?;
            let pool: Arc<dyn Resource> = Arc::new(pool);
            if let Some(target) = crate::resource::peer_target(&pool) {
                self.peers
                    .extra_pool(self.driver.as_ref(), self.device, target);
            }
            Ok(pool)
        })
    }

    /// What another process needs to map the live shareable block at `ptr`; see [`Exporter`].
    pub fn export(&self, ptr: DevicePtr, stream: Stream) -> Result<StreampoolIpcHandle> {
        let (block_bytes, home) = {
            let st = self.state.lock();
            let b = st.ledger.live(ptr).ok_or(Error::UnknownPointer {
                ptr: ptr.0,
                device: self.device,
            })?;
            (b.block_bytes, b.home)
        };
        let shareable = home == Home::Shareable || (self.config.ipc && home == Home::Large);
        if !shareable {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} on device {} is not in a shareable pool: allocate it inside \
                 `with streampool.shareable():`, or install with streampool.install(ipc=True) \
                 (STREAMPOOL_IPC=1) to make every allocation shareable",
                self.device
            )));
        }
        let pool = self.shareable_pool()?;
        self.exporter
            .export(pool.as_ref(), ptr, block_bytes, stream)
    }

    pub fn release_export(&self, event: u64) -> Result<()> {
        self.exporter.release(event)
    }
}

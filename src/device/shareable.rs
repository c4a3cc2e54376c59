//! Shareable memory of one device: allocations inside `streampool.shareable()` (or every one,
//! with `STREAMPOOL_IPC`) and their export to other processes.
//!
//! Invariants: a shareable block comes from the shareable pool — a source of the device's table,
//! created on first use — never from the cache, and goes straight back to it; only a live block
//! of a shareable source is exported through its pool, and a live block of a source whose pages
//! export (the vmm backend) through its pages; the shareable pool's bytes count against the
//! memory limit like any other.

use super::{limit, DeviceAllocator, DeviceSetup, Request};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::ipc::{IpcKind, StreampoolIpcHandle, StreampoolIpcPages};
use crate::resource::{peer_target, Resource, Source};
use std::sync::Arc;

impl DeviceAllocator {
    /// Inside `streampool.shareable()`: straight from the shareable pool, never from the cache.
    pub(super) fn allocate_shareable(&self, request: Request) -> Result<DevicePtr> {
        self.refuse_while_asleep()?;
        let pool = self.begin_shareable_allocation()?;
        if let Err(e) = self.limit.reserve(self, request) {
            self.abandon(&pool, request, false);
            return Err(e);
        }
        let allocate = || pool.allocate(request.block_bytes, request.stream);
        let ptr = match limit::allocate_or_retry(self, request, allocate) {
            Ok(ptr) => ptr,
            Err(e) => {
                self.abandon(&pool, request, true);
                return Err(e);
            }
        };
        self.book_served(&mut self.state.lock(), ptr, request, pool.id);
        Ok(ptr)
    }

    /// An allocation from the shareable pool begins; the pool is created on first use (the
    /// device's own pool with `STREAMPOOL_IPC`), and other devices get access to it as
    /// `STREAMPOOL_PEER_ACCESS` says.
    fn begin_shareable_allocation(&self) -> Result<Source> {
        let begin = || -> Option<Result<Source>> {
            let mut st = self.state.lock();
            st.activity += 1; // (an allocation: the device is not idle)
            let id = st.ledger.sources().shareable()?;
            Some(st.ledger.sources_mut().begin_allocation(id))
        };
        if let Some(begun) = begin() {
            return begun;
        }
        let settings = self.setup()?.settings.sources.pool;
        let _creating = self.creating.lock();
        // Another thread may have made it meanwhile.
        if let Some(begun) = begin() {
            return begun;
        }
        let pool = crate::resource::shareable_pool(&self.driver, self.device, &settings)?;
        if let Some(target) = peer_target(&pool) {
            self.peers
                .extra_pool(self.driver.as_ref(), self.device, target);
        }
        let mut st = self.state.lock();
        let sources = st.ledger.sources_mut();
        let id = sources.add(pool);
        sources.set_shareable(id);
        sources.begin_allocation(id)
    }

    /// What another process needs to map the live shareable block at `ptr`; see
    /// [`crate::ipc::export::Exporter`].
    pub fn export(&self, ptr: DevicePtr, stream: Stream) -> Result<StreampoolIpcHandle> {
        let (block_bytes, source) = self.live_block_source(ptr)?;
        if !source.traits().shareable {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} on device {} is not in a shareable pool: allocate it inside \
                 `with streampool.shareable():`, or install with streampool.install(ipc=True) \
                 (STREAMPOOL_IPC=1) to make every allocation shareable",
                self.device
            )));
        }
        self.disabling(self.exporter.export(&*source, ptr, block_bytes, stream))
    }

    /// How the live block at `ptr` can be shared: through its pool, its pages, or not at all.
    pub fn ipc_kind(&self, ptr: DevicePtr) -> Result<IpcKind> {
        let (_, source) = self.live_block_source(ptr)?;
        Ok(match source.traits().shareable {
            true => IpcKind::Pool,
            false if source.capabilities().page_export.is_some() => IpcKind::Pages,
            false => IpcKind::None,
        })
    }

    /// [`DeviceAllocator::export`] for a block whose pages export (the vmm backend).
    pub fn export_pages(
        &self,
        ptr: DevicePtr,
        stream: Stream,
    ) -> Result<(StreampoolIpcPages, Vec<i32>)> {
        self.export_pages_within(ptr, stream, usize::MAX)
    }

    /// [`DeviceAllocator::export_pages`] into room for `max_fds` descriptors: a block on more
    /// pages is refused with nothing left open or marked.
    pub fn export_pages_within(
        &self,
        ptr: DevicePtr,
        stream: Stream,
        max_fds: usize,
    ) -> Result<(StreampoolIpcPages, Vec<i32>)> {
        let (block_bytes, source) = self.live_block_source(ptr)?;
        if source.capabilities().page_export.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} on device {} is not in memory whose pages can be shared (the vmm \
                 backend's, on a device with POSIX file descriptor handles)",
                self.device
            )));
        }
        let exported = self
            .exporter
            .export_pages(&*source, ptr, block_bytes, stream, max_fds);
        self.disabling(exported)
    }

    /// The shareable pool where it is a pool of its own (not an own resource, as it is with
    /// `STREAMPOOL_IPC`), if it was made: what the device's own resources' trims and peak resets
    /// leave out.
    pub(super) fn shareable_apart(&self, setup: &DeviceSetup) -> Option<Arc<dyn Resource>> {
        let pool = {
            let st = self.state.lock();
            let sources = st.ledger.sources();
            sources.get(sources.shareable()?).ok()?.resource
        };
        let own = setup.own.iter().any(|r| Arc::ptr_eq(r, &pool));
        (!own).then_some(pool)
    }

    /// The block bytes and source of the live block at `ptr`.
    fn live_block_source(&self, ptr: DevicePtr) -> Result<(u64, Source)> {
        let st = self.state.lock();
        let Some(b) = st.ledger.live(ptr) else {
            return Err(Error::UnknownPointer {
                ptr: ptr.0,
                device: self.device,
            });
        };
        Ok((b.block_bytes, st.ledger.sources().get(b.source)?))
    }

    pub fn release_export(&self, event: u64) -> Result<()> {
        let Some((ptr, mark)) = self.exporter.release(event)? else {
            return Ok(());
        };
        // Every importer closed it: its pages no longer keep the device awake. (A block freed
        // since has no count left; one allocated at its address since, its own: the mark.)
        if let Ok((_, source)) = self.live_block_source(ptr) {
            if let Some(export) = source.capabilities().page_export {
                export.unmark_exported(ptr, mark);
            }
        }
        Ok(())
    }
}

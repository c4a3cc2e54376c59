//! The allocation pipeline of one device, in the order it is applied:
//!
//! 1. a stream that is being captured into a CUDA graph gets graph memory, never cached memory
//!    ([`waits`]); inside `streampool.shareable()`, the shareable pool serves ([`crate::ipc`]);
//! 2. a block freed earlier on the same stream is reused from the cache (no driver call);
//! 3. the memory limit (`set_memory_fraction`) is enforced: the block's bytes are reserved
//!    against it in the same lock section as the check ([`limit`]);
//! 4. before a resource that cannot reuse cached blocks would grow, they go back to it, and
//!    (trim_on_growth) it releases what it does not use once the stream has caught up
//!    ([`growth`]);
//! 5. the block's resource serves it ([`crate::resource`]);
//! 6. out of memory: flush the cache, synchronise, trim, retry once, then report ([`limit`]).
//!
//! A free goes the other way: a block other streams used waits for them ([`waits`]); then it is
//! cached for its stream, or sent home to its resource.
//!
//! Invariants: the books ([`books`]) and waits sit behind one mutex per device, held for map and
//! counter updates and non-blocking driver queries only, never across a call that can wait for
//! the GPU or allocate device memory; a block passed to record_stream is reused only after events
//! recorded on those streams have completed.

mod books;
mod growth;
mod limit;
mod waits;

use crate::cache::Cache;
use crate::config::{Backend, Config};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::history::{Recorder, StreampoolBlock, StreampoolEventKind as Event};
use crate::ipc::export::Exporter;
use crate::ipc::StreampoolIpcHandle;
use crate::peer::Peers;
use crate::resource::cuda_pool::CudaPoolResource;
use crate::resource::{Accessible, Resource, Resources, SizeClass};
use crate::stats::{DeviceFigures, StreampoolStats};
use crate::sync::{Mutex, MutexGuard, OnceCell};
use books::{Books, FreedBlock, Home};
use growth::GrowthMarks;
use limit::Limit;
use std::sync::Arc;
use waits::{WaitingBlock, Waits};

/// The device's resources and what was learnt when they were made.
struct Provisioned {
    resources: Resources,
    total_bytes: u64,
}

/// What the device lock guards.
struct DeviceState {
    books: Books,
    waits: Waits,
    growth: GrowthMarks,
}

pub struct DeviceAllocator {
    device: usize,
    driver: Arc<dyn Driver>,
    config: Arc<Config>,
    provisioned: OnceCell<Provisioned>,
    provisioning: Mutex<()>,
    state: Mutex<DeviceState>,
    limit: Limit,
    recorder: Recorder,
    exporter: Exporter,
    peers: Arc<Peers>,
}

impl Home {
    fn of(class: SizeClass) -> Home {
        match class {
            SizeClass::Small => Home::Small,
            SizeClass::Large => Home::Large,
        }
    }
}

impl DeviceAllocator {
    pub fn new(
        device: usize,
        driver: Arc<dyn Driver>,
        config: Arc<Config>,
        recorder: Recorder,
        peers: Arc<Peers>,
    ) -> DeviceAllocator {
        DeviceAllocator {
            device,
            exporter: Exporter::new(device, Arc::clone(&driver)),
            driver,
            config,
            provisioned: OnceCell::new(),
            provisioning: Mutex::new(()),
            state: Mutex::new(DeviceState {
                books: Books::default(),
                waits: Waits::default(),
                growth: GrowthMarks::default(),
            }),
            limit: Limit::default(),
            recorder,
            peers,
        }
    }

    /// The device's resources, created on first use.
    fn provisioned(&self) -> Result<&Provisioned> {
        if let Some(p) = self.provisioned.get() {
            return Ok(p);
        }
        let _creating = self.provisioning.lock();
        if let Some(p) = self.provisioned.get() {
            return Ok(p);
        }
        let total_bytes = self.driver.mem_info(self.device)?.total_bytes;
        let resources = Resources::create(&self.driver, self.device, &self.config, total_bytes)?;
        let own: Vec<Arc<dyn Accessible>> = resources.all().map(|r| Arc::clone(r) as _).collect();
        self.peers
            .pools_created(self.driver.as_ref(), self.device, &own);
        let mut max_block_bytes = self.config.cache_max_block.resolve_bytes(total_bytes);
        if self.config.backend == Backend::Vmm && !self.config.ipc {
            // The virtual-memory resource reuses and coalesces freed blocks itself: caching
            // them above it would only keep them from coalescing.
            max_block_bytes = max_block_bytes.min(resources.small_max_bytes());
        }
        let limit_bytes = self.config.cache_limit.resolve_bytes(total_bytes);
        self.state.lock().books = Books::new(Cache::new(limit_bytes, max_block_bytes));
        Ok(self.provisioned.get_or_init(|| Provisioned {
            resources,
            total_bytes,
        }))
    }

    fn resources(&self) -> Result<&Resources> {
        Ok(&self.provisioned()?.resources)
    }

    /// Allocates `requested_bytes` (> 0, at most [`crate::allocator::MAX_ALLOCATION_BYTES`]) on
    /// `stream`, from the shareable pool if `shareable`.
    pub fn allocate(
        &self,
        requested_bytes: u64,
        stream: Stream,
        shareable: bool,
    ) -> Result<DevicePtr> {
        let block_bytes = limit::block_bytes(requested_bytes)?;
        let resources = self.resources()?;
        if self.driver.is_capturing(self.device, stream)? {
            return self.allocate_for_graph(requested_bytes, block_bytes, stream);
        }
        if shareable && !self.config.ipc {
            return self.allocate_shareable(requested_bytes, block_bytes, stream);
        }
        let mut homeless = Vec::new();
        let hit = {
            let mut st = self.state.lock();
            if !st.waits.is_idle() {
                self.collect_waits(&mut st, &mut homeless);
            }
            st.books.take_cached(stream, block_bytes).map(|block| {
                let home = Home::of(resources.class_of(block.block_bytes));
                st.books
                    .insert_live(block.ptr, requested_bytes, block.block_bytes, stream, home);
                self.note(&st, Event::Alloc, stream, block.ptr, requested_bytes);
                block.ptr
            })
        };
        let _ = self.send_home(homeless);
        match hit {
            Some(ptr) => Ok(ptr),
            None => self.allocate_from_resource(resources, requested_bytes, block_bytes, stream),
        }
    }

    /// Steps 3 to 6.
    fn allocate_from_resource(
        &self,
        resources: &Resources,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let class = resources.class_of(block_bytes);
        self.reserve_within_limit(requested_bytes, block_bytes, stream)?;
        let served = self
            .make_room(resources, class, block_bytes, stream)
            .and_then(|()| {
                self.allocate_or_retry(resources.get(class), requested_bytes, block_bytes, stream)
            });
        let (ptr, home) = match served {
            Ok(ptr) => (ptr, Home::of(class)),
            Err(e) if limit::is_mapping_paused(&e) => {
                // A capture elsewhere on the device keeps the resource from mapping: graph-style
                // memory from the driver serves, outside the resource's books.
                self.state.lock().books.unreserve(block_bytes);
                return self.allocate_for_graph(requested_bytes, block_bytes, stream);
            }
            Err(e) => {
                self.state.lock().books.unreserve(block_bytes);
                return Err(e);
            }
        };
        let reserved_bytes = self.reserved_for_timeline(resources);
        {
            let mut st = self.state.lock();
            st.books.counters_mut().num_device_allocs += 1;
            if let Some(reserved_bytes) = reserved_bytes {
                self.recorder
                    .note_reserved(reserved_bytes, stream, || st.books.gauges());
            }
            st.books
                .insert_live(ptr, requested_bytes, block_bytes, stream, home);
            self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
            self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
        }
        self.release_cache_after_growth(resources, class);
        Ok(ptr)
    }

    /// Graph capture: the allocation becomes part of the graph, never cached, never held.
    fn allocate_for_graph(
        &self,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        if self.state.lock().waits.note_capturing(stream) {
            log::info!(
                "device {}: stream {stream:#x} is capturing a CUDA graph; its allocations bypass the cache",
                self.device
            );
            self.resources()?.for_each(|r| {
                r.set_capturing(true);
                Ok(())
            })?;
        }
        let ptr =
            match waits::alloc_for_graph(self.driver.as_ref(), self.device, block_bytes, stream) {
                Ok(ptr) => ptr,
                Err(e) if e.is_device_oom() => {
                    return Err(self.out_of_memory(requested_bytes, stream, None))
                }
                Err(e) => return Err(e),
            };
        let mut st = self.state.lock();
        st.books.counters_mut().num_device_allocs += 1;
        st.books
            .insert_live(ptr, requested_bytes, block_bytes, stream, Home::Driver);
        self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
        self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
        Ok(ptr)
    }

    /// Inside `streampool.shareable()`: straight from the shareable pool, never from the cache.
    fn allocate_shareable(
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
                self.state.lock().books.unreserve(block_bytes);
                return Err(e);
            }
        };
        let mut st = self.state.lock();
        st.books.counters_mut().num_device_allocs += 1;
        st.books
            .insert_live(ptr, requested_bytes, block_bytes, stream, Home::Shareable);
        self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
        self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
        Ok(ptr)
    }

    /// The pool of `streampool.shareable()`, created on first use (the device's own pool with
    /// `STREAMPOOL_IPC`); other devices get access to it as `STREAMPOOL_PEER_ACCESS` says.
    fn shareable_pool(&self) -> Result<Arc<dyn Resource>> {
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
            self.peers
                .extra_pool(self.driver.as_ref(), self.device, Arc::clone(&pool) as _);
            Ok(pool)
        })
    }

    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut st = self.state.lock();
        let live = st.books.remove_live(ptr, self.device)?;
        self.note(&st, Event::Free, live.stream, ptr, live.requested_bytes);
        log::trace!(
            "device {}: free {ptr:#x} ({} B) on stream {:#x}",
            self.device,
            live.requested_bytes,
            live.stream
        );
        let block = FreedBlock {
            ptr,
            block_bytes: live.block_bytes,
            stream: live.stream,
            home: live.home,
        };
        if !live.recorded_streams.is_empty() && live.home != Home::Driver {
            let waiting = WaitingBlock {
                block,
                requested_bytes: live.requested_bytes,
            };
            let failed = match st.waits.wait_for(
                self.driver.as_ref(),
                self.device,
                waiting,
                live.recorded_streams,
            ) {
                Ok(()) => return Ok(()),
                Err(failed) => failed,
            };
            // Without an event we cannot know when the streams are done: wait for everything.
            drop(st);
            log::warn!(
                "device {}: {}; synchronising before reusing {ptr:#x}",
                self.device,
                failed.error
            );
            let synced = self.driver.synchronize(self.device);
            st = self.state.lock();
            if let Err(e) = synced {
                // Neither an event nor a wait: keep the block until one of them works.
                st.waits.defer(failed.waiting, failed.streams);
                return Err(e);
            }
        }
        st.books.deactivate(live.requested_bytes);
        self.keep_or_send_home(st, block)
    }

    fn keep_or_send_home(
        &self,
        mut st: MutexGuard<'_, DeviceState>,
        block: FreedBlock,
    ) -> Result<()> {
        match st.books.keep(block) {
            Ok(()) => Ok(()),
            Err(block) => {
                drop(st);
                self.send_home(vec![block])
            }
        }
    }

    /// Hands back the blocks whose streams are done (and notes a capture that ended); those the
    /// cache does not keep are added to `homeless`, to be sent home once the lock is released.
    fn collect_waits(&self, st: &mut DeviceState, homeless: &mut Vec<FreedBlock>) {
        let collected = st.waits.collect(self.driver.as_ref(), self.device);
        if collected.capture_ended {
            if let Some(p) = self.provisioned.get() {
                p.resources.all().for_each(|r| r.set_capturing(false));
            }
        }
        for w in collected.ready {
            st.books.deactivate(w.requested_bytes);
            if let Err(block) = st.books.keep(w.block) {
                homeless.push(block);
            }
        }
    }

    /// Sends blocks home — to their resource, the shareable pool or the driver — on their own
    /// streams; they already left `held_bytes`. A block the driver refuses stays on the books
    /// for the next flush to retry; the first error is returned.
    fn send_home(&self, blocks: Vec<FreedBlock>) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let shareable = blocks
            .iter()
            .any(|b| b.home == Home::Shareable)
            .then(|| self.exporter.existing_pool())
            .flatten();
        let results: Vec<Result<()>> = blocks
            .iter()
            .map(|b| match (b.home, self.provisioned.get(), &shareable) {
                (Home::Driver, _, _) => self.driver.free_async(self.device, b.ptr, b.stream),
                (Home::Shareable, _, Some(pool)) => pool.deallocate(b.ptr, b.block_bytes, b.stream),
                (Home::Small, Some(p), _) => {
                    p.resources
                        .get(SizeClass::Small)
                        .deallocate(b.ptr, b.block_bytes, b.stream)
                }
                (Home::Large, Some(p), _) => {
                    p.resources
                        .get(SizeClass::Large)
                        .deallocate(b.ptr, b.block_bytes, b.stream)
                }
                _ => Err(Error::Internal(format!(
                    "{:#x}: its {:?} resource does not exist",
                    b.ptr, b.home
                ))),
            })
            .collect();
        let mut first_error = Ok(());
        {
            let mut st = self.state.lock();
            for (block, result) in blocks.iter().zip(results) {
                match st.books.settle_return(*block, result) {
                    Ok(()) => self.note(
                        &st,
                        Event::PoolFree,
                        block.stream,
                        block.ptr,
                        block.block_bytes,
                    ),
                    Err(e) => first_error = first_error.and(Err(e)),
                }
            }
        }
        if let Err(e) = &first_error {
            log::error!(
                "device {}: returning blocks failed ({e}); empty_cache will retry",
                self.device
            );
        }
        first_error
    }

    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.state
            .lock()
            .books
            .record_stream(ptr, stream, self.device)
    }

    /// Returns cached and completed blocks to their resources, synchronises and trims each
    /// resource to `keep_bytes`. While a graph is being captured it only returns the cache (no
    /// waiting). A block the driver refuses does not stop the trim; the first error is reported.
    pub fn flush(&self, keep_bytes: u64) -> Result<()> {
        let Some(provisioned) = self.provisioned.get() else {
            return Ok(());
        };
        let resources = &provisioned.resources;
        let mut blocks = Vec::new();
        let capturing = {
            let mut st = self.state.lock();
            self.collect_waits(&mut st, &mut blocks);
            st.waits.capturing()
        };
        let synced = match capturing {
            true => Ok(()),
            false => self.driver.synchronize(self.device),
        };
        {
            let mut st = self.state.lock();
            if !capturing && synced.is_ok() {
                // All work queued before the synchronisation is done: every waiting block is free.
                for w in st.waits.take_all_after_sync() {
                    st.books.deactivate(w.requested_bytes);
                    st.books.release(&w.block);
                    blocks.push(w.block);
                }
            }
            blocks.extend(
                st.books
                    .drain_cache(|bytes| Home::of(resources.class_of(bytes))),
            );
            blocks.extend(st.books.take_unreturned());
        }
        let count = blocks.len();
        let returned = self.send_home(blocks);
        synced?;
        if !capturing {
            self.driver.synchronize(self.device)?;
            let before_bytes = self.reserved_for_timeline(resources);
            resources.for_each(|r| r.trim(keep_bytes))?;
            if let (Some(before), Some(after)) =
                (before_bytes, self.reserved_for_timeline(resources))
            {
                let st = self.state.lock();
                self.recorder
                    .note_trim(before, after, Stream(0), || st.books.gauges());
            }
        }
        log::info!(
            "device {}: flushed {count} blocks, trimmed to {keep_bytes} B",
            self.device
        );
        returned
    }

    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.resources()?
            .for_each(|r| r.set_release_threshold(bytes))
    }

    /// The device's memory, read once.
    pub fn device_total_bytes(&self) -> Result<u64> {
        match self.provisioned.get() {
            Some(p) => Ok(p.total_bytes),
            None => Ok(self.driver.mem_info(self.device)?.total_bytes),
        }
    }

    pub fn stats(&self) -> Result<StreampoolStats> {
        let (counters, cached_bytes) = {
            let st = self.state.lock();
            (st.books.counters().clone(), st.books.cached_bytes())
        };
        let usage = match self.provisioned.get() {
            Some(p) => p.resources.usage()?,
            None => Default::default(),
        };
        Ok(StreampoolStats::assemble(DeviceFigures {
            counters: &counters,
            cached_bytes,
            usage,
            shareable: self.exporter.usage()?,
            limit_bytes: self.limit.bytes(),
            device_total_bytes: self.device_total_bytes()?,
        }))
    }

    pub fn reset_peak_stats(&self) -> Result<()> {
        self.state.lock().books.counters_mut().reset_peaks();
        match self.provisioned.get() {
            Some(p) => p.resources.for_each(|r| r.reset_peaks()),
            None => Ok(()),
        }
    }

    /// Grants every other device access to this device's resources (see [`Peers::grant_all`]).
    pub fn enable_peer_access(&self) -> Result<()> {
        let own: Vec<Arc<dyn Accessible>> = self
            .resources()?
            .all()
            .map(|r| Arc::clone(r) as _)
            .collect();
        self.peers
            .grant_all(self.driver.as_ref(), self.device, &own)
    }

    /// The blocks this device holds from its resources (for `dump_snapshot`).
    pub fn blocks(&self) -> Vec<StreampoolBlock> {
        let st = self.state.lock();
        st.books.blocks(self.device, st.waits.blocks())
    }

    /// What another process needs to map the live shareable block at `ptr`; see [`Exporter`].
    pub fn export(&self, ptr: DevicePtr, stream: Stream) -> Result<StreampoolIpcHandle> {
        let (block_bytes, home) = {
            let st = self.state.lock();
            let b = st.books.live(ptr).ok_or(Error::UnknownPointer {
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

    /// The resources' reserved bytes, read only while the timeline is recording.
    fn reserved_for_timeline(&self, resources: &Resources) -> Option<u64> {
        self.recorder
            .enabled()
            .then(|| resources.usage().ok().map(|u| u.reserved_bytes))
            .flatten()
    }

    /// Called when the timeline starts: its reserved gauge begins at the resources' current value.
    pub fn start_timeline(&self) {
        if let Some(p) = self.provisioned.get() {
            if let Some(reserved_bytes) = self.reserved_for_timeline(&p.resources) {
                self.recorder.set_reserved(reserved_bytes);
            }
        }
    }

    /// Returns the cache, synchronises and trims each resource to `keep_bytes`.
    pub fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.resources()?;
        self.flush(keep_bytes)
    }

    /// Records a timeline event with the device's gauges (one atomic load when not recording).
    #[inline]
    fn note(&self, st: &DeviceState, kind: Event, stream: Stream, ptr: DevicePtr, bytes: u64) {
        self.recorder
            .note(kind, stream, ptr, bytes, || st.books.gauges());
    }
}

impl Drop for DeviceAllocator {
    fn drop(&mut self) {
        self.state
            .lock()
            .waits
            .destroy_spares(self.driver.as_ref(), self.device);
    }
}

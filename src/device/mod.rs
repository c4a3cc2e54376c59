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
//! 5. the block's resource serves it ([`crate::resource`]); under the memory limit, a resource
//!    that grows by itself (a CUDA pool) only while the device's reserved memory stays within
//!    the limit ([`reserved_cap`]);
//! 6. out of memory: flush the cache, synchronise, trim, retry once, then report ([`limit`]).
//!
//! A free goes the other way: a block other streams used waits for them ([`waits`]); then it is
//! cached for its stream, or sent home to its resource.
//!
//! Invariants: the ledger ([`ledger`]) and waits sit behind one mutex per device, held for map and
//! counter updates and non-blocking driver queries only, never across a call that can wait for
//! the GPU or allocate device memory; a block passed to record_stream is reused only after events
//! recorded on those streams have completed.

mod control;
mod growth;
mod health;
mod idle;
mod ledger;
mod limit;
mod reserved_cap;
mod returns;
mod shareable;
mod waits;

use crate::cache::Cache;
use crate::config::{Backend, Config};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::Result;
use crate::history::{Recorder, StreampoolEventKind as Event};
use crate::ipc::export::Exporter;
use crate::peer::Peers;
use crate::resource::{peer_target, Accessible, Resources, SizeClass};
use crate::sync::{Mutex, OnceCell};
use growth::GrowthMarks;
use ledger::{FreedBlock, Home, Ledger, WaitingBlock};
use limit::Limit;
use std::sync::{Arc, Weak};
use waits::Waits;

/// The device's resources and what was learnt when they were made.
struct Provisioned {
    resources: Resources,
    total_bytes: u64,
}

/// What the device lock guards.
struct DeviceState {
    ledger: Ledger,
    waits: Waits,
    growth: GrowthMarks,
    /// Allocations and frees so far (the background thread tells idleness by it).
    activity: u64,
}

pub struct DeviceAllocator {
    device: usize,
    driver: Arc<dyn Driver>,
    config: Arc<Config>,
    provisioned: OnceCell<Provisioned>,
    provisioning: Mutex<()>,
    /// Held while a resource grows under the memory limit ([`reserved_cap`]).
    growing: Mutex<()>,
    state: Mutex<DeviceState>,
    limit: Limit,
    recorder: Arc<Recorder>,
    exporter: Exporter,
    peers: Arc<Peers>,
    idle: idle::Watch,
    me: Weak<DeviceAllocator>,
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
        recorder: Arc<Recorder>,
        peers: Arc<Peers>,
    ) -> Arc<DeviceAllocator> {
        Arc::new_cyclic(|me| DeviceAllocator {
            device,
            exporter: Exporter::new(device, Arc::clone(&driver)),
            driver,
            config,
            provisioned: OnceCell::new(),
            provisioning: Mutex::new(()),
            growing: Mutex::new(()),
            state: Mutex::new(DeviceState {
                ledger: Ledger::default(),
                waits: Waits::default(),
                growth: GrowthMarks::default(),
                activity: 0,
            }),
            limit: Limit::default(),
            recorder,
            peers,
            idle: Mutex::new(idle::IdleWatch::default()),
            me: me.clone(),
        })
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
        let resources = Resources::create(
            &self.driver,
            self.device,
            &self.config,
            total_bytes,
            self.limit.shared(),
            &self.recorder,
        )?;
        let own: Vec<Arc<dyn Accessible>> = resources.all().filter_map(peer_target).collect();
        self.peers
            .pools_created(self.driver.as_ref(), self.device, &own);
        let mut max_block_bytes = self.config.cache_max_block.resolve_bytes(total_bytes);
        if resources.backend() == Backend::Vmm {
            // The virtual-memory resource reuses and coalesces freed blocks itself: caching
            // large ones above it would only keep them from coalescing.
            max_block_bytes =
                max_block_bytes.min(self.config.small_pool_max.resolve_bytes(total_bytes));
        }
        let limit_bytes = self.config.cache_limit.resolve_bytes(total_bytes);
        // Only the cache: the counters may already hold an out-of-memory error (a request
        // above the maximum is refused without provisioning).
        self.state
            .lock()
            .ledger
            .set_cache(Cache::new(limit_bytes, max_block_bytes));
        let provisioned = self.provisioned.get_or_init(|| Provisioned {
            resources,
            total_bytes,
        });
        if self.config.background {
            crate::background::register(self.me.clone() as Weak<dyn crate::background::Tended>);
        }
        Ok(provisioned)
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
        self.check_enabled()?;
        let block_bytes = limit::block_bytes(requested_bytes)?;
        let resources = self.resources()?;
        if self.driver.is_capturing(self.device, stream)? {
            return self.allocate_for_graph(requested_bytes, block_bytes, stream);
        }
        if shareable && !self.config.ipc {
            return self.allocate_shareable(requested_bytes, block_bytes, stream);
        }
        let mut homeless = Vec::new();
        let (hit, reserved) = {
            let mut st = self.lock_enabled()?;
            st.activity += 1;
            if !st.waits.is_idle() {
                self.collect_waits(&mut st, &mut homeless);
            }
            match st.ledger.take_cached(stream, block_bytes) {
                Some(block) => {
                    let home = Home::of(resources.class_of(block.block_bytes));
                    let bytes = block.block_bytes;
                    st.ledger
                        .insert_live(block.ptr, requested_bytes, bytes, stream, home);
                    self.note(&st, Event::Alloc, stream, block.ptr, requested_bytes);
                    (Some(block.ptr), false)
                }
                // Step 3 in the same lock section, when the cap leaves room at once.
                None => (
                    None,
                    st.ledger.reserve(block_bytes, self.limit.bytes()).is_ok(),
                ),
            }
        };
        if !homeless.is_empty() {
            let _ = self.send_home(homeless);
        }
        match hit {
            Some(ptr) => Ok(ptr),
            None => {
                if !reserved {
                    self.reserve_within_limit(requested_bytes, block_bytes, stream)?;
                }
                self.allocate_from_resource(resources, requested_bytes, block_bytes, stream)
            }
        }
    }

    /// Steps 4 to 6, for a block whose bytes are reserved against the limit.
    fn allocate_from_resource(
        &self,
        resources: &Resources,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let class = resources.class_of(block_bytes);
        let served = self
            .make_room(resources, class, block_bytes, stream)
            .and_then(|()| {
                self.allocate_within_reserved_cap(
                    resources,
                    class,
                    requested_bytes,
                    block_bytes,
                    stream,
                )
            });
        let (ptr, home) = match served {
            Ok(ptr) => (ptr, Home::of(class)),
            Err(e) if e.is_capture_refusal() => {
                // A capture elsewhere on the device keeps the resource from mapping: the driver's
                // own pool serves (`cuMemAllocAsync`), and the block goes back to it when freed.
                let served = self.allocate_from_driver(
                    requested_bytes,
                    block_bytes,
                    stream,
                    Home::DriverPool,
                );
                if served.is_err() {
                    self.state.lock().ledger.unreserve(block_bytes);
                }
                return served;
            }
            Err(e) => {
                self.state.lock().ledger.unreserve(block_bytes);
                return Err(e);
            }
        };
        let reserved_bytes = self.reserved_for_timeline(resources);
        let cache_in_use = {
            let mut st = self.state.lock();
            st.ledger.counters_mut().num_device_allocs += 1;
            if let Some(reserved_bytes) = reserved_bytes {
                self.recorder
                    .note_reserved(reserved_bytes, stream, || st.ledger.gauges());
            }
            st.ledger
                .insert_live(ptr, requested_bytes, block_bytes, stream, home);
            self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
            self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
            st.ledger.cached_bytes() > 0
        };
        if cache_in_use {
            self.release_cache_after_growth(resources, class);
        }
        Ok(ptr)
    }

    /// Graph capture: the allocation becomes part of the graph, never cached, never held; while
    /// a capture is known, resources that map memory must not.
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
            // A resource that maps memory keeps it from mapping until the capture ends.
            self.resources()?
                .all()
                .filter_map(|r| r.capabilities().capture_notice)
                .for_each(|notice| notice.capture_started(stream));
        }
        self.allocate_from_driver(requested_bytes, block_bytes, stream, Home::Graph)
    }

    /// Memory from the driver's own pool (`cuMemAllocAsync`): graph memory on a capturing
    /// stream (`home` Graph, not held), or a block a resource could not map during a capture
    /// elsewhere (`DriverPool`: its bytes reserved against the limit by the caller).
    fn allocate_from_driver(
        &self,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
        home: Home,
    ) -> Result<DevicePtr> {
        let ptr =
            match waits::alloc_for_graph(self.driver.as_ref(), self.device, block_bytes, stream) {
                Ok(ptr) => ptr,
                Err(e) if e.is_device_oom() => {
                    return Err(self.out_of_memory(requested_bytes, stream, None))
                }
                Err(e) => return Err(e),
            };
        let mut st = self.state.lock();
        st.ledger.counters_mut().num_device_allocs += 1;
        st.ledger
            .insert_live(ptr, requested_bytes, block_bytes, stream, home);
        self.note(&st, Event::PoolAlloc, stream, ptr, block_bytes);
        self.note(&st, Event::Alloc, stream, ptr, requested_bytes);
        Ok(ptr)
    }

    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut st = self.lock_enabled()?;
        let live = st.ledger.remove_live(ptr, self.device)?;
        st.activity += 1;
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
        if !live.recorded_streams.is_empty() && live.home != Home::Graph {
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
        st.ledger.deactivate(live.requested_bytes);
        self.keep_or_send_home(st, block)
    }

    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.lock_enabled()?
            .ledger
            .record_stream(ptr, stream, self.device)
    }

    /// Records a timeline event with the device's gauges (one atomic load when not recording).
    #[inline]
    fn note(&self, st: &DeviceState, kind: Event, stream: Stream, ptr: DevicePtr, bytes: u64) {
        self.recorder
            .note(kind, stream, ptr, bytes, || st.ledger.gauges());
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

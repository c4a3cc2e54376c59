//! The allocation pipeline of one device, in the order it is applied:
//!
//! 1. a stream that is being captured into a CUDA graph gets graph memory, never cached memory;
//!    inside `streampool.shareable()`, the shareable pool serves ([`shareable`]);
//! 2. a block freed earlier on the same stream is reused from the cache (no driver call);
//!    otherwise the device's own source for the block's size is chosen ([`ledger`]);
//! 3. the memory limit (`set_memory_fraction`) is enforced: the block's bytes are reserved
//!    against it in the same lock section as the check ([`limit`]);
//! 4. before a source that cannot reuse cached blocks would grow, they go back to it, and
//!    (trim_on_growth) it releases what it does not use once the stream has caught up
//!    ([`growth`]);
//! 5. the source serves the block ([`crate::resource`]); under the memory limit, a source that
//!    grows by itself (a CUDA pool) only while the device's reserved memory stays within the
//!    limit ([`reserved_cap`]);
//! 6. out of memory: flush the cache, synchronise, trim, retry once, then report ([`limit`]).
//!
//! A free goes the other way: a block other streams used waits for them ([`waits`]); then it is
//! cached for its stream, or goes back to its source ([`returns`]).
//!
//! Invariants: the ledger ([`ledger`]) and waits sit behind one mutex per device, held for map and
//! counter updates and non-blocking driver queries only, never across a call that can wait for
//! the GPU or allocate device memory; a block passed to record_stream is reused only after events
//! recorded on those streams have completed; every block goes back to the source whose id its
//! record carries.

mod added;
mod control;
mod freed;
mod graph_pools;
mod growth;
mod health;
mod idle;
mod ledger;
mod limit;
mod live;
mod pool_blocks;
mod pool_routes;
mod request;
mod reserved_cap;
mod reserved_total;
mod returns;
mod setup;
mod shareable;
mod waits;

use crate::config::{DeviceSettings, Settings};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::Result;
use crate::history::{Recorder, StreampoolEventKind as Event};
use crate::ipc::export::Exporter;
use crate::peer::Peers;
use crate::resource::{Resource, Source, SourceId};
use crate::sync::{Mutex, MutexGuard, OnceCell};
use freed::Returning;
use graph_pools::PoolDevice;
use growth::GrowthMarks;
use ledger::Ledger;
use limit::Limit;
use request::Request;
pub(crate) use request::BLOCK_ALIGN_BYTES;
use std::sync::{Arc, Weak};
use waits::Waits;

pub use graph_pools::GraphPools;
pub use pool_routes::StreamFilter;

/// What the device learnt and made on its first use.
struct DeviceSetup {
    total_bytes: u64,
    settings: DeviceSettings,
    /// The device's own resources, the large-block one first: also in the ledger's table, and
    /// fixed for the device's life, so they are read here without the device lock.
    own: Vec<Arc<dyn Resource>>,
}

impl DeviceSetup {
    /// Runs `f` on each of the device's own resources; every one is tried, the first error is
    /// returned.
    fn for_each_own(&self, mut f: impl FnMut(&dyn Resource) -> Result<()>) -> Result<()> {
        self.own
            .iter()
            .map(|r| f(r.as_ref()))
            .fold(Ok(()), Result::and)
    }

    /// The device's own resources that tend their memory ([`crate::resource::Tending`]).
    fn tending(&self) -> impl Iterator<Item = &dyn crate::resource::Tending> {
        self.own.iter().filter_map(|r| r.capabilities().tending)
    }

    /// The device's reserved bytes: its own resources'.
    fn reserved_bytes(&self) -> Result<u64> {
        crate::resource::reserved_bytes_of(&self.own)
    }
}

/// What the device lock guards. In the order every allocation and free reads it, so that the
/// fields they read share as few cache lines as they can (`repr(C)` keeps the order).
#[repr(C)]
struct DeviceState {
    /// Allocations and frees so far (the background thread tells idleness by it).
    activity: u64,
    waits: Waits,
    ledger: Ledger,
    growth: GrowthMarks,
    /// A resource may sleep: a sleep is under way (`sleeps_under_way`) or one sleeps (set
    /// under this lock after each sleep and wake). Only then do the allocations' slow paths ask
    /// the resources ([`control`]).
    asleep_maybe: bool,
    sleeps_under_way: u32,
}

/// One device of the process's allocator (`Allocator::device`): its allocations run the stages
/// above, and every call about one device — statistics, trims, the release threshold and the
/// memory fraction, sleep and wake, exports — is a method of it; PyTorch's memory pools are a
/// part it owns ([`DeviceAllocator::graph_pools`]).
///
/// Its fields start with those every allocation and free reads, then the lock and what it guards
/// (in that order too), so that a call touches as few cache lines as it can: between two
/// allocations a workload's own code pushes them out of the core's caches (docs/replay.md,
/// "Cache lines"); it starts a line. The order is also the drop order, which no field's drop
/// depends on (the resources they share are `Arc`s).
#[repr(C, align(64))]
pub struct DeviceAllocator {
    device: usize,
    driver: Arc<dyn Driver>,
    limit: Limit,
    recorder: Arc<Recorder>,
    state: Mutex<DeviceState>,
    setup: OnceCell<DeviceSetup>,
    settings: Arc<Settings>,
    /// Held while the device's sources are created (its own, the shareable pool).
    creating: Mutex<()>,
    /// Held while a resource grows under the memory limit ([`reserved_cap`]).
    growing: Mutex<()>,
    exporter: Exporter,
    peers: Arc<Peers>,
    idle: idle::Watch,
    /// PyTorch's memory pools of the device and the routes to them ([`graph_pools`]).
    graph_pools: GraphPools,
    me: Weak<DeviceAllocator>,
}

impl DeviceAllocator {
    pub(crate) fn new(
        device: usize,
        driver: Arc<dyn Driver>,
        settings: Arc<Settings>,
        recorder: Arc<Recorder>,
        peers: Arc<Peers>,
    ) -> Arc<DeviceAllocator> {
        Arc::new_cyclic(|me| DeviceAllocator {
            device,
            exporter: Exporter::new(device, Arc::clone(&driver)),
            graph_pools: GraphPools::new(
                device,
                Arc::clone(&driver),
                me.clone() as Weak<dyn PoolDevice>,
            ),
            driver,
            settings,
            setup: OnceCell::new(),
            creating: Mutex::new(()),
            growing: Mutex::new(()),
            state: Mutex::new(DeviceState {
                ledger: Ledger::default(),
                waits: Waits::default(),
                growth: GrowthMarks::default(),
                activity: 0,
                asleep_maybe: false,
                sleeps_under_way: 0,
            }),
            limit: Limit::default(),
            recorder,
            peers,
            idle: Mutex::new(idle::IdleWatch::default()),
            me: me.clone(),
        })
    }

    /// PyTorch's memory pools of the device, and the routes to them.
    pub fn graph_pools(&self) -> &GraphPools {
        &self.graph_pools
    }

    /// The device's sources and cache, created on first use.
    #[inline]
    fn setup(&self) -> Result<&DeviceSetup> {
        match self.setup.get() {
            Some(setup) => Ok(setup),
            None => self.first_setup(),
        }
    }

    /// Allocates `requested_bytes` (> 0, at most [`crate::allocator::MAX_ALLOCATION_BYTES`]) on
    /// `stream`, from the shareable pool if `shareable`: the stages of the module's list.
    pub(crate) fn allocate(
        &self,
        requested_bytes: u64,
        stream: Stream,
        shareable: bool,
    ) -> Result<DevicePtr> {
        self.check_enabled()?;
        let Some(request) = Request::fitting(requested_bytes, stream) else {
            return Err(request::too_large(requested_bytes));
        };
        let setup = self.setup()?;
        // 1. A capturing stream gets graph memory; the shareable scope, the shareable pool.
        if self.captures(stream)? {
            return self.allocate_for_graph(request);
        }
        if shareable && !setup.settings.every_block_shareable {
            return self.allocate_shareable(request);
        }
        // 2. The cache (once the blocks whose streams are done are back in it, if any wait).
        let mut st = timed_section!("device allocate: lock", self.lock_enabled())?;
        st.activity += 1;
        if !st.waits.is_idle() {
            return self.allocate_collecting(st, request);
        }
        // (The lock released inline on the two common exits: `unlock`.)
        if let Some(ptr) = self.take_cached(&mut st, request) {
            st.unlock();
            return Ok(ptr);
        }
        if let Some(ptr) = self.take_fast(&mut st, request) {
            st.unlock();
            return Ok(ptr);
        }
        self.allocate_missed(st, request, Vec::new())
    }

    /// True if an allocation on `stream` is captured into a CUDA graph now: the driver says so.
    /// The legacy default stream (PyTorch's), which CUDA never captures, asks it nothing. Both
    /// routes of an allocation (the device's, a PyTorch pool's) ask here.
    #[inline(always)]
    fn captures(&self, stream: Stream) -> Result<bool> {
        Ok(stream.may_be_captured()
            && timed_section!(
                "capture query",
                self.driver.is_capturing(self.device, stream)
            )?)
    }

    /// True while a graph capture may be under way on the device: one is known (the device
    /// allocated in it), or PyTorch routes allocations to a graph pool — it opens the route
    /// before it begins a capture, so a capture that has not allocated yet (or never does) is
    /// covered, and so is `use_mem_pool`, whose route cannot be told apart (PyTorch's
    /// out-of-memory retry likewise releases no cached block while any route is open). The
    /// program's calls then neither synchronise the device nor trim (`empty_cache`, the
    /// out-of-memory retry, the memory fraction, growth); the background thread's idle release,
    /// in relaxed mode and off the capturing streams, still may.
    fn capture_possible(&self, st: &DeviceState) -> bool {
        st.waits.capturing() || self.graph_pools.any_route_open()
    }

    /// Step 2 for a source with a fast path (the vmm resource): a block it has at hand, served
    /// in this lock section (step 3's reservation included).
    #[inline(always)]
    fn take_fast(&self, st: &mut DeviceState, request: Request) -> Option<DevicePtr> {
        let (ptr, _) = st.ledger.take_fast(request, self.limit.bytes())?;
        let (stream, ptr_bytes) = (request.stream, request.block_bytes);
        self.note(st, Event::PoolAlloc, stream, ptr, ptr_bytes);
        self.note(st, Event::Alloc, stream, ptr, request.requested_bytes);
        Some(ptr)
    }

    /// Step 2 while blocks wait for other streams: those whose streams are done go into the
    /// cache before the lookup (or back to their sources once the lock is released).
    #[inline(never)]
    fn allocate_collecting(
        &self,
        mut st: MutexGuard<'_, DeviceState>,
        request: Request,
    ) -> Result<DevicePtr> {
        self.refuse_if_asleep(&st)?;
        let mut to_return = Vec::new();
        self.collect_waits(&mut st, &mut to_return);
        match self.take_cached(&mut st, request) {
            Some(ptr) => {
                drop(st);
                let _ = self.return_blocks(to_return);
                Ok(ptr)
            }
            None => self.allocate_missed(st, request, to_return),
        }
    }

    /// Step 2: a cached block of the request's stream, booked live.
    #[inline(always)]
    fn take_cached(&self, st: &mut DeviceState, request: Request) -> Option<DevicePtr> {
        let block = st.ledger.take_cached(request.stream, request.block_bytes)?;
        let request = request.served_by(block.block_bytes);
        st.ledger.insert_live(block.ptr, request, block.source);
        let (stream, bytes) = (request.stream, request.requested_bytes);
        self.note(st, Event::Alloc, stream, block.ptr, bytes);
        Some(block.ptr)
    }

    /// Steps 2 (on a miss) to 6: the device's own source for the size begins the allocation,
    /// its bytes reserved against the limit in the same lock section when that leaves room; with
    /// the lock released and `to_return` gone back: the limit, growth, the source.
    #[inline(never)]
    fn allocate_missed(
        &self,
        mut st: MutexGuard<'_, DeviceState>,
        request: Request,
        to_return: Vec<Returning>,
    ) -> Result<DevicePtr> {
        // A sleeping device refuses, saying so, before anything moves and whatever else would
        // stop the request (the limit, growth). (`to_return` is empty then: the collecting path
        // refuses before it collects.)
        if let Err(e) = self.refuse_if_asleep(&st) {
            drop(st);
            let _ = self.return_blocks(to_return);
            return Err(e);
        }
        let id = st.ledger.sources().for_size(request.block_bytes);
        let begun = st.ledger.sources_mut().begin_allocation(id).map(|source| {
            let reserved = st.ledger.reserve(request.block_bytes, self.limit.bytes());
            (source, reserved.is_ok())
        });
        drop(st);
        let _ = self.return_blocks(to_return);
        let (source, reserved) = begun?;
        // 3. The memory limit.
        if !reserved {
            if let Err(e) = self.limit.reserve(self, request) {
                self.abandon(&source, request, false);
                return Err(e);
            }
        }
        // 4. to 6. Growth, the source, out-of-memory recovery.
        self.allocate_from_source(source, request)
    }

    /// Steps 4 to 6, for a block whose bytes are reserved against the limit.
    fn allocate_from_source(&self, source: Source, request: Request) -> Result<DevicePtr> {
        let served = self
            .return_cache_before_growth(&source, request)
            .and_then(|()| self.allocate_within_reserved_cap(&source, request));
        let ptr = match served {
            Ok(ptr) => ptr,
            Err(e) => {
                self.abandon(&source, request, true);
                return Err(e);
            }
        };
        let reserved_bytes = self.reserved_for_timeline();
        let cache_in_use = {
            let mut st = self.state.lock();
            if let Some(reserved_bytes) = reserved_bytes {
                self.recorder
                    .note_reserved(reserved_bytes, request.stream, || st.ledger.gauges());
            }
            self.book_served(&mut st, ptr, request, source.id);
            st.ledger.cached_bytes() > 0
        };
        if cache_in_use {
            self.release_cache_after_growth(&source);
        }
        Ok(ptr)
    }

    /// Graph capture: graph memory serves, never cached, never held; while a capture is known,
    /// resources that map memory must not.
    fn allocate_for_graph(&self, request: Request) -> Result<DevicePtr> {
        self.refuse_while_asleep()?;
        let graph = {
            let mut st = self.state.lock();
            st.activity += 1;
            let id = st.ledger.sources().graph();
            st.ledger.sources_mut().begin_allocation(id)
        };
        self.notice_capture(request.stream)?;
        self.serve_directly(graph?, request, false)
    }

    /// `stream` allocates while it captures a CUDA graph: the first time, the waits stop
    /// recording events and the resources that map memory stop mapping until the capture ends.
    fn notice_capture(&self, stream: Stream) -> Result<()> {
        if !self.state.lock().waits.note_capturing(stream) {
            return Ok(());
        }
        log::info!(
            "device {}: stream {stream:#x} is capturing a CUDA graph; its allocations bypass the cache",
            self.device
        );
        for r in &self.setup()?.own {
            if let Some(notice) = r.capabilities().capture_notice {
                notice.capture_started(stream);
            }
        }
        Ok(())
    }

    /// `source` serves at once, with no retry — graph memory (not held; a source whose bytes are
    /// `reserved` against the limit by the caller, in tests): out of memory is reported at once.
    fn serve_directly(
        &self,
        source: Source,
        request: Request,
        reserved: bool,
    ) -> Result<DevicePtr> {
        let ptr = match source.allocate(request.block_bytes, request.stream) {
            Ok(ptr) => ptr,
            Err(e) => {
                let e = match e.is_device_oom() {
                    true => self.out_of_memory(request.requested_bytes, request.stream, None),
                    false => e,
                };
                self.abandon(&source, request, reserved);
                return Err(e);
            }
        };
        self.book_served(&mut self.state.lock(), ptr, request, source.id);
        Ok(ptr)
    }

    /// Books a block `source` served for `request`: live, counted, on the timeline.
    fn book_served(
        &self,
        st: &mut DeviceState,
        ptr: DevicePtr,
        request: Request,
        source: SourceId,
    ) {
        st.ledger.counters_mut().num_device_allocs += 1;
        st.ledger.insert_live(ptr, request, source);
        self.note(
            st,
            Event::PoolAlloc,
            request.stream,
            ptr,
            request.block_bytes,
        );
        self.note(
            st,
            Event::Alloc,
            request.stream,
            ptr,
            request.requested_bytes,
        );
    }

    /// An allocation begun from `source` failed: the source's count, and the block's bytes if
    /// `reserved` against the limit, are given back.
    fn abandon(&self, source: &Source, request: Request, reserved: bool) {
        let mut st = self.state.lock();
        if reserved {
            st.ledger.unreserve(request.block_bytes);
        }
        st.ledger.sources_mut().allocation_failed(source.id);
    }

    /// Records a timeline event with the device's gauges (one atomic load when not recording).
    #[inline]
    fn note(&self, st: &DeviceState, kind: Event, stream: Stream, ptr: DevicePtr, bytes: u64) {
        self.recorder
            .note(kind, stream, ptr, bytes, || st.ledger.gauges());
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;

impl Drop for DeviceAllocator {
    fn drop(&mut self) {
        self.state
            .lock()
            .waits
            .destroy_spares(self.driver.as_ref(), self.device);
    }
}

//! A driver that wraps the simulator for the capture and race tests (tests/captures_and_races.rs):
//! it can run a closure at the N-th device synchronisation (to interleave another thread's call
//! at a precise point without a scheduler), counts `cuEventQuery` calls made while the test says a
//! capture is under way, and notes the stream of every capture query.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use streampool::driver::sim::SimDriver;
use streampool::driver::*;
use streampool::Result;

pub type Hook = Box<dyn FnOnce() + Send>;

pub struct Hooked {
    pub sim: Arc<SimDriver>,
    /// Run at successive `synchronize` calls: (before the real synchronisation?, closure).
    pub sync_hooks: Mutex<VecDeque<(bool, Hook)>>,
    /// While set, event queries are counted (total, and those from the releaser thread).
    pub counting: AtomicBool,
    pub queries: AtomicU32,
    pub releaser_queries: AtomicU32,
    /// The stream of every `cuStreamIsCapturing`, in order.
    pub capture_queries: Mutex<Vec<Stream>>,
}

impl Hooked {
    pub fn new(sim: SimDriver) -> Arc<Hooked> {
        Arc::new(Hooked {
            sim: Arc::new(sim),
            sync_hooks: Mutex::new(VecDeque::new()),
            counting: AtomicBool::new(false),
            queries: AtomicU32::new(0),
            releaser_queries: AtomicU32::new(0),
            capture_queries: Mutex::new(Vec::new()),
        })
    }
    pub fn push_sync_hook(&self, before: bool, hook: Hook) {
        self.sync_hooks.lock().unwrap().push_back((before, hook));
    }
}

impl DeviceDriver for Hooked {
    fn name(&self) -> &'static str {
        self.sim.name()
    }
    fn now_us(&self) -> u64 {
        self.sim.now_us()
    }
    fn device_count(&self) -> Result<usize> {
        self.sim.device_count()
    }
    fn mem_info(&self, device: usize) -> Result<MemInfo> {
        self.sim.mem_info(device)
    }
    fn synchronize(&self, device: usize) -> Result<()> {
        let hook = self.sync_hooks.lock().unwrap().pop_front();
        match hook {
            Some((true, hook)) => {
                hook();
                self.sim.synchronize(device)
            }
            Some((false, hook)) => {
                let r = self.sim.synchronize(device);
                hook();
                r
            }
            None => self.sim.synchronize(device),
        }
    }
}

impl PoolDriver for Hooked {
    fn pools_supported(&self, device: usize) -> Result<bool> {
        self.sim.pools_supported(device)
    }
    fn pool_create(&self, device: usize, max: u64, shareable: bool) -> Result<PoolHandle> {
        self.sim.pool_create(device, max, shareable)
    }
    fn pool_destroy(&self, device: usize, pool: PoolHandle) -> Result<()> {
        self.sim.pool_destroy(device, pool)
    }
    fn pool_set_attr(&self, device: usize, pool: PoolHandle, attr: PoolAttr) -> Result<()> {
        self.sim.pool_set_attr(device, pool, attr)
    }
    fn pool_usage(&self, device: usize, pool: PoolHandle) -> Result<PoolUsage> {
        self.sim.pool_usage(device, pool)
    }
    fn pool_reserved_used(&self, device: usize, pool: PoolHandle) -> Result<(u64, u64)> {
        self.sim.pool_reserved_used(device, pool)
    }
    fn pool_reset_peaks(&self, device: usize, pool: PoolHandle) -> Result<()> {
        self.sim.pool_reset_peaks(device, pool)
    }
    fn pool_trim(&self, device: usize, pool: PoolHandle, keep: u64) -> Result<()> {
        self.sim.pool_trim(device, pool, keep)
    }
    fn alloc_async(&self, d: usize, p: PoolHandle, b: u64, s: Stream) -> Result<DevicePtr> {
        self.sim.alloc_async(d, p, b, s)
    }
    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.sim.free_async(device, ptr, stream)
    }
}

impl StreamDriver for Hooked {
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        self.sim.stream_synchronize(device, stream)
    }
    fn event_create(&self, device: usize) -> Result<EventHandle> {
        self.sim.event_create(device)
    }
    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()> {
        self.sim.event_record(device, event, stream)
    }
    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool> {
        if self.counting.load(Ordering::SeqCst) {
            self.queries.fetch_add(1, Ordering::SeqCst);
            if std::thread::current().name() == Some("streampool-releaser") {
                self.releaser_queries.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.sim.event_query(device, event)
    }
    fn event_synchronize(&self, device: usize, event: EventHandle) -> Result<()> {
        self.sim.event_synchronize(device, event)
    }
    fn event_destroy(&self, device: usize, event: EventHandle) {
        self.sim.event_destroy(device, event)
    }
    fn stream_query(&self, device: usize, stream: Stream) -> Result<bool> {
        self.sim.stream_query(device, stream)
    }
    fn stream_wait_event(&self, device: usize, stream: Stream, event: EventHandle) -> Result<()> {
        self.sim.stream_wait_event(device, stream, event)
    }
    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
        self.capture_queries.lock().unwrap().push(stream);
        self.sim.is_capturing(device, stream)
    }
    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        self.sim.alloc_captured(device, bytes, stream)
    }

    fn stream_create(&self, device: usize) -> Result<Stream> {
        self.sim.stream_create(device)
    }

    fn relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.sim.relaxed_capture(f)
    }
}

forward_to_sim!(Hooked: PeerDriver, IpcDriver, VmmDriver);
forward_managed_to_sim!(Hooked);

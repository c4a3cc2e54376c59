//! `Wrapped`: the strict simulator behind a driver that adds what the simulator cannot show by
//! itself. Included with `#[path]` by the tests that need it (not every test binary).
//!
//! - Scattered free memory: the simulator's pools have no fragmentation (any free byte serves
//!   any block), so a pool never grows while it has room. `scatter` gives a pool free bytes in
//!   pieces too small for any block, as a real pool has after mixed sizes: they count in its
//!   reserved bytes (so the pool reports room), serve nothing (so it grows anyway), and a trim
//!   releases them, as `cuMemPoolTrimTo` releases unused memory.
//! - Events: it counts the events created and destroyed, to check nothing is leaked.
//! - Panics: `panic_at_event_record` makes the next `cuEventRecord` panic, as a bug inside
//!   streampool would while it holds a lock (the device's, or the vmm resource's).
#![allow(dead_code)]

#[path = "forward.rs"]
#[macro_use]
mod forward;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use streampool::driver::sim::SimDriver;
use streampool::driver::*;
use streampool::Result;

pub struct Wrapped {
    pub sim: Arc<SimDriver>,
    /// (device, pool) -> scattered free bytes.
    scattered: Mutex<HashMap<(usize, PoolHandle), u64>>,
    pub events_created: AtomicU64,
    pub events_destroyed: AtomicU64,
    pub panic_at_event_record: AtomicBool,
}

impl Wrapped {
    /// A strict simulator of `devices` devices of `memory_bytes`, wrapped.
    pub fn new(devices: usize, memory_bytes: u64) -> Arc<Wrapped> {
        Arc::new(Wrapped {
            sim: Arc::new(SimDriver::new(devices, memory_bytes).strict()),
            scattered: Mutex::new(HashMap::new()),
            events_created: AtomicU64::new(0),
            events_destroyed: AtomicU64::new(0),
            panic_at_event_record: AtomicBool::new(false),
        })
    }

    /// From now on `pool` of `device` also holds `bytes` of free memory too scattered to serve
    /// a block (until a trim).
    pub fn scatter(&self, device: usize, pool: PoolHandle, bytes: u64) {
        *self
            .scattered
            .lock()
            .unwrap()
            .entry((device, pool))
            .or_default() += bytes;
    }

    fn scattered(&self, device: usize, pool: PoolHandle) -> u64 {
        let scattered = self.scattered.lock().unwrap();
        scattered.get(&(device, pool)).copied().unwrap_or(0)
    }
}

impl DeviceDriver for Wrapped {
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
        self.sim.synchronize(device)
    }
}

impl PoolDriver for Wrapped {
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
        let u = self.sim.pool_usage(device, pool)?;
        let scattered = self.scattered(device, pool);
        Ok(PoolUsage {
            reserved_bytes: u.reserved_bytes + scattered,
            reserved_bytes_high: u.reserved_bytes_high + scattered,
            ..u
        })
    }
    fn pool_reserved_used(&self, device: usize, pool: PoolHandle) -> Result<(u64, u64)> {
        let (reserved, used) = self.sim.pool_reserved_used(device, pool)?;
        Ok((reserved + self.scattered(device, pool), used))
    }
    fn pool_reset_peaks(&self, device: usize, pool: PoolHandle) -> Result<()> {
        self.sim.pool_reset_peaks(device, pool)
    }
    fn pool_trim(&self, device: usize, pool: PoolHandle, keep: u64) -> Result<()> {
        self.scattered.lock().unwrap().remove(&(device, pool));
        self.sim.pool_trim(device, pool, keep)
    }
    fn alloc_async(&self, d: usize, p: PoolHandle, b: u64, s: Stream) -> Result<DevicePtr> {
        self.sim.alloc_async(d, p, b, s)
    }
    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.sim.free_async(device, ptr, stream)
    }
}

impl StreamDriver for Wrapped {
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        self.sim.stream_synchronize(device, stream)
    }
    fn event_create(&self, device: usize) -> Result<EventHandle> {
        let event = self.sim.event_create(device)?;
        self.events_created.fetch_add(1, Ordering::SeqCst);
        Ok(event)
    }
    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()> {
        if self.panic_at_event_record.swap(false, Ordering::SeqCst) {
            panic!("injected panic in cuEventRecord");
        }
        self.sim.event_record(device, event, stream)
    }
    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool> {
        self.sim.event_query(device, event)
    }
    fn event_synchronize(&self, device: usize, event: EventHandle) -> Result<()> {
        self.sim.event_synchronize(device, event)
    }
    fn event_destroy(&self, device: usize, event: EventHandle) {
        self.events_destroyed.fetch_add(1, Ordering::SeqCst);
        self.sim.event_destroy(device, event)
    }
    fn stream_query(&self, device: usize, stream: Stream) -> Result<bool> {
        self.sim.stream_query(device, stream)
    }
    fn stream_wait_event(&self, device: usize, stream: Stream, event: EventHandle) -> Result<()> {
        self.sim.stream_wait_event(device, stream, event)
    }
    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
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

forward_to_sim!(Wrapped: PeerDriver, IpcDriver, VmmDriver);
forward_managed_to_sim!(Wrapped);

//! Counters kept per device, and the `#[repr(C)]` snapshot handed to C and Python, assembled
//! from them and the resources' own accounting.
//!
//! Invariant: counters change only under the device lock, together with the state they describe,
//! so a snapshot is always consistent (e.g. `allocated_bytes` equals the sum over live blocks).

use crate::driver::PoolUsage;
use crate::resource::DriverCounts;

/// A quantity with a high-water mark.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    pub current: u64,
    pub peak: u64,
}

impl Gauge {
    #[inline]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    pub fn sub(&mut self, n: u64) {
        debug_assert!(self.current >= n, "gauge underflow");
        self.current -= n;
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// What one device's allocator counts itself (the pool's own figures are read from the driver).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Requested bytes of live allocations.
    pub allocated_bytes: Gauge,
    /// Live bytes plus freed blocks still waiting for record_stream events.
    pub active_bytes: Gauge,
    pub allocations: Gauge,
    pub allocated_bytes_total: u64,
    pub freed_bytes_total: u64,
    pub num_allocs: u64,
    pub num_frees: u64,
    pub num_cache_hits: u64,
    pub num_device_allocs: u64,
    pub num_device_frees: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_growth_syncs: u64,
    pub num_idle_releases: u64,
}

impl DeviceCounters {
    pub fn reset_peaks(&mut self) {
        self.allocated_bytes.reset_peak();
        self.active_bytes.reset_peak();
        self.allocations.reset_peak();
    }
}

/// Statistics of one device, as returned by `streampool_get_stats` (field meanings in docs/abi.md).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolStats {
    pub allocated_bytes: u64,
    pub allocated_bytes_peak: u64,
    pub allocated_bytes_total: u64,
    pub freed_bytes_total: u64,
    pub active_bytes: u64,
    pub active_bytes_peak: u64,
    /// The device's pools (main and small) together.
    pub reserved_bytes: u64,
    /// The sum of each pool's peak: an upper bound of the peak of their sum.
    pub reserved_bytes_peak: u64,
    pub pool_used_bytes: u64,
    pub cached_bytes: u64,
    pub num_allocs: u64,
    pub num_frees: u64,
    pub allocations_current: u64,
    pub allocations_peak: u64,
    pub num_cache_hits: u64,
    pub num_device_allocs: u64,
    pub num_device_frees: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// The cap set by `set_memory_fraction` (0 refuses every allocation); `UINT64_MAX` if none.
    pub memory_limit_bytes: u64,
    pub device_total_bytes: u64,
    /// The shareable pool's reserved and used bytes (that pool is the main pool with
    /// `STREAMPOOL_IPC`; 0 before any shareable allocation).
    pub ipc_reserved_bytes: u64,
    pub ipc_used_bytes: u64,
    /// Allocations that waited for their stream before the pool grew (`STREAMPOOL_TRIM_ON_GROWTH`).
    pub num_growth_syncs: u64,
    /// Pages the virtual-memory backend mapped and unmapped (`STREAMPOOL_BACKEND=vmm`; 0 otherwise).
    pub num_maps: u64,
    pub num_unmaps: u64,
    /// Physical handles it created and released (`cuMemCreate`, `cuMemRelease`: a page, or a
    /// span of pages), and its `cuMemSetAccess` calls.
    pub num_mem_creates: u64,
    pub num_mem_releases: u64,
    pub num_set_access_calls: u64,
    /// Blocks handed to a stream after a GPU-side wait for another stream's free.
    pub num_stream_waits: u64,
    /// Idle releases: times the device gave back its unused memory after being idle
    /// (`STREAMPOOL_IDLE_RELEASE`).
    pub num_idle_releases: u64,
}

/// What a device knows of itself when asked for its statistics.
pub struct DeviceFigures<'a> {
    pub counters: &'a DeviceCounters,
    pub cached_bytes: u64,
    /// The device's resources together.
    pub usage: PoolUsage,
    /// The shareable pool of `streampool.shareable()` (the main pool with `STREAMPOOL_IPC`).
    pub shareable: PoolUsage,
    /// `u64::MAX` if no limit is set.
    pub limit_bytes: u64,
    /// Driver calls the resources made.
    pub driver_counts: DriverCounts,
    pub device_total_bytes: u64,
}

impl StreampoolStats {
    pub fn assemble(f: DeviceFigures<'_>) -> StreampoolStats {
        let c = f.counters;
        StreampoolStats {
            allocated_bytes: c.allocated_bytes.current,
            allocated_bytes_peak: c.allocated_bytes.peak,
            allocated_bytes_total: c.allocated_bytes_total,
            freed_bytes_total: c.freed_bytes_total,
            active_bytes: c.active_bytes.current,
            active_bytes_peak: c.active_bytes.peak,
            reserved_bytes: f.usage.reserved_bytes,
            reserved_bytes_peak: f.usage.reserved_bytes_high,
            pool_used_bytes: f.usage.used_bytes,
            cached_bytes: f.cached_bytes,
            num_allocs: c.num_allocs,
            num_frees: c.num_frees,
            allocations_current: c.allocations.current,
            allocations_peak: c.allocations.peak,
            num_cache_hits: c.num_cache_hits,
            num_device_allocs: c.num_device_allocs,
            num_device_frees: c.num_device_frees,
            num_alloc_retries: c.num_alloc_retries,
            num_ooms: c.num_ooms,
            memory_limit_bytes: f.limit_bytes,
            device_total_bytes: f.device_total_bytes,
            ipc_reserved_bytes: f.shareable.reserved_bytes,
            ipc_used_bytes: f.shareable.used_bytes,
            num_growth_syncs: c.num_growth_syncs,
            num_maps: f.driver_counts.maps,
            num_unmaps: f.driver_counts.unmaps,
            num_mem_creates: f.driver_counts.creates,
            num_mem_releases: f.driver_counts.releases,
            num_set_access_calls: f.driver_counts.set_access_calls,
            num_stream_waits: f.driver_counts.stream_waits,
            num_idle_releases: c.num_idle_releases,
        }
    }
}

//! Counters kept per device, and the `#[repr(C)]` snapshot handed to C and Python.
//!
//! Invariant: counters change only under the device lock, together with the state they describe,
//! so a snapshot is always consistent (e.g. `allocated_bytes` equals the sum over live blocks).

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
    pub memory_limit_bytes: u64,
    pub device_total_bytes: u64,
    /// The shareable pool's reserved and used bytes (that pool is the main pool with
    /// `STREAMPOOL_IPC`; 0 before any shareable allocation).
    pub ipc_reserved_bytes: u64,
    pub ipc_used_bytes: u64,
    /// Allocations that waited for their stream before the pool grew (`STREAMPOOL_TRIM_ON_GROWTH`).
    pub num_growth_syncs: u64,
}

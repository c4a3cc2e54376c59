//! Shared helpers: an allocator over a strict simulated driver, and the simulator's pools found
//! by what they are (shareable or not, in creation order), never by handle number.
#![allow(dead_code)]

use std::sync::Arc;
use streampool::driver::sim::{SimDriver, SimPoolInfo};
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::{Allocator, Config, DeviceAllocator, StreampoolStats};

pub const MIB: u64 = 1 << 20;

pub mod pools;
pub mod vmm;

/// Stream `n` (a raw `CUstream` value; 0 is the legacy default stream).
pub const fn s(n: usize) -> Stream {
    Stream(n)
}

pub struct Rig {
    pub sim: Arc<SimDriver>,
    pub alloc: Allocator,
}

/// `devices` simulated devices of `memory_bytes`; the simulator panics on drop if memory, pools
/// or mappings leaked.
pub fn rig_with(devices: usize, memory_bytes: u64, config: Config) -> Rig {
    let sim = Arc::new(SimDriver::new(devices, memory_bytes).strict());
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    Rig { sim, alloc }
}

pub fn rig(memory_bytes: u64) -> Rig {
    rig_with(2, memory_bytes, base_config())
}

/// As [`rig`], on the CUDA pool backend whatever the backend under test.
pub fn pool_rig(memory_bytes: u64) -> Rig {
    rig_with(2, memory_bytes, pool_config())
}

/// The configuration the tests start from: the backend under test (`STREAMPOOL_TEST_BACKEND`:
/// the library's default, `vmm`, unless set to `pool`; scripts/test runs the backend-neutral
/// suites under both), and no
/// background thread (tests that need its work call it themselves, so nothing changes under
/// them on a slow machine).
pub fn base_config() -> Config {
    let backend = match std::env::var("STREAMPOOL_TEST_BACKEND").as_deref() {
        Ok("vmm") => streampool::config::Backend::Vmm,
        Ok("pool") => streampool::config::Backend::Pool,
        Err(_) => Config::default().backend,
        Ok(other) => panic!("STREAMPOOL_TEST_BACKEND={other:?}: expected pool or vmm"),
    };
    Config {
        backend,
        background: false,
        ..Config::default()
    }
}

/// The CUDA pool backend, whatever the backend under test.
pub fn pool_config() -> Config {
    Config {
        backend: streampool::config::Backend::Pool,
        ..base_config()
    }
}

/// Runs `f`; a panic becomes a message (a worker that panics would leave the others at a barrier).
pub fn unpanicked<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|_| "a panic in the allocator".into())
}

/// True if `[a, a + a_bytes)` and `[b, b + b_bytes)` share a byte.
pub fn overlaps(a: DevicePtr, a_bytes: u64, b: DevicePtr, b_bytes: u64) -> bool {
    a.0 < b.0 + b_bytes && b.0 < a.0 + a_bytes
}

impl Rig {
    /// The allocator of `device`, which must exist (tests that expect a bad device ask
    /// `alloc.device` themselves).
    pub fn device(&self, device: i64) -> &DeviceAllocator {
        self.alloc.device(device).unwrap()
    }

    pub fn stats(&self, device: i64) -> StreampoolStats {
        self.device(device).stats().unwrap()
    }

    pub fn malloc(&self, bytes: u64, device: i64, stream: usize) -> DevicePtr {
        self.alloc.malloc(bytes, device, Stream(stream)).unwrap()
    }

    pub fn free(&self, ptr: DevicePtr, device: i64) {
        self.alloc.free(ptr, device).unwrap()
    }

    /// The pools `device` created that are not destroyed, in creation order.
    pub fn live_pools(&self, device: usize) -> Vec<SimPoolInfo> {
        self.sim
            .pool_infos(device)
            .into_iter()
            .filter(|p| !p.destroyed)
            .collect()
    }

    /// The device's own (not shareable) pools in creation order: the main pool, then the
    /// small-block pool if there is one.
    pub fn own_pools(&self, device: usize) -> Vec<SimPoolInfo> {
        let pools: Vec<SimPoolInfo> = self
            .live_pools(device)
            .into_iter()
            .filter(|p| !p.shareable)
            .collect();
        assert!(pools.len() <= 2, "device {device}: {pools:?}");
        pools
    }

    /// The device's one shareable pool (`streampool.shareable()`), which must exist.
    pub fn shareable_pool(&self, device: usize) -> SimPoolInfo {
        let mut pools: Vec<SimPoolInfo> = self
            .live_pools(device)
            .into_iter()
            .filter(|p| p.shareable)
            .collect();
        assert_eq!(pools.len(), 1, "device {device}: one shareable pool");
        pools.remove(0)
    }

    /// Returns every cached block and checks nothing is left in the pools.
    pub fn finish(self) {
        self.alloc.empty_cache().unwrap();
        self.sim.complete_all();
        assert_eq!(self.sim.outstanding_bytes(), 0, "leaked device memory");
    }
}

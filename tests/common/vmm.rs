//! The vmm backend's rig: an allocator on `STREAMPOOL_BACKEND=vmm` over a strict simulator, whose
//! blocks are touched on their streams as they are handed out (so an unmapped page or an unmap
//! under unfinished work panics), and which must end with no pool memory and no page mapped.

use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::{Allocator, Config, StreampoolStats};

pub use super::MIB;
pub const PAGE: u64 = 2 * MIB;
pub const S1: Stream = Stream(1);
pub const S2: Stream = Stream(2);

pub struct Rig {
    pub sim: Arc<SimDriver>,
    pub alloc: Allocator,
}

pub fn vmm_config() -> Config {
    Config {
        backend: Backend::Vmm,
        background: false,
        ..Config::default()
    }
}

pub fn rig_with(devices: usize, memory_bytes: u64, config: Config) -> Rig {
    let sim = Arc::new(SimDriver::new(devices, memory_bytes).strict());
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    Rig { sim, alloc }
}

pub fn rig() -> Rig {
    rig_with(1, 256 * MIB, vmm_config())
}

/// How long an idle page takes to turn cold in the tests of cold pages (by default none does).
pub const COLD_AFTER_MS: u64 = 10;

/// As [`vmm_config`], idle pages cold after [`COLD_AFTER_MS`]: they back new blocks before the
/// device grows.
pub fn cold_config() -> Config {
    Config {
        vmm_cold_after_ms: COLD_AFTER_MS,
        ..vmm_config()
    }
}

impl Rig {
    pub fn device(&self, device: i64) -> &streampool::DeviceAllocator {
        self.alloc.device(device).unwrap()
    }

    pub fn malloc(&self, bytes: u64, device: i64, stream: Stream) -> DevicePtr {
        let ptr = self.alloc.malloc(bytes, device, stream).unwrap();
        self.sim
            .touch(device as usize, device as usize, ptr, bytes, stream)
            .unwrap();
        ptr
    }

    pub fn stats(&self) -> StreampoolStats {
        self.alloc.device(0).unwrap().stats().unwrap()
    }

    pub fn finish(self) {
        self.alloc.empty_cache().unwrap();
        assert_eq!(self.sim.outstanding_bytes(), 0, "pool memory left");
        for d in 0..self.alloc.device_count() {
            assert_eq!(
                self.sim.physical_bytes(d),
                0,
                "device {d}: mapped memory left"
            );
        }
    }
}

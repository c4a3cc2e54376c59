//! Shared helpers: an allocator over a strict simulated driver.
#![allow(dead_code)]

use std::sync::Arc;
use streampool::driver::sim::SimDriver;
use streampool::driver::Driver;
use streampool::{Allocator, Config, StreampoolStats};

pub const MIB: u64 = 1 << 20;

pub struct Rig {
    pub sim: Arc<SimDriver>,
    pub alloc: Allocator,
}

/// `devices` simulated devices of `memory_bytes`; the simulator panics on drop if memory leaked.
pub fn rig_with(devices: usize, memory_bytes: u64, config: Config) -> Rig {
    let sim = Arc::new(SimDriver::new(devices, memory_bytes).strict());
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    Rig { sim, alloc }
}

pub fn rig(memory_bytes: u64) -> Rig {
    rig_with(2, memory_bytes, Config::default())
}

impl Rig {
    pub fn stats(&self, device: i64) -> StreampoolStats {
        self.alloc.stats(device).unwrap()
    }

    /// Returns every cached block and checks nothing is left in the pools.
    pub fn finish(self) {
        self.alloc.empty_cache().unwrap();
        self.sim.complete_all();
        assert_eq!(self.sim.outstanding_bytes(), 0, "leaked device memory");
    }
}

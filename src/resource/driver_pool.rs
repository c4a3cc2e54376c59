//! The driver's own pool (`cuMemAllocAsync` on the device's default pool) as a [`Resource`]:
//! graph memory — an allocation on a stream that captures a CUDA graph (outside any PyTorch
//! memory pool) becomes a node of the graph.
//!
//! Invariants: its blocks are never cached (they go back as free nodes of their graph); graph
//! memory belongs to its graph — it is not streampool's to hold, count against the memory limit
//! or keep waiting for other streams; it reports no reserved memory of its own and trims
//! nothing.

use super::{Resource, Traits, Usage};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::Result;
use std::sync::Arc;

pub struct DriverPoolResource {
    driver: Arc<dyn Driver>,
    device: usize,
    traits: Traits,
}

impl DriverPoolResource {
    /// Graph memory for allocations on capturing streams.
    pub fn graph_memory(driver: &Arc<dyn Driver>, device: usize) -> DriverPoolResource {
        DriverPoolResource {
            driver: Arc::clone(driver),
            device,
            traits: Traits {
                label: "graph memory",
                returns_before_growth: false,
                fast_path: false,
                cacheable: false,
                held: false,
                shareable: false,
                reuses_across_streams: true,
                // It holds nothing for itself: a free goes back to the driver's pool.
                trims: true,
                checks_free_size: false,
                growth_granule_bytes: crate::resource::cuda_pool::POOL_GRANULE_BYTES,
                // The driver's pool: what a free gave it comes back at a synchronisation.
                frees_applied_at_sync: true,
                takes_idle_blocks: false,
                keeps_under_limit: false,
            },
        }
    }
}

impl Resource for DriverPoolResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        self.driver.alloc_captured(self.device, bytes, stream)
    }

    fn deallocate(&self, ptr: DevicePtr, _bytes: u64, stream: Stream) -> Result<()> {
        self.driver.free_async(self.device, ptr, stream)
    }

    fn usage(&self) -> Result<Usage> {
        Ok(Usage::default())
    }

    fn trim(&self, _keep_bytes: u64) -> Result<()> {
        Ok(())
    }

    fn traits(&self) -> Traits {
        self.traits
    }
}

//! The driver's own pool (`cuMemAllocAsync` on the device's default pool) as a [`Resource`], in
//! two roles: graph memory — an allocation on a stream that captures a CUDA graph becomes a node
//! of the graph — and the capture fallback, for a block a resource could not map while a capture
//! was under way elsewhere on the device.
//!
//! Invariants: its blocks are never cached (graph memory goes back as a free node of its graph;
//! the fallback's blocks go back to the driver so that the pool its memory came from can reuse
//! it); graph memory belongs to its graph — it is not streampool's to hold, count against the
//! memory limit or keep waiting for other streams — while the fallback's blocks are held like any
//! other; neither reports reserved memory of its own nor trims anything.

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
        DriverPoolResource::new(driver, device, "graph memory", false)
    }

    /// The capture fallback: blocks held like any other, from the driver's pool.
    pub fn capture_fallback(driver: &Arc<dyn Driver>, device: usize) -> DriverPoolResource {
        DriverPoolResource::new(driver, device, "driver pool (during a capture)", true)
    }

    fn new(
        driver: &Arc<dyn Driver>,
        device: usize,
        label: &'static str,
        held: bool,
    ) -> DriverPoolResource {
        DriverPoolResource {
            driver: Arc::clone(driver),
            device,
            traits: Traits {
                label,
                returns_before_growth: false,
                cacheable: false,
                held,
                shareable: false,
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

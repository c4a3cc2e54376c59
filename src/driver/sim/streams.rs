//! The simulator's streams, events and graph capture.
//!
//! Invariant: every call that enqueues work ticks its stream's clock; an event is complete once
//! its stream has completed the tick of its last record; graph memory counts as device memory.

use super::{driver_error, SimDriver, SimFault};
use crate::driver::{DevicePtr, EventHandle, Stream, StreamDriver};
use crate::error::Result;
use std::sync::atomic::Ordering;

impl SimDriver {
    /// True if `ptr` was allocated from the device's default pool (`alloc_captured`: graph
    /// memory, or a block a resource could not map during a capture) and is still allocated.
    pub fn is_driver_memory(&self, device: usize, ptr: DevicePtr) -> bool {
        self.devices[device].lock().captured_live.contains_key(&ptr)
    }
}

impl StreamDriver for SimDriver {
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuStreamSynchronize")?;
        let mut d = self.device(device, "cuStreamSynchronize")?;
        let clock = d.streams.entry(stream).or_default();
        clock.completed = clock.submitted;
        d.retire_completed();
        Ok(())
    }

    fn event_create(&self, device: usize) -> Result<EventHandle> {
        self.take_fault(SimFault::EventCreate, "cuEventCreate")?;
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        self.device(device, "cuEventCreate")?
            .events
            .insert(id, None);
        Ok(EventHandle::from_raw(id))
    }

    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::EventRecord, "cuEventRecord")?;
        let mut d = self.device(device, "cuEventRecord")?;
        let seq = d.tick(stream);
        match d.events.get_mut(&event.raw()) {
            Some(slot) => {
                *slot = Some((stream, seq));
                Ok(())
            }
            None => Err(driver_error(
                "cuEventRecord",
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            )),
        }
    }

    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool> {
        self.count("cuEventQuery", 1);
        let d = self.device(device, "cuEventQuery")?;
        match d.events.get(&event.raw()) {
            Some(None) => Ok(true),
            Some(Some(at)) => Ok(d.completed(*at)),
            None => Err(driver_error(
                "cuEventQuery",
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            )),
        }
    }

    fn event_destroy(&self, device: usize, event: EventHandle) {
        if let Ok(mut d) = self.device(device, "cuEventDestroy") {
            d.events.remove(&event.raw());
        }
    }

    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
        if self.capturing_streams.load(Ordering::Relaxed) == 0 {
            return Ok(false);
        }
        Ok(self
            .device(device, "cuStreamIsCapturing")?
            .capturing
            .contains(&stream))
    }

    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let call = "cuMemAllocAsync";
        self.take_fault(SimFault::Alloc, call)?;
        let mut d = self.device(device, call)?;
        let fits = d
            .memory_in_use_bytes()
            .checked_add(bytes)
            .is_some_and(|total| total <= self.memory_bytes);
        if !fits {
            return Err(SimDriver::out_of_memory(call));
        }
        let ptr = d
            .claim_range(bytes)
            .ok_or_else(|| SimDriver::out_of_memory(call))?;
        d.captured_live.insert(ptr, bytes);
        d.tick(stream);
        Ok(ptr)
    }
}

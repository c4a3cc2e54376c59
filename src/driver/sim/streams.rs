//! The simulator's streams, events and graph capture.
//!
//! Invariant: every call that enqueues work ticks its stream's clock; an event is complete once
//! its stream has completed the tick of its last record; graph memory counts as device memory,
//! and once freed it is reusable by its stream at once, by others once that stream's work up to
//! the free has completed (the default pool's stream order).

use super::{driver_error, SimDriver, SimFault, StreamWait};
use crate::driver::{DevicePtr, EventHandle, Stream, StreamDriver};
use crate::error::Result;
use std::sync::atomic::Ordering;

impl SimDriver {
    /// The event recorded last on `device`, for tests that look at a fence.
    pub fn event_recorded_last(&self, device: usize) -> Option<EventHandle> {
        let d = self.devices[device].lock();
        d.last_recorded_event.map(EventHandle::from_raw)
    }

    /// True if `ptr` was allocated from the device's default pool (`alloc_captured`: graph
    /// memory, or a block a resource could not map during a capture) and is still allocated.
    pub fn is_driver_memory(&self, device: usize, ptr: DevicePtr) -> bool {
        self.devices[device].lock().captured_live.contains_key(&ptr)
    }

    /// How much work has been submitted to `stream` so far (its clock's tick): what a GPU that is
    /// behind the program completes later, with [`SimDriver::complete_stream_to`].
    pub fn stream_tick(&self, device: usize, stream: Stream) -> u64 {
        let d = self.devices[device].lock();
        d.streams.get(&stream).map_or(0, |c| c.submitted)
    }

    /// The work submitted to `stream` up to its tick `tick` completes (and the work it waited
    /// for); later work stays pending.
    pub fn complete_stream_to(&self, device: usize, stream: Stream, tick: u64) {
        self.devices[device].lock().complete_stream_to(stream, tick);
    }
}

/// The error a GPU gives for a stream handle that was destroyed.
/// Streams made by `stream_create` count from here (tests use small numbers for theirs).
const SIM_OWN_STREAMS: usize = 0x5eed_0000_0000;

fn destroyed(call: &'static str) -> crate::Error {
    driver_error(call, 400, "CUDA_ERROR_INVALID_HANDLE (a destroyed stream)")
}

impl StreamDriver for SimDriver {
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuStreamSynchronize")?;
        if self.take_injected(SimFault::StreamSynchronize) {
            return Err(driver_error(
                "cuStreamSynchronize",
                999,
                "CUDA_ERROR_UNKNOWN (injected)",
            ));
        }
        let mut d = self.device(device, "cuStreamSynchronize")?;
        self.check_capture_mode(&d, "cuStreamSynchronize");
        d.complete_stream(stream);
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
        if d.destroyed.contains(&stream) {
            return Err(destroyed("cuEventRecord"));
        }
        let seq = d.tick(stream);
        match d.events.get_mut(&event.raw()) {
            Some(slot) => {
                *slot = Some((stream, seq));
                d.last_recorded_event = Some(event.raw());
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
        self.check_capture_mode(&d, "cuEventQuery");
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

    fn event_synchronize(&self, device: usize, event: EventHandle) -> Result<()> {
        self.take_fault(SimFault::StreamSynchronize, "cuEventSynchronize")?;
        let mut d = self.device(device, "cuEventSynchronize")?;
        self.check_capture_mode(&d, "cuEventSynchronize");
        match d.events.get(&event.raw()) {
            Some(None) => Ok(()),
            Some(&Some((stream, tick))) => {
                d.complete_stream_to(stream, tick);
                d.retire_completed();
                Ok(())
            }
            None => Err(driver_error(
                "cuEventSynchronize",
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

    fn stream_query(&self, device: usize, stream: Stream) -> Result<bool> {
        self.count("cuStreamQuery", 1);
        let d = self.device(device, "cuStreamQuery")?;
        self.check_capture_mode(&d, "cuStreamQuery");
        if d.destroyed.contains(&stream) {
            return Err(destroyed("cuStreamQuery"));
        }
        if d.capturing.contains(&stream) {
            return Err(driver_error(
                "cuStreamQuery",
                900,
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            ));
        }
        Ok(d.streams
            .get(&stream)
            .is_none_or(|c| c.completed >= c.submitted))
    }

    fn stream_wait_event(&self, device: usize, stream: Stream, event: EventHandle) -> Result<()> {
        self.take_fault(SimFault::StreamWait, "cuStreamWaitEvent")?;
        let mut d = self.device(device, "cuStreamWaitEvent")?;
        let on = match d.events.get(&event.raw()) {
            Some(on) => *on,
            None => {
                return Err(driver_error(
                    "cuStreamWaitEvent",
                    400,
                    "CUDA_ERROR_INVALID_HANDLE",
                ))
            }
        };
        // An event never recorded, or already complete, adds nothing to wait for.
        if let Some(on) = on.filter(|on| !d.completed(*on)) {
            let from_tick = d.tick(stream);
            d.waits.push(StreamWait {
                stream,
                from_tick,
                on,
            });
        }
        Ok(())
    }

    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
        if self.capturing_streams.load(Ordering::Relaxed) == 0
            && self.destroyed_streams.load(Ordering::Relaxed) == 0
        {
            return Ok(false);
        }
        let d = self.device(device, "cuStreamIsCapturing")?;
        if d.destroyed.contains(&stream) {
            return Err(destroyed("cuStreamIsCapturing"));
        }
        Ok(d.capturing.contains(&stream))
    }

    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let call = "cuMemAllocAsync";
        self.take_fault(SimFault::Alloc, call)?;
        let mut d = self.device(device, call)?;
        if let Some(ptr) = d.reuse_captured(stream, bytes) {
            d.captured_live.insert(ptr, bytes);
            d.tick(stream);
            return Ok(ptr);
        }
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
        d.note_in_use();
        d.tick(stream);
        Ok(ptr)
    }

    fn stream_create(&self, device: usize) -> Result<Stream> {
        drop(self.device(device, "cuStreamCreate")?);
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        Ok(Stream(SIM_OWN_STREAMS + id))
    }

    fn relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        super::in_relaxed_mode(f)
    }
}

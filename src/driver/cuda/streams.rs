//! Streams, events and graph capture of the CUDA driver (`cuStream*`, `cuEvent*`,
//! `cuStreamIsCapturing`, graph allocation nodes), and streampool's own stream.
//!
//! Invariant: every call that streampool makes for its own bookkeeping while the program may be
//! capturing a graph runs in relaxed capture mode (see `relaxed`), so it cannot invalidate that
//! capture.

use super::{check, event_ptr, relaxed, stream_ptr, timed, timed_query, too_large, CudaDriver};
use crate::driver::{DevicePtr, EventHandle, Stream, StreamDriver};
use crate::error::Result;
use cudarc::driver::sys;

impl StreamDriver for CudaDriver {
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        let _scope = self.enter(device)?;
        relaxed(|| {
            // SAFETY: `stream` is a stream of `device` handed to us by the caller of malloc.
            timed("cuStreamSynchronize", || unsafe {
                sys::cuStreamSynchronize(stream_ptr(stream))
            })
        })
    }

    fn event_create(&self, device: usize) -> Result<EventHandle> {
        let _scope = self.enter(device)?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; timing is disabled so record/query stay cheap.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        Ok(EventHandle::from_raw(event as usize))
    }

    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()> {
        let _scope = self.enter(device)?;
        relaxed(|| {
            // SAFETY: an event created by event_create on this device.
            timed("cuEventRecord", || unsafe {
                sys::cuEventRecord(event_ptr(event), stream_ptr(stream))
            })
        })
    }

    fn event_query(&self, _device: usize, event: EventHandle) -> Result<bool> {
        relaxed(|| {
            // SAFETY: an event created by event_create; querying needs no current context.
            timed_query("cuEventQuery", || unsafe {
                sys::cuEventQuery(event_ptr(event))
            })
        })
    }

    fn event_synchronize(&self, device: usize, event: EventHandle) -> Result<()> {
        let _scope = self.enter(device)?;
        relaxed(|| {
            // SAFETY: an event created by event_create on this device.
            timed("cuEventSynchronize", || unsafe {
                sys::cuEventSynchronize(event_ptr(event))
            })
        })
    }

    fn event_destroy(&self, _device: usize, event: EventHandle) {
        // SAFETY: destroys an event this driver created; it is not used afterwards.
        unsafe { sys::cuEventDestroy_v2(event_ptr(event)) };
    }

    fn stream_query(&self, device: usize, stream: Stream) -> Result<bool> {
        let _scope = self.enter(device)?;
        relaxed(|| {
            // SAFETY: `stream` is a stream of `device` handed to us by the caller of malloc.
            timed_query("cuStreamQuery", || unsafe {
                sys::cuStreamQuery(stream_ptr(stream))
            })
        })
    }

    fn stream_wait_event(&self, device: usize, stream: Stream, event: EventHandle) -> Result<()> {
        let _scope = self.enter(device)?;
        // SAFETY: `stream` is the caller's stream of `device`, `event` one this driver created;
        // the call only enqueues a dependency.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream_ptr(stream), event_ptr(event), 0)
        })
    }

    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
        let _scope = self.enter(device)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: valid out-pointer; `stream` is the caller's stream handle.
        timed("cuStreamIsCapturing", || unsafe {
            sys::cuStreamIsCapturing(stream_ptr(stream), &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let _scope = self.enter(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        let bytes = usize::try_from(bytes).map_err(|_| too_large(bytes))?;
        // SAFETY: valid out-pointer; during capture this records a graph allocation node.
        check("cuMemAllocAsync", unsafe {
            sys::cuMemAllocAsync(&mut ptr, bytes, stream_ptr(stream))
        })?;
        Ok(DevicePtr(ptr))
    }

    fn stream_create(&self, device: usize) -> Result<Stream> {
        self.create_stream(device)
    }

    fn relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        relaxed(f)
    }
}

impl CudaDriver {
    fn create_stream(&self, device: usize) -> Result<Stream> {
        let _scope = self.enter(device)?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stream is never destroyed (it lives with the process).
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(Stream(stream as usize))
    }
}

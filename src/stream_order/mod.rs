//! Stream ordering, written once for every layer that reuses memory across streams: the spare
//! events ([`EventPool`]), the streams seen capturing a CUDA graph ([`CaptureWatch`]), items that
//! complete in the order their events were recorded ([`InOrder`]), the lazily recorded
//! per-stream fences of freed memory ([`Fences`]), and where each thread's synchronisation of the
//! device began ([`SyncMarks`]). The device's waits for `record_stream` (`device::waits`) and the
//! virtual-memory resource (`resource::vmm`) are both built on them.
//!
//! The rule they serve: memory freed on stream S may be handed out again on S at once (stream
//! order), on another stream T after T waits on the GPU for an event recorded on S after the free
//! (`cuStreamWaitEvent`, no CPU wait), and on any stream once that event has completed.
//!
//! Invariants: nothing here takes a lock or waits for the GPU — every driver call made here
//! (event create, record, query; capture status; stream query) returns at once, so the owner may
//! call in with its own lock held; no event is recorded on a stream known to be capturing (the
//! record would join the graph): owners ask [`CaptureWatch`] first; an event is reused only once
//! it is known to have completed or after a synchronisation; the driver is an argument, each
//! owner keeps its own instances under its own lock.

mod captures;
mod completion;
mod events;
mod fences;
mod sync_marks;

pub(crate) use captures::CaptureWatch;
pub(crate) use completion::InOrder;
pub(crate) use events::EventPool;
pub(crate) use fences::Fences;
pub(crate) use sync_marks::SyncMarks;

/// True if a fence may be recorded on `stream` now: the driver says it is not capturing a graph
/// (a record would join the graph). A stream the driver cannot answer for counts as capturing:
/// the record waits for a later look. The one place this rule is written.
pub(crate) fn may_record(
    driver: &dyn crate::driver::Driver,
    device: usize,
    stream: crate::driver::Stream,
) -> bool {
    !driver.is_capturing(device, stream).unwrap_or(true)
}

/// True if `stream` has finished all the work submitted to it so far (`cuStreamQuery`), asked
/// only where a record would be allowed ([`may_record`]): a capturing stream, or one the driver
/// cannot answer for, has not.
pub(crate) fn finished(
    driver: &dyn crate::driver::Driver,
    device: usize,
    stream: crate::driver::Stream,
) -> bool {
    may_record(driver, device, stream) && driver.stream_query(device, stream).unwrap_or(false)
}

#[cfg(all(test, feature = "sim"))]
mod tests;

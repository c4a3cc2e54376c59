//! The resource's side of stream ordering ([`crate::stream_order`]): bringing its free ranges up
//! to date with the GPU (fences polled, pending ones settled or recorded, ranges promoted), and
//! handing a stream memory another stream freed behind a GPU-side wait for that stream's fence.
//!
//! Invariants: no fence is recorded or queried on a capturing stream, and from the background
//! thread none is recorded at all; during a known capture only a thread of the program looks, in
//! relaxed capture mode; a range freed on another stream is handed out only after the stream it
//! goes to has waited (on the GPU) for the fence covering the free.

use super::{Caller, VmmResource, VmmState};
use crate::driver::Stream;

impl VmmResource {
    /// Brings the free ranges up to date with the GPU: freed ranges whose fences completed
    /// become ready for every stream (at a miss, those of the streams a bounded poll reached:
    /// [`Caller::Miss`]); pending fences are completed where their streams have
    /// finished all their work (so that memory just freed can merge, be moved or serve any
    /// stream at this miss) and, from a thread of the program, recorded on the others (for the
    /// next look);
    /// blocks freed during a capture that has ended get their fence numbers; blocked pages are
    /// fixed. Nothing during a known capture, which forbids event queries and records. (The
    /// background thread's callers then unmap the retired pages whose fences completed.)
    pub(super) fn update_ranges(&self, st: &mut VmmState, caller: Caller) {
        if self.capturing(st) {
            if caller != Caller::Background {
                self.update_ranges_during_capture(st);
            }
            return;
        }
        if st.blocked {
            self.unblock(st);
            st.blocked = !st.blocked_pages().is_empty();
        }
        let now_ms = self.driver.now_ms();
        let (driver, device) = (self.driver.as_ref(), self.device);
        let mut done = match caller {
            Caller::Miss => st.fences.poll_some(driver, device),
            Caller::Program | Caller::Background => st.fences.poll(driver, device),
        };
        done.extend(match caller {
            Caller::Background => st.fences.complete_pending_of_idle_streams(driver, device),
            Caller::Program | Caller::Miss => st.fences.settle_pending(driver, device),
        });
        self.promote(st, done, now_ms);
    }

    /// [`VmmResource::update_ranges`] for a thread of the program while a capture is known: in
    /// relaxed capture mode (so that no capture in global mode is disturbed), the recorded fences
    /// are polled and the pending ones settled, on streams that are not capturing only.
    pub(super) fn update_ranges_during_capture(&self, st: &mut VmmState) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let mut done = Vec::new();
        let _ = driver.relaxed_capture(&mut || {
            done = st.fences.poll(driver, device);
            done.extend(st.fences.settle_pending(driver, device));
            Ok(())
        });
        self.promote(st, done, driver.now_ms());
    }

    /// The calling thread is about to synchronise the device: the fences' mark is noted for
    /// [`VmmResource::complete_fences_at_sync`] (none during a known capture).
    pub(super) fn note_sync_begins(&self) {
        let Ok(mut st) = self.lock_enabled() else {
            return;
        };
        let mark = (!st.captures.any_known()).then(|| st.fences.mark());
        st.sync_marks.note(mark);
    }

    /// At the program's synchronisation of the device, on the thread that began it
    /// ([`VmmResource::note_sync_begins`]): if nothing was freed and no fence recorded since it
    /// began, every fence has completed, and the ranges they cover become ready for every stream
    /// without a query or a record. Otherwise (or without a mark, or during a known capture) the
    /// fences stay as they are, for the caller's look to ask the driver.
    pub(super) fn complete_fences_at_sync(&self, st: &mut VmmState) {
        let Some(mark) = st.sync_marks.take() else {
            return;
        };
        if st.captures.any_known() {
            return;
        }
        if let Some(done) = st.fences.complete_all_unchanged_since(mark) {
            let now_ms = self.driver.now_ms();
            self.promote(st, done, now_ms);
        }
    }

    /// Freed ranges covered by fences that completed become ready for every stream.
    pub(super) fn promote(&self, st: &mut VmmState, done: Vec<(Stream, u64)>, now_ms: u64) {
        for (stream, completed) in done {
            st.large.promote(stream, completed);
            st.carriers.promote(stream, completed);
            // Each merge's range as it was then: a later merge may have taken an earlier one in
            // (and a return below split it), so each start is looked up as the ranges are now.
            for (start, _) in st.small.promote(stream, completed) {
                self.return_free_pages(st, start, now_ms);
            }
        }
    }

    /// Polls the recorded fences of some streams, as a miss does (no record, no capture check: a
    /// query is allowed during a capture of another stream in relaxed mode, and the fronts are
    /// fences of streams that were not capturing when they were recorded).
    pub(super) fn collect_completed(&self, st: &mut VmmState, now_ms: u64) {
        if st.captures.any_known() {
            return;
        }
        let done = st.fences.poll_some(self.driver.as_ref(), self.device);
        self.promote(st, done, now_ms);
    }

    /// A free range of `bytes` among the small or the large ranges that `stream` may use: at
    /// once, once the ranges were updated with the GPU, or after a GPU-side wait for another
    /// stream's fence.
    pub(super) fn take_free(
        &self,
        st: &mut VmmState,
        small: bool,
        bytes: u64,
        stream: Stream,
    ) -> Option<u64> {
        for update in [false, true] {
            if update {
                self.update_ranges(st, Caller::Miss);
            }
            let ranges = match small {
                true => &mut st.small,
                false => &mut st.large,
            };
            if let Some(start) = ranges.best_fit(bytes, stream) {
                ranges.take(start, bytes);
                return Some(start);
            }
        }
        self.take_after_wait(st, small, bytes, stream)
    }

    /// The best fit among ranges freed on other streams, handed out after `stream` was made to
    /// wait (on the GPU) for the fence of the free; `None` if there is none or the wait failed.
    pub(super) fn take_after_wait(
        &self,
        st: &mut VmmState,
        small: bool,
        bytes: u64,
        stream: Stream,
    ) -> Option<u64> {
        if self.capturing(st) {
            return None;
        }
        let ranges = match small {
            true => &mut st.small,
            false => &mut st.large,
        };
        let (start, other, seq) = ranges.best_fit_other(bytes, stream)?;
        if !self.wait_for_fence(st, stream, other, seq) {
            return None;
        }
        let ranges = match small {
            true => &mut st.small,
            false => &mut st.large,
        };
        ranges.take(start, bytes);
        Some(start)
    }

    /// Makes `stream` wait on the GPU for fence `seq` of `other` (recording it first if it is
    /// still pending, unless `other` has begun a capture since: the record would join the
    /// graph). False if the wait could not be made.
    pub(super) fn wait_for_fence(
        &self,
        st: &mut VmmState,
        stream: Stream,
        other: Stream,
        seq: u64,
    ) -> bool {
        let (driver, device) = (self.driver.as_ref(), self.device);
        if st.fences.event_of(other, seq).is_none() {
            if !crate::stream_order::may_record(driver, device, other) {
                return false;
            }
            if let Err(e) = st.fences.record_pending(driver, device, other) {
                log::debug!("device {device}: {e}; not reusing memory {other:#x} freed yet");
                return false;
            }
        }
        let Some(event) = st.fences.event_of(other, seq) else {
            return false;
        };
        if let Err(e) = driver.stream_wait_event(device, stream, event) {
            log::debug!("device {device}: {e}; not reusing memory {other:#x} freed yet");
            return false;
        }
        st.counts.stream_waits += 1;
        true
    }
}

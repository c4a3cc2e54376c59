//! The block freed last, kept aside: handed out again at once to the next request of its stream
//! and size — a loop that frees and allocates the same block touches no range, no page, no clock
//! and no driver — and given back to its ranges before anything else looks at them.
//!
//! Invariant: the slot holds at most one freed block, neither live nor in any range; every path
//! that reads or changes the ranges (an allocation it does not serve, a release, a trim) gives it
//! back first; given back, the block is in the state its free left it in — freed on its stream
//! behind the fence number the free took, or ready if that fence has completed since.

use super::ranges::State;
use super::{VmmResource, VmmState, FENCE_INTERVAL_US};
use crate::driver::Stream;

/// A freed block: where, how large, the stream it was freed on, the fence number its free took,
/// and when (the driver's clock).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub start: u64,
    pub bytes: u64,
    pub stream: Stream,
    pub seq: u64,
    /// When it was freed, in microseconds (its milliseconds, what its ranges keep, are worked
    /// out when it goes back to them: most slots are taken again before).
    pub freed_us: u64,
}

/// Which streams allocated or freed since the program last synchronised: the last one, and
/// whether one before it differed. Noted at every free ([`VmmResource::put_slot`]) and where an
/// allocation misses the slot (a hit is a block its stream allocated before, so it names no new
/// stream).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct StreamsSinceSync {
    last: Option<Stream>,
    several: bool,
}

impl StreamsSinceSync {
    #[inline(always)]
    fn note(&mut self, stream: Stream) {
        if self.last != Some(stream) {
            self.several |= self.last.is_some();
            self.last = Some(stream);
        }
    }

    /// True if more than one stream allocated or freed since the last call (the program's
    /// synchronisation); the stream seen last stays known.
    pub fn several_since_last_look(&mut self) -> bool {
        std::mem::take(&mut self.several)
    }
}

impl VmmResource {
    /// The slot's block if it is `bytes` freed on `stream`; otherwise the slot is given back.
    #[inline]
    pub(super) fn take_slot(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Option<u64> {
        // Looked at in place: a hit takes only its start, not the whole slot through the stack.
        let Some(slot) = &st.slot else {
            st.streams_since_sync.note(stream);
            return None;
        };
        if slot.bytes == bytes && slot.stream == stream {
            let start = slot.start;
            st.slot = None;
            return Some(start);
        }
        if let Some(slot) = st.slot.take() {
            self.give_freed(st, slot);
        }
        st.streams_since_sync.note(stream);
        None
    }

    /// Keeps `[start, start + bytes)`, just freed on `stream`, in the slot, covered by the
    /// stream's next fence (recorded now if one is due); the block there before goes back to its
    /// ranges.
    #[inline(always)]
    pub(super) fn put_slot(&self, st: &mut VmmState, start: u64, bytes: u64, stream: Stream) {
        st.streams_since_sync.note(stream);
        let now_us = self.driver.now_us();
        let (seq, due) = st.fences.free_on(stream, now_us, FENCE_INTERVAL_US);
        let slot = Slot {
            start,
            bytes,
            stream,
            seq,
            freed_us: now_us,
        };
        if due {
            self.record_due_fence(st, stream, now_us / 1000);
        }
        // An empty slot (a free after its block was taken again) is filled without reading it back.
        if st.slot.is_none() {
            st.slot = Some(slot);
        } else if let Some(before) = st.slot.replace(slot) {
            self.give_freed(st, before);
        }
    }

    /// [`VmmResource::put_slot`] when `stream`'s fence is due (once an interval, not a free):
    /// it is recorded unless the stream captures.
    #[inline(never)]
    fn record_due_fence(&self, st: &mut VmmState, stream: Stream, now_ms: u64) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        if !crate::stream_order::may_record(driver, device, stream) {
            return;
        }
        match st.fences.record_pending(driver, device, stream) {
            // With each fence recorded, those that completed are collected (of a bounded
            // number of streams, as at a miss): freed memory becomes ready for every stream,
            // and idle, while the program runs.
            Ok(()) => self.collect_completed(st, now_ms),
            Err(e) => log::debug!("device {device}: a fence on {stream:#x}: {e}; later"),
        }
    }

    /// Gives back what is kept aside for reuse: the slot's block, if there is one, then the
    /// slabs left empty ([`super::slabs`]).
    pub(super) fn return_kept(&self, st: &mut VmmState) {
        self.return_slot(st);
        let _ = self.return_empty_slabs(st);
    }

    /// Gives the slot's block back to its ranges, if there is one.
    pub(super) fn return_slot(&self, st: &mut VmmState) {
        if let Some(slot) = st.slot.take() {
            self.give_freed(st, slot);
        }
    }

    /// A freed block goes back to its ranges: reusable by its stream at once, by others after
    /// the fence its free took (recorded at most once a millisecond at a free, never on a
    /// capturing stream, or when someone needs it), by any stream once that has completed.
    fn give_freed(&self, st: &mut VmmState, slot: Slot) {
        let Slot {
            start,
            bytes,
            stream,
            seq,
            freed_us,
        } = slot;
        let freed_ms = freed_us / 1000;
        let state = match st.fences.outstanding(stream, seq) {
            true => State::Freed { stream, seq },
            false => State::Ready,
        };
        self.give_back(st, start, bytes, state, freed_ms);
    }
}

//! The blocks freed last, kept aside ([`super::kept`]): handed out again at once to the next
//! request of their stream and size — a loop that frees and allocates blocks of the sizes it
//! used touches no range, no page, no clock and no driver — and given back to their ranges when
//! newer frees displace them, when a request or a free of another stream comes, before an
//! allocation that nothing at hand serves goes on (the ranges they merge into may serve it), and
//! before a release, a trim or a sleep.
//!
//! Invariant: a kept block is neither live nor in any range; given back, it is in the state its
//! free left it in — freed on its stream behind the fence number the free took, or ready if that
//! fence has completed since.

use super::kept::{Found, Slot};
use super::ranges::State;
use super::{VmmResource, VmmState, FENCE_INTERVAL_US};
use crate::driver::Stream;

impl VmmResource {
    /// A kept block of `bytes` freed on `stream`, the newest, if there is one. Blocks kept for
    /// another stream go back to their ranges instead.
    #[inline]
    pub(super) fn take_slot(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Option<u64> {
        if st.kept.holds_other_than(stream) {
            self.return_slot(st);
            return None;
        }
        match st.kept.take(bytes) {
            Found::Kept(slot) => Some(slot.start),
            Found::Keep => None,
            Found::GiveBack => {
                self.return_slot(st);
                None
            }
        }
    }

    /// Keeps `[start, start + bytes)`, just freed on `stream`, aside, covered by the stream's
    /// next fence (recorded now if one is due); the block it displaces goes back to its ranges.
    #[inline(always)]
    pub(super) fn put_slot(&self, st: &mut VmmState, start: u64, bytes: u64, stream: Stream) {
        let now_us = self.driver.now_us();
        let now_ms = now_us / 1000;
        let (seq, due) = st.fences.free_on(stream, now_us, FENCE_INTERVAL_US);
        let slot = Slot {
            start,
            bytes,
            stream,
            seq,
            freed_ms: now_ms,
        };
        if due {
            self.record_due_fence(st, stream, now_ms);
        }
        if st.kept.holds_other_than(stream) || st.kept.cold() {
            self.return_slot(st);
        }
        if let Some(displaced) = st.kept.keep(slot) {
            self.give_freed(st, displaced);
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
            // With each fence recorded, those that completed are collected: freed memory
            // becomes ready for every stream, and idle, while the program runs.
            Ok(()) => self.collect_completed(st, now_ms),
            Err(e) => log::debug!("device {device}: a fence on {stream:#x}: {e}; later"),
        }
    }

    /// Gives back what is kept aside for reuse: the kept blocks, then the slabs left empty
    /// ([`super::slabs`]).
    pub(super) fn return_kept(&self, st: &mut VmmState) {
        self.return_slot(st);
        let _ = self.return_empty_slabs(st);
    }

    /// Gives every kept block back to its ranges, the oldest first.
    pub(super) fn return_slot(&self, st: &mut VmmState) {
        while let Some(slot) = st.kept.take_oldest() {
            self.give_freed(st, slot);
        }
    }

    /// A kept block goes back to its ranges: reusable by its stream at once, by others after
    /// the fence its free took (recorded at most once a millisecond at a free, never on a
    /// capturing stream, or when someone needs it), by any stream once that has completed. Its
    /// pages are marked used at its free.
    fn give_freed(&self, st: &mut VmmState, slot: Slot) {
        let Slot {
            start,
            bytes,
            stream,
            seq,
            freed_ms,
        } = slot;
        let state = match st.fences.outstanding(stream, seq) {
            true => State::Freed { stream, seq },
            false => State::Ready,
        };
        self.give_back(st, start, bytes, state, freed_ms);
    }
}

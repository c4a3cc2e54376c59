//! The blocks a stream freed last, kept aside ([`super::kept`]): handed out again at once to its
//! next requests of their sizes — a loop that frees and allocates blocks of the sizes it used
//! touches no range, no page, no clock and no driver. While requests seldom find their size among
//! the recent frees ([`super::kept::Kept::cold`]), only the block freed last is kept, and it goes
//! back at the next request it does not serve, as one slot did. Kept blocks go back to their
//! ranges when newer frees displace them, when another stream allocates or frees, before an
//! allocation that nothing at hand serves goes on (the ranges they merge into may serve it), and
//! before a trim, an idle release, a sleep, or a release above the threshold.
//!
//! Invariant: a kept block is neither live nor in any range; given back, it is in the state its
//! free left it in — freed on its stream behind the fence number the free took, or ready if that
//! fence has completed since.

use super::kept::{Found, Freed};
use super::ranges::State;
use super::{VmmResource, VmmState, FENCE_INTERVAL_US};
use crate::driver::Stream;

impl VmmResource {
    /// A kept block of `bytes` freed on `stream`, the newest, if there is one. Blocks kept for
    /// another stream go back to their ranges instead, and so do all while the ring is cold.
    #[inline]
    pub(super) fn take_kept(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Option<u64> {
        if st.kept.holds_other_than(stream) {
            self.return_kept_blocks(st);
            return None;
        }
        match st.kept.take(bytes) {
            Found::Kept(slot) => Some(slot.start),
            Found::Keep => None,
            Found::GiveBack => {
                self.return_kept_blocks(st);
                None
            }
        }
    }

    /// Keeps `[start, start + bytes)`, just freed on `stream`, aside, covered by the stream's
    /// next fence (recorded now if one is due); the block it displaces goes back to its ranges.
    #[inline(always)]
    pub(super) fn keep_freed(&self, st: &mut VmmState, start: u64, bytes: u64, stream: Stream) {
        let now_us = self.driver.now_us();
        let now_ms = now_us / 1000;
        let (seq, due) = st.fences.free_on(stream, now_us, FENCE_INTERVAL_US);
        let slot = Freed {
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
            self.return_kept_blocks(st);
        }
        if let Some(displaced) = st.kept.keep(slot) {
            self.give_freed(st, displaced);
        }
    }

    /// [`VmmResource::keep_freed`] when `stream`'s fence is due (once an interval, not a free):
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
        self.return_kept_blocks(st);
        let _ = self.return_empty_slabs(st);
    }

    /// Gives every kept block back to its ranges, the oldest first.
    pub(super) fn return_kept_blocks(&self, st: &mut VmmState) {
        while let Some(slot) = st.kept.take_oldest() {
            self.give_freed(st, slot);
        }
    }

    /// A kept block goes back to its ranges: reusable by its stream at once, by others after
    /// the fence its free took (recorded at most once a millisecond at a free, never on a
    /// capturing stream, or when someone needs it), by any stream once that has completed. Its
    /// pages are marked used at its free.
    fn give_freed(&self, st: &mut VmmState, slot: Freed) {
        let Freed {
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

//! Giving memory back to the device: above the release threshold once unused for a second
//! (`release_above_threshold`), everything not in use once the device is idle
//! (`release_idle`), both from the device's background thread, and on `trim` after a
//! synchronisation. At the program's synchronisation, what was freed before it becomes ready
//! for every stream where more than one stream allocated or freed since the last one
//! (`settle_after_sync`).
//!
//! Invariant: nothing here waits for the GPU but `trim_after_sync` (it synchronises the device
//! itself when a fence may be outstanding), and nothing records on a program's stream but it and
//! the settling at a synchronisation (on streams still busy, as a miss does); a page goes back
//! only from a `Ready` range (see [`super::mapping`]).

use super::spans::GiveBack;
use super::{Caller, VmmResource, VmmState, RELEASE_AFTER_MS};
use crate::error::Result;
use std::sync::atomic::Ordering;

impl VmmResource {
    /// Called regularly by the device's background thread: memory above the release threshold
    /// that has been unused for a second goes back to the device. True while memory above the
    /// threshold is still held.
    pub fn release_above_threshold(&self) -> bool {
        let threshold = self.release_threshold_bytes.load(Ordering::Relaxed);
        let Ok(mut st) = self.lock_enabled() else {
            return false;
        };
        // Fences of the last frees are collected here, so that memory is ready for every stream
        // (and idle, for moves and releases) without waiting for a miss.
        self.return_slot(&mut st);
        self.update_ranges(&mut st, Caller::Background);
        // A page at a time, the program may be allocating; first, so that handles mapped at
        // retired pages until now may go back below.
        if !self.unmap_retired_piecewise(&mut st) {
            return false;
        }
        self.release_above(&mut st, threshold)
    }

    /// [`VmmResource::release_above_threshold`]'s release, with its answer.
    fn release_above(&self, st: &mut VmmState, threshold: u64) -> bool {
        if st.physical_bytes(self.page_bytes) <= threshold {
            return false;
        }
        // Empty slabs go back only when memory is to be released: a loop keeps reusing them.
        let _ = self.return_empty_slabs(st);
        // Unused for a second or more: not memory a loop uses every step.
        // Nothing has been unused that long before the clock has run that long.
        let Some(unused_before_ms) = self.driver.now_ms().checked_sub(RELEASE_AFTER_MS) else {
            return true;
        };
        self.release_down_to(st, threshold, Some(unused_before_ms));
        st.physical_bytes(self.page_bytes) > threshold
    }

    /// The device is idle: every idle page and spare handle goes back to the device, whatever
    /// the threshold. True if memory not in use is still held (its fences have not completed,
    /// or a capture is under way): the caller tries again later.
    pub fn release_idle(&self) -> bool {
        let Ok(mut st) = self.lock_enabled() else {
            return false;
        };
        self.return_kept(&mut st);
        self.update_ranges(&mut st, Caller::Background);
        // (Under the lock: the device is idle.)
        self.unmap_retired(&mut st);
        self.release_down_to(&mut st, 0, None);
        // An idle device ends a cycle: what was held at the synchronisations before the idle
        // period says nothing of the next phase, whose memory comes in ordinary spans again
        // (or a page a handle, where pages move) until a trim or a sleep gives memory back. Not
        // while asleep: a sleep's cycle is for what the program maps after the wake, however long
        // it slept.
        if st.asleep.is_none() {
            st.cycle_back_to_bytes = 0;
            st.ahead_back_to_bytes = 0;
            st.given_back_since_idle = false;
            st.used_max_bytes = st.used_bytes;
        }
        st.large.freed_bytes() + st.carriers.freed_bytes() + st.small.freed_bytes() > 0
            || !st.retiring.is_empty()
            || self.capturing(&mut st)
    }

    /// Every free page above `keep_bytes` goes back to the device, once every fence of a free
    /// made before now has completed (recorded and waited for here if one may be outstanding;
    /// at the program's synchronisation none is where nothing was freed since it began): a
    /// trim asked for (`empty_cache()`, after the device's flush), or the release threshold's at
    /// the program's synchronisation (`cause`).
    pub(super) fn trim_after_sync(&self, keep_bytes: u64, cause: GiveBack) -> Result<()> {
        let mut st = self.lock_enabled()?;
        self.return_kept(&mut st);
        // At the program's synchronisation, where nothing was freed since it began, every fence
        // completes here: nothing below is then recorded, waited for or queried.
        if cause == GiveBack::Threshold {
            self.complete_fences_at_sync(&mut st);
        }
        if self.capturing(&mut st) {
            return Ok(());
        }
        // Frees on streams destroyed since: no fence can be recorded on them, but their work is
        // done once the device has synchronised — after they are noted (one destroyed between
        // the caller's synchronisation and now may still have had work queued).
        let (driver, device) = (self.driver.as_ref(), self.device);
        let gone = st.fences.pending_of_gone_streams(driver, device);
        // Fences of frees made before the device's synchronisation may not be recorded yet:
        // record them, and wait for every fence (another thread may have freed since the
        // caller's synchronisation), so that every free page can go back.
        st.fences.record_all_pending(driver, device);
        if st.fences.any_outstanding() || !gone.is_empty() {
            drop(st);
            self.driver.synchronize(self.device)?;
            st = self.state.lock();
        }
        self.update_ranges(&mut st, Caller::Program);
        let done = st.fences.complete_pending(&gone);
        let now_ms = driver.now_ms();
        self.promote(&mut st, done, now_ms);
        self.unmap_retired(&mut st);
        let before_bytes = st.physical_bytes(self.page_bytes);
        self.release_down_to(&mut st, keep_bytes, None);
        // Memory went back at a synchronisation: it may cycle, and the slack may start afresh
        // ([`super::spans`]).
        self.note_given_back(&mut st, before_bytes, cause);
        Ok(())
    }

    /// At the program's synchronisation of the device (no release threshold), where more than
    /// one stream allocated or freed since the last one: the ranges are brought up to date with
    /// the GPU, every stream's fences polled — the fences of frees made before it have completed,
    /// so what was freed becomes ready for every stream and merges (the slot's block given back
    /// first). Without it a stream kept preferring its own freed ranges, between
    /// another stream's, and the device grew (multistream replayed: peak 1.27x its live bytes,
    /// 1.06x with it). No synchronisation of its own, and, on the thread whose beginning was
    /// noted with nothing freed since, no driver call either (its fences complete at once);
    /// otherwise queries, and records on streams still busy (other threads' work), so that a
    /// program synchronising often pays microseconds.
    pub(super) fn settle_after_sync(&self) -> Result<()> {
        // Disabled, it has nothing to settle (its error reaches the program at its next call).
        let Ok(mut st) = self.lock_enabled() else {
            return Ok(());
        };
        // One stream alone allocated and freed since the last synchronisation: its frees serve
        // it at once, and a miss of its own polls its fences. (Settling churn's 200
        // frees of one stream took 25,700 instructions a synchronisation, replayed; its hook took
        // 9.8-10.7 us on an H200 before, 2.5-3.2 after.)
        if !st.streams_since_sync.several_since_last_look() {
            let _ = st.sync_marks.take();
            return Ok(());
        }
        self.return_slot(&mut st);
        // Where nothing was freed since the synchronisation began, its fences complete without
        // a query; the look below then has nothing to ask.
        self.complete_fences_at_sync(&mut st);
        self.update_ranges(&mut st, Caller::Program);
        Ok(())
    }
}

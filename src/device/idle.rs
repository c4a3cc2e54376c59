//! Memory handed back when the device is idle, and the resources' release threshold while it is
//! busy: what the background thread does for a device ([`crate::background`]).
//!
//! A device that has seen no allocation and no free for `STREAMPOOL_IDLE_RELEASE` returns its
//! cache and the blocks whose streams are done to their resources, which give back every idle
//! page (or pool memory) — whatever the release threshold. Memory the GPU still uses is released
//! at a later look, once its streams have caught up. A CUDA pool learns that a free completed
//! only at a synchronisation call, so where the device has one and holds more than its blocks,
//! an idle release synchronises the device (no lock held, relaxed capture mode) before the trim:
//! on the idle period's first try that may, and on every try that handed blocks back. This
//! blocks the background thread while the device's queued work finishes. The vmm backend
//! tracks its frees with events and never synchronises here.
//!
//! When a release is due and how often a period tries is the rule of [`IdleWatch`] alone
//! (`look`, `released`); the device does the release.
//!
//! Invariants: the activity count changes under the device lock with every allocation and free,
//! and only then; the background thread reads it under that lock, waiting for it (the lock's
//! other holders, statistics reads and trims, are not activity); nothing is released and nothing
//! synchronised on a disabled device (a panic may have left its books half-updated), nor
//! during a capture known on this device or while PyTorch routes this
//! device's allocations to a graph pool (it opens the route before it begins a capture, and for
//! `use_mem_pool`); the pass runs in relaxed capture mode, so that a capture in global mode
//! the device does not know of yet forbids it nothing, and never queries a capturing stream; a
//! synchronisation put off so is made at a later try; an idle release is tried again only while
//! more may come, at most `IDLE_TRIES` times per idle period.

use super::DeviceAllocator;
use crate::background::Tended;
use crate::sync::Mutex;

/// Idle releases of one idle period, made while memory may still become releasable (its streams
/// are still working, or a capture is under way): one a tick, for a minute at most.
const IDLE_TRIES: u32 = 1200;

/// What the background thread knows of one device's activity.
#[derive(Debug, Default)]
pub(super) struct IdleWatch {
    /// The device's activity count at the last look (`None` before the first), and when it last
    /// changed.
    seen_activity: Option<u64>,
    since_ms: u64,
    /// Idle releases made since then.
    tries: u32,
    /// The last idle release left nothing for later.
    done: bool,
    /// An idle release of this period synchronised the device.
    synced: bool,
}

pub(super) type Watch = Mutex<IdleWatch>;

impl IdleWatch {
    /// A look at the device at `now_ms`, whose activity count is `activity`: a new count begins
    /// a new idle period. `Some(synced)` when an idle release is due now (`delay_ms` without
    /// activity, more may come, tries left), with whether one of this period synchronised the
    /// device; `None` otherwise.
    pub fn look(&mut self, activity: u64, now_ms: u64, delay_ms: Option<u64>) -> Option<bool> {
        // The first look begins the first period: a device is not idle since time 0.
        if self.seen_activity != Some(activity) {
            *self = IdleWatch {
                seen_activity: Some(activity),
                since_ms: now_ms,
                ..IdleWatch::default()
            };
        }
        let due = delay_ms.is_some_and(|delay_ms| now_ms.saturating_sub(self.since_ms) >= delay_ms);
        (due && !self.done && self.tries < IDLE_TRIES).then_some(self.synced)
    }

    /// An idle release was made: `more` may become releasable later, `synced_now` it
    /// synchronised the device. True for the period's first (what `num_idle_releases` counts).
    pub fn released(&mut self, more: bool, synced_now: bool) -> bool {
        let first = self.tries == 0;
        self.tries += 1;
        self.done = !more;
        self.synced |= synced_now;
        first
    }
}

impl Tended for DeviceAllocator {
    fn tend(&self) {
        let Some(setup) = self.setup.get() else {
            return;
        };
        // A disabled device keeps what it holds: its books may be half-updated, and a block
        // they show cached or waiting may be live.
        if self.check_enabled().is_err() {
            return;
        }
        // In relaxed capture mode, as the driver already makes its queries, mappings and
        // synchronisations: a capture in global mode that another thread began, which the device
        // may not know of yet (nothing allocated in it so far), forbids the pass none of its other
        // calls either (memory info, pool trims). (The capturing stream itself is never queried:
        // `stream_order::finished`.) Refused only by a driver that is gone: the next look tries.
        let relaxed = self.driver.relaxed_capture(&mut || {
            self.tend_pass(setup);
            Ok(())
        });
        if let Err(e) = relaxed {
            log::debug!("device {}: background pass skipped: {e}", self.device);
        }
    }
}

impl DeviceAllocator {
    /// [`Tended::tend`]'s pass: the release threshold while busy, the idle release once due.
    fn tend_pass(&self, setup: &super::DeviceSetup) {
        let now_ms = self.driver.now_ms();
        let delay_ms = setup.settings.idle_release_ms;
        let due = delay_ms.and_then(|_| {
            let activity = self.lock_enabled().ok()?.activity;
            self.idle.lock().look(activity, now_ms, delay_ms)
        });
        // While busy: the threshold of resources that apply it themselves.
        for tending in setup.tending() {
            // (Timed in the call-counting build: the vmm resource holds its lock for it, but
            // while it hands the lock over between two unmaps of retired pages, and waits to
            // take it again.)
            timed_section!(
                "background: release above threshold",
                tending.release_above_threshold()
            );
        }
        // (A release the device's disabling stopped is not one.)
        if let Some((more, synced_now)) = due.and_then(|synced| self.release_idle(synced)) {
            if self.idle.lock().released(more, synced_now) {
                if let Ok(mut st) = self.lock_enabled() {
                    st.ledger.counters_mut().num_idle_releases += 1;
                }
            }
        }
    }

    /// Returns the cache and finished waits, and lets every resource give back what it does not
    /// use, synchronising first where a CUDA pool needs it (see the module); `synced`: an earlier
    /// try of this idle period synchronised. Returns (more may become releasable later, this try
    /// synchronised); `None` if nothing was done (the device is not set up, or disabled).
    pub(super) fn release_idle(&self, synced: bool) -> Option<(bool, bool)> {
        let setup = self.setup.get()?;
        let mut blocks = Vec::new();
        {
            // (Disabled since the pass began: as in `tend`.)
            let mut st = self.lock_enabled().ok()?;
            // Forgets captures that ended, and hands back the waits that are over.
            self.collect_waits(&mut st, &mut blocks);
            if st.waits.capturing() {
                drop(st);
                let _ = self.return_blocks(blocks);
                return Some((true, false));
            }
            blocks.extend(st.ledger.drain_cache());
            blocks.extend(st.ledger.take_unreturned());
        }
        let count = blocks.len();
        let _ = self.return_blocks(blocks);
        let sync = match !synced || count > 0 {
            true => self.synchronize_before_trims(setup),
            false => PoolFrees::NotNeeded,
        };
        let mut more = sync == PoolFrees::PutOff;
        let released = setup.for_each_own(|r| {
            more |= crate::resource::release_idle(r)?;
            Ok(())
        });
        if let Err(e) = released {
            log::warn!("device {}: idle release: {e}", self.device);
        }
        let waiting = !self.state.lock().waits.is_idle();
        log::debug!(
            "device {}: idle: returned {count} blocks, released unused memory",
            self.device
        );
        Some((more || waiting, sync == PoolFrees::Synced))
    }

    /// Synchronises the device before the trims of the idle release, where one of its resources
    /// is trimmed there and applies its frees only at a synchronisation
    /// ([`crate::resource::synchronised_before_idle_trim`]: a CUDA pool) and the device holds
    /// more than its blocks; put off while a capture is known or a route to a graph pool is open.
    fn synchronize_before_trims(&self, setup: &super::DeviceSetup) -> PoolFrees {
        if !setup
            .own
            .iter()
            .any(|r| crate::resource::synchronised_before_idle_trim(r.as_ref()))
        {
            return PoolFrees::NotNeeded;
        }
        let Ok(reserved_bytes) = setup.reserved_bytes() else {
            return PoolFrees::NotNeeded;
        };
        {
            let st = self.state.lock();
            if reserved_bytes <= st.ledger.gauges().held_bytes {
                return PoolFrees::NotNeeded;
            }
            if self.capture_possible(&st) {
                return PoolFrees::PutOff;
            }
        }
        match self.driver.synchronize(self.device) {
            Ok(()) => PoolFrees::Synced,
            Err(e) => {
                log::warn!("device {}: idle release: {e}", self.device);
                PoolFrees::NotNeeded
            }
        }
    }
}

/// What an idle release did about the synchronisation its trims need
/// ([`DeviceAllocator::synchronize_before_trims`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolFrees {
    NotNeeded,
    PutOff,
    Synced,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY_MS: Option<u64> = Some(2000);

    /// A watch that has seen `activity` since `since_ms`.
    fn watch(activity: u64, since_ms: u64) -> IdleWatch {
        let mut w = IdleWatch::default();
        assert_eq!(w.look(activity, since_ms, DELAY_MS), None);
        w
    }

    #[test]
    fn a_release_is_due_once_the_device_saw_no_activity_for_the_delay() {
        let mut w = watch(7, 1000);
        assert_eq!(w.look(7, 2999, DELAY_MS), None, "1999 ms idle");
        assert_eq!(w.look(7, 3000, DELAY_MS), Some(false), "2000 ms idle");
        assert_eq!(w.look(7, 3000, None), None, "no idle release set");
    }

    /// The first look found the count still 0 (the device's first allocation had failed, or
    /// was a shareable one) and took the device for idle since time 0: an idle release, and the
    /// statistics changed, at the background thread's first tick (found by the fuzzer).
    #[test]
    fn the_first_look_begins_the_first_period() {
        let mut w = IdleWatch::default();
        assert_eq!(w.look(0, 1_000_000, DELAY_MS), None, "just seen");
        assert_eq!(w.look(0, 1_001_999, DELAY_MS), None);
        assert_eq!(w.look(0, 1_002_000, DELAY_MS), Some(false));
    }

    #[test]
    fn activity_begins_a_new_period() {
        let mut w = watch(7, 1000);
        assert_eq!(w.look(8, 3000, DELAY_MS), None, "an allocation at 3000");
        assert_eq!(w.look(8, 4999, DELAY_MS), None);
        assert_eq!(w.look(8, 5000, DELAY_MS), Some(false));
    }

    #[test]
    fn a_period_releases_until_nothing_is_left_and_is_counted_once() {
        let mut w = watch(7, 0);
        assert_eq!(w.look(7, 2000, DELAY_MS), Some(false));
        assert!(
            w.released(true, true),
            "the period's first release is counted"
        );
        assert_eq!(
            w.look(7, 2050, DELAY_MS),
            Some(true),
            "it synchronised: later tries know"
        );
        assert!(!w.released(true, false), "counted once a period");
        assert_eq!(
            w.look(7, 2060, DELAY_MS),
            Some(true),
            "a try that did not sync forgets not"
        );
        assert!(!w.released(false, false));
        assert_eq!(w.look(7, 2100, DELAY_MS), None, "nothing left for later");
        assert_eq!(w.look(8, 2200, DELAY_MS), None, "a new period");
        assert_eq!(
            w.look(8, 4200, DELAY_MS),
            Some(false),
            "forgets the last period's sync"
        );
        assert!(w.released(false, false), "and counts again");
    }

    #[test]
    fn a_period_tries_at_most_idle_tries_times() {
        let mut w = watch(7, 0);
        for tick in 0..IDLE_TRIES {
            let now_ms = 2000 + u64::from(tick);
            assert_eq!(w.look(7, now_ms, DELAY_MS), Some(false), "try {tick}");
            w.released(true, false);
        }
        assert_eq!(w.look(7, 10_000_000, DELAY_MS), None);
    }
}

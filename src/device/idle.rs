//! Memory handed back when the device is idle, and the resources' release threshold while it is
//! busy: what the background thread does for a device ([`crate::background`]).
//!
//! A device that has seen no allocation and no free for `STREAMPOOL_IDLE_RELEASE` returns its
//! cache and the blocks whose streams are done to their resources, which give back every idle
//! page (or pool memory) — whatever the release threshold. Memory the GPU still uses is released
//! at a later look, once its streams have caught up. A CUDA pool learns that a free completed
//! only at a synchronisation call, so where the device has one, its first idle release of an
//! idle period synchronises the device (no lock held) before the trim; the vmm backend tracks
//! its frees with events and never synchronises here.
//!
//! Invariants: the activity count changes under the device lock with every allocation and free,
//! and is read with a `try_lock` (a device whose lock is taken is busy); nothing is released and
//! nothing synchronised during a known capture or while PyTorch routes allocations to a graph
//! pool (it opens the route before it begins a capture); an idle release is tried again only
//! while a resource says more may come, at most `IDLE_TRIES` times per idle period.

use super::DeviceAllocator;
use crate::background::Tended;
use crate::sync::Mutex;

/// Idle releases of one idle period, made while memory may still become releasable (its streams
/// are still working, or a capture is under way): one a tick, for a minute at most.
const IDLE_TRIES: u32 = 1200;

/// What the background thread knows of one device's activity.
#[derive(Debug, Default)]
pub(super) struct IdleWatch {
    /// The device's activity count at the last look, and when it last changed.
    seen_activity: u64,
    since_ms: u64,
    /// Idle releases made since then.
    tries: u32,
    /// The last idle release left nothing for later.
    done: bool,
}

pub(super) type Watch = Mutex<IdleWatch>;

impl Tended for DeviceAllocator {
    fn tend(&self) {
        let Some(setup) = self.setup.get() else {
            return;
        };
        let now_ms = self.driver.now_ms();
        let activity = match self.state.try_lock() {
            Some(st) => st.activity,
            None => u64::MAX, // busy right now: counts as activity
        };
        let (idle_now, first) = {
            let mut w = self.idle.lock();
            if activity != w.seen_activity || activity == u64::MAX {
                *w = IdleWatch {
                    seen_activity: activity,
                    since_ms: now_ms,
                    tries: 0,
                    done: false,
                };
            }
            let due = setup
                .settings
                .idle_release_ms
                .is_some_and(|delay_ms| now_ms.saturating_sub(w.since_ms) >= delay_ms);
            (due && !w.done && w.tries < IDLE_TRIES, w.tries == 0)
        };
        // While busy: the threshold of resources that apply it themselves.
        for r in &setup.own {
            if let Some(tending) = r.capabilities().tending {
                tending.release_above_threshold();
            }
        }
        if idle_now {
            let more = self.release_idle(first);
            let mut w = self.idle.lock();
            if w.tries == 0 {
                self.state.lock().ledger.counters_mut().num_idle_releases += 1;
            }
            w.tries += 1;
            w.done = !more;
        }
    }
}

impl DeviceAllocator {
    /// Returns the cache and finished waits, and lets every resource give back what it does not
    /// use; synchronises first where a CUDA pool needs it and `first` (see the module). True if
    /// more may become releasable later.
    pub(super) fn release_idle(&self, first: bool) -> bool {
        let Some(setup) = self.setup.get() else {
            return false;
        };
        let mut blocks = Vec::new();
        {
            let mut st = self.state.lock();
            // Forgets captures that ended, and hands back the waits that are over.
            self.collect_waits(&mut st, &mut blocks);
            if st.waits.capturing() {
                drop(st);
                let _ = self.return_blocks(blocks);
                return true;
            }
            blocks.extend(st.ledger.drain_cache());
            blocks.extend(st.ledger.take_unreturned());
        }
        let count = blocks.len();
        let _ = self.return_blocks(blocks);
        if first {
            self.apply_pool_frees(&setup.own);
        }
        let mut more = false;
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
        more || waiting
    }

    /// Synchronises the device if one of `own` is a CUDA pool (it applies stream-ordered frees
    /// only at a synchronisation) and no capture is known or about to begin.
    fn apply_pool_frees(&self, own: &[std::sync::Arc<dyn crate::resource::Resource>]) {
        if !own.iter().any(|r| r.capabilities().tending.is_none()) || self.routes.any_open() {
            return;
        }
        if self.state.lock().waits.capturing() {
            return;
        }
        if let Err(e) = self.driver.synchronize(self.device) {
            log::debug!("device {}: idle release: {e}", self.device);
        }
    }
}

//! The background thread: every few tens of milliseconds it tends each device that asked for it —
//! the idle release, and the release threshold of resources that apply it themselves — so that
//! memory goes back to the device without the program calling anything.
//!
//! Invariants: one thread per process, started when the first device registers; it holds weak
//! references, so it keeps no device alive, and forgets a device once it is gone; its list's lock
//! is a leaf (released before it calls a device); at exit no pass starts and one under way is
//! waited for (briefly), so the thread is not inside the driver while the driver shuts down;
//! a panic inside one look is caught there: that one is no longer tended (logged), the others
//! still are, and the exit does not wait for a pass that will never end; under loom it does not
//! exist.

use std::sync::Weak;

/// Something the background thread looks after.
pub trait Tended: Send + Sync {
    /// One look: release what is due.
    fn tend(&self);
}

/// How often registered devices are looked at.
#[cfg(not(loom))]
const TICK: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(not(loom))]
mod thread {
    use super::{Tended, Weak, TICK};
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, OnceLock, TryLockError};

    /// What the thread looks after; `None` if the thread could not be started.
    type List = Mutex<Vec<Weak<dyn Tended>>>;
    static TENDED: OnceLock<Option<List>> = OnceLock::new();
    static STOPPING: AtomicBool = AtomicBool::new(false);
    /// Held by the thread while it works on devices, so that the exit waits for that to end.
    static IN_PASS: Mutex<()> = Mutex::new(());

    /// At exit: no pass starts any more, and one under way is waited for (briefly). Not in a
    /// fork child: the thread does not exist there, and its lock may have been held at the fork.
    extern "C" fn stop() {
        STOPPING.store(true, Ordering::Relaxed);
        if crate::fork::in_fork_child() {
            return;
        }
        for _ in 0..100 {
            // (Poisoned: the thread is gone, no pass is under way.)
            if !matches!(IN_PASS.try_lock(), Err(TryLockError::WouldBlock)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn start() -> Option<List> {
        let spawned = std::thread::Builder::new()
            .name("streampool-releaser".into())
            .spawn(run);
        if let Err(e) = spawned {
            log::warn!(
                "streampool: no background thread ({e}); idle memory is released only by \
                 empty_cache and trim"
            );
            return None;
        }
        // SAFETY: registers a handler that only touches atomics and a mutex of this module.
        unsafe { libc::atexit(stop) };
        Some(Mutex::new(Vec::new()))
    }

    pub(super) fn register(tended: Weak<dyn Tended>) {
        if let Some(list) = TENDED.get_or_init(start) {
            list.lock().unwrap_or_else(|e| e.into_inner()).push(tended);
        }
    }

    fn run() {
        // The list exists once `start` has returned; wait for it.
        let list = loop {
            if let Some(list) = TENDED.get() {
                match list {
                    Some(list) => break list,
                    None => return,
                }
            }
            std::thread::sleep(TICK);
        };
        loop {
            std::thread::sleep(TICK);
            let tended: Vec<Weak<dyn Tended>> = {
                let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
                list.retain(|w| w.strong_count() > 0);
                list.clone()
            };
            let _pass = IN_PASS.lock().unwrap_or_else(|e| e.into_inner());
            if STOPPING.load(Ordering::Relaxed) {
                return;
            }
            for weak in &tended {
                let Some(t) = weak.upgrade() else { continue };
                let looked = catch_unwind(AssertUnwindSafe(|| t.tend()));
                // The last reference, if the program dropped the device meanwhile: its drop
                // (which waits for the device, and may meet what a panic left) runs here, and
                // is caught too. (Not inside the look's catch: a panic in a drop while a panic
                // unwinds aborts the process.)
                let dropped = catch_unwind(AssertUnwindSafe(move || drop(t)));
                if looked.is_err() || dropped.is_err() {
                    forget(list, weak);
                }
            }
        }
    }

    /// A look at `weak` panicked: it is tended no more (a panic under one of its locks disabled
    /// it anyway; elsewhere, the next look would most likely panic again).
    fn forget(list: &List, weak: &Weak<dyn Tended>) {
        log::error!(
            "streampool: the background thread's look at a device panicked; that device's idle \
             memory is no longer released by itself (empty_cache and trim still release it, \
             unless the panic disabled the device, which then refuses every call)"
        );
        let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| !Weak::ptr_eq(w, weak));
    }
}

/// Asks the background thread to tend `tended` from now on, for as long as it lives.
pub fn register(tended: Weak<dyn Tended>) {
    #[cfg(not(loom))]
    thread::register(tended);
    #[cfg(loom)]
    drop(tended);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{register, Tended};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Counts its looks; panics at each if `panics`.
    #[derive(Default)]
    struct Looked {
        looks: AtomicU32,
        panics: bool,
    }

    impl Tended for Looked {
        fn tend(&self) {
            self.looks.fetch_add(1, Ordering::SeqCst);
            assert!(!self.panics, "a look that panics (this test's)");
        }
    }

    #[test]
    fn a_look_that_panics_is_dropped_and_the_others_go_on() {
        let bad = Arc::new(Looked {
            panics: true,
            ..Looked::default()
        });
        let good = Arc::new(Looked::default());
        register(Arc::downgrade(&bad) as _);
        register(Arc::downgrade(&good) as _);
        let deadline = Instant::now() + Duration::from_secs(20);
        while good.looks.load(Ordering::SeqCst) < 5 {
            assert!(Instant::now() < deadline, "the thread stopped tending");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            bad.looks.load(Ordering::SeqCst),
            1,
            "tended again after it panicked"
        );
    }
}

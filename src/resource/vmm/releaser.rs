//! The background releaser: a thread that, every few milliseconds, lets virtual-memory resources
//! give back physical memory above their release threshold that the GPU had not finished with
//! when it was freed — so an idle process hands memory to others without synchronising.
//!
//! Invariants: the thread starts only when a resource first has memory above its threshold
//! waiting for the GPU (never with the default threshold, `max`); it holds weak references, so it
//! keeps no resource alive; its list's lock is a leaf (released before it calls a resource), and
//! a wake during a pass is never lost; at exit no pass starts and one under way is waited for;
//! under loom it does not exist.

use super::VmmResource;
use std::sync::Weak;

/// How often waiting resources are looked at.
#[cfg(not(loom))]
const TICK: std::time::Duration = std::time::Duration::from_millis(10);

#[cfg(not(loom))]
mod thread {
    use super::{VmmResource, Weak, TICK};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Condvar, Mutex, OnceLock};

    struct Releaser {
        waiting: Mutex<Vec<Weak<VmmResource>>>,
        wake: Condvar,
    }

    static RELEASER: OnceLock<Option<Releaser>> = OnceLock::new();
    static STOPPING: AtomicBool = AtomicBool::new(false);
    /// Held by the thread while it works on resources, so that the exit waits for that to end.
    static IN_PASS: Mutex<()> = Mutex::new(());

    /// At exit: no pass starts any more, and one under way is waited for (briefly), so that the
    /// thread is not inside the driver while the driver shuts down. Not in a fork child: the
    /// thread does not exist there, and its lock may have been held at the fork.
    extern "C" fn stop() {
        STOPPING.store(true, Ordering::Relaxed);
        if crate::fork::in_fork_child() {
            return;
        }
        for _ in 0..100 {
            if IN_PASS.try_lock().is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn start() -> Option<Releaser> {
        let spawned = std::thread::Builder::new()
            .name("streampool-releaser".into())
            .spawn(run);
        if let Err(e) = spawned {
            log::warn!("streampool: no background releaser ({e}); memory above the release threshold is released at frees and allocations only");
            return None;
        }
        // SAFETY: registers a handler that only touches atomics and a mutex of this module.
        unsafe { libc::atexit(stop) };
        Some(Releaser {
            waiting: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        })
    }

    fn releaser() -> Option<&'static Releaser> {
        RELEASER.get_or_init(start).as_ref()
    }

    pub(super) fn wake(resource: Weak<VmmResource>) {
        let Some(r) = releaser() else { return };
        let mut waiting = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !waiting.iter().any(|w| w.ptr_eq(&resource)) {
            waiting.push(resource);
            r.wake.notify_one();
        }
    }

    fn run() {
        // The releaser exists once `start` has returned; wait for it.
        let r = loop {
            if let Some(r) = RELEASER.get() {
                match r {
                    Some(r) => break r,
                    None => return,
                }
            }
            std::thread::sleep(TICK);
        };
        loop {
            // The list is taken, not copied: a resource woken during the passes below is in it
            // again when they end, whatever its pass answered.
            let list: Vec<Weak<VmmResource>> = {
                let mut waiting = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
                while waiting.is_empty() {
                    waiting = r.wake.wait(waiting).unwrap_or_else(|e| e.into_inner());
                }
                std::mem::take(&mut *waiting)
            };
            std::thread::sleep(TICK);
            let still: Vec<Weak<VmmResource>> = {
                let _pass = IN_PASS.lock().unwrap_or_else(|e| e.into_inner());
                if STOPPING.load(Ordering::Relaxed) {
                    return;
                }
                list.into_iter()
                    .filter(|w| w.upgrade().is_some_and(|resource| resource.release_pass()))
                    .collect()
            };
            let mut waiting = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
            for w in still {
                if !waiting.iter().any(|x| x.ptr_eq(&w)) {
                    waiting.push(w);
                }
            }
        }
    }
}

/// Asks the releaser to look at `resource` until it has nothing left waiting.
pub(super) fn wake(resource: Weak<VmmResource>) {
    #[cfg(not(loom))]
    thread::wake(resource);
    #[cfg(loom)]
    drop(resource);
}

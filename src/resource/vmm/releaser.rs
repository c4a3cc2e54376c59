//! The background releaser: a thread that, every few milliseconds, lets virtual-memory resources
//! give back physical memory above their release threshold that the GPU had not finished with
//! when it was freed — so an idle process hands memory to others without synchronising.
//!
//! Invariants: the thread starts only when a resource first has memory above its threshold
//! waiting for the GPU (never with the default threshold, `max`); it holds weak references, so it
//! keeps no resource alive; its own lock is a leaf (released before it calls a resource); it
//! stops working once the process has begun to exit; under loom it does not exist.

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

    extern "C" fn stop() {
        STOPPING.store(true, Ordering::Relaxed);
    }

    fn start() -> Option<Releaser> {
        let spawned = std::thread::Builder::new()
            .name("streampool-releaser".into())
            .spawn(run);
        if let Err(e) = spawned {
            log::warn!("streampool: no background releaser ({e}); memory above the release threshold is released at frees and allocations only");
            return None;
        }
        // SAFETY: registers a handler that only stores to an atomic.
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
            let list: Vec<Weak<VmmResource>> = {
                let mut waiting = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
                while waiting.is_empty() {
                    waiting = r.wake.wait(waiting).unwrap_or_else(|e| e.into_inner());
                }
                waiting.clone()
            };
            std::thread::sleep(TICK);
            if STOPPING.load(Ordering::Relaxed) {
                return;
            }
            let done: Vec<Weak<VmmResource>> = list
                .into_iter()
                .filter(|w| w.upgrade().is_none_or(|resource| !resource.release_pass()))
                .collect();
            let mut waiting = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting.retain(|w| !done.iter().any(|d| d.ptr_eq(w)));
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

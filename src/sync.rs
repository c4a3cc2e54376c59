//! The locks of the device allocator ([`crate::device`]) and the VMM resource
//! ([`crate::resource::vmm`]): parking_lot's mutex and std's `OnceLock` in normal builds, loom's
//! mutex under `--cfg loom`, so that the model checker (`tests/loom.rs`) explores the
//! interleavings of their lock sections.
//!
//! Invariant: every lock those modules take comes from here. Under loom a thread switches only
//! at a loom operation, so a lock of another kind held across one of these would deadlock the
//! model; the locks elsewhere (the simulator, peers, history, IPC imports) are leaves: never held
//! while one of these is taken.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

/// A value set once and then read (a device's resources).
#[cfg(not(loom))]
pub(crate) struct OnceCell<T>(std::sync::OnceLock<T>);

#[cfg(not(loom))]
impl<T> OnceCell<T> {
    pub(crate) const fn new() -> OnceCell<T> {
        OnceCell(std::sync::OnceLock::new())
    }

    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        self.0.get()
    }

    /// The value, set to `init()` if there was none.
    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(init)
    }
}

#[cfg(loom)]
pub(crate) use loom_sync::{Mutex, MutexGuard, OnceCell};

#[cfg(loom)]
mod loom_sync {
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    /// loom's mutex without poisoning, as parking_lot's.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap()
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    /// A value set once and then read: each read is a lock, so loom sees it race with the set.
    /// It hands out `&T` to every thread, so it is for `T: Send + Sync` only.
    pub(crate) struct OnceCell<T>(Mutex<Option<Box<T>>>);

    impl<T: Send + Sync> OnceCell<T> {
        pub(crate) fn new() -> OnceCell<T> {
            OnceCell(Mutex::new(None))
        }

        pub(crate) fn get(&self) -> Option<&T> {
            let value: *const T = &**self.0.lock().as_ref()?;
            // SAFETY: the box is set once and never replaced, moved or dropped before the cell,
            // so its contents live as long as `&self`.
            Some(unsafe { &*value })
        }

        /// The value, set to `init()` if there was none.
        pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
            let value: *const T = &**self.0.lock().get_or_insert_with(|| Box::new(init()));
            // SAFETY: as in `get`.
            unsafe { &*value }
        }
    }
}

//! The locks of the device allocator ([`crate::device`]) and the VMM resource
//! ([`crate::resource::vmm`]): parking_lot's mutex and std's `OnceLock` in normal builds, loom's
//! mutex under `--cfg loom`, so that the model checker (`tests/loom.rs`) explores the
//! interleavings of their lock sections.
//!
//! Invariants: every lock those modules take comes from here. Under loom a thread switches only
//! at a loom operation, so a lock of another kind held across one of these would deadlock the
//! model; the locks elsewhere (the simulator, peers, history, IPC imports) are leaves: never held
//! while one of these is taken. A [`Mutex`] is poisoned for good when a thread panics while
//! holding it (a panic that began before [`Mutex::lock`] took it does not count; one that began
//! before [`Mutex::try_lock`] took it does), or when its owner calls [`Mutex::poison`]: the state
//! it guards may then be half-updated, and its owner refuses further calls
//! ([`Mutex::lock_unpoisoned`]). Costs one relaxed load at lock (none at a try) and at unlock.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, Ordering};

/// [`Mutex::poisoned`] values.
const HEALTHY: u8 = 0;
const PANICKED_WHILE_HELD: u8 = 1;
const POISONED_BY_OWNER: u8 = 2;

#[cfg(not(loom))]
use parking_lot::{Mutex as RawMutex, MutexGuard as RawGuard};

#[cfg(loom)]
use loom::sync::{Mutex as RawMutex, MutexGuard as RawGuard};

/// A mutex without lock poisoning of its own (a poisoned one still locks), that remembers a
/// panic while it was held. The flag comes first, beside the lock's own word, so that taking the
/// lock and checking the flag read one cache line (unless the two straddle a line's end), not
/// one more past what the lock guards.
#[repr(C)]
pub(crate) struct Mutex<T> {
    poisoned: AtomicU8,
    inner: RawMutex<T>,
}

pub(crate) struct MutexGuard<'a, T> {
    guard: RawGuard<'a, T>,
    poisoned: &'a AtomicU8,
    /// The thread was already unwinding when it took the lock (a destructor that locks).
    panicking_at_lock: bool,
}

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Mutex<T> {
        Mutex {
            poisoned: AtomicU8::new(HEALTHY),
            inner: RawMutex::new(value),
        }
    }

    #[inline(always)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(loom))]
        let guard = self.inner.lock();
        #[cfg(loom)]
        let guard = self.inner.lock().unwrap();
        MutexGuard {
            guard,
            poisoned: &self.poisoned,
            panicking_at_lock: std::thread::panicking(),
        }
    }

    /// The lock if it is free right now: for the fast paths' lock sections, which no destructor
    /// enters. It does not ask whether the thread is unwinding already (about ten instructions
    /// an allocation and a free, of the vmm pair's): a guard taken while unwinding poisons at
    /// its release, the safe side (nothing half-updated is used; the vmm resource, its user,
    /// then refuses with an error, which disables its device).
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        #[cfg(not(loom))]
        let guard = self.inner.try_lock()?;
        #[cfg(loom)]
        let guard = self.inner.try_lock().ok()?;
        Some(MutexGuard {
            guard,
            poisoned: &self.poisoned,
            panicking_at_lock: false,
        })
    }

    /// The lock, or None if a panic left what it guards half-updated (checked once the lock is
    /// held, so a thread that waited for it while another panicked holding it sees that).
    #[inline(always)]
    pub(crate) fn lock_unpoisoned(&self) -> Option<MutexGuard<'_, T>> {
        let guard = self.lock();
        match self.is_poisoned() {
            false => Some(guard),
            true => None,
        }
    }

    /// True once a thread panicked while holding the lock, or [`Mutex::poison`] was called.
    #[inline]
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed) != HEALTHY
    }

    /// True if a thread panicked while holding the lock (not only [`Mutex::poison`]).
    pub(crate) fn panicked_while_held(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed) == PANICKED_WHILE_HELD
    }

    /// Marks what the lock guards as unusable (its owner learnt that it cannot be trusted).
    pub(crate) fn poison(&self) {
        let _ = self.poisoned.compare_exchange(
            HEALTHY,
            POISONED_BY_OWNER,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    /// Runs before the lock is released: a thread that takes it next sees the poison.
    #[inline(always)]
    fn drop(&mut self) {
        self.mark_if_panicked();
    }
}

impl<T> MutexGuard<'_, T> {
    /// Releases the lock: what dropping the guard does (the poison mark, then the unlock), here
    /// inlined. The drop glue, shared by every exit of a large function, is a call of its own
    /// (an allocation's fast path paid it, about 20 instructions).
    #[inline(always)]
    pub(crate) fn unlock(self) {
        let mut this = std::mem::ManuallyDrop::new(self);
        this.mark_if_panicked();
        // SAFETY: `this` is not used after this line, and being a ManuallyDrop it is never
        // dropped: its guard, the one field that needs a drop, is dropped once, here.
        unsafe { std::ptr::drop_in_place(&mut this.guard) };
    }

    /// The drop's first step: a panic that began while the lock was held poisons it.
    #[inline(always)]
    fn mark_if_panicked(&self) {
        if std::thread::panicking() && !self.panicking_at_lock {
            self.poisoned.store(PANICKED_WHILE_HELD, Ordering::Relaxed);
        }
    }

    /// Runs `f` with the lock released, handed first to a thread waiting for it (a fair
    /// unlock), and takes it again. (Under loom, `f` runs with the lock held.)
    pub(crate) fn unlocked_fair<U>(&mut self, f: impl FnOnce() -> U) -> U {
        #[cfg(not(loom))]
        return parking_lot::MutexGuard::unlocked_fair(&mut self.guard, f);
        #[cfg(loom)]
        f()
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

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
pub(crate) use loom_once::OnceCell;

#[cfg(loom)]
mod loom_once {
    use super::Mutex;

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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_panic_while_held_poisons_for_good() {
        let m = Mutex::new(1);
        assert!(m.lock_unpoisoned().is_some());
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut g = m.lock();
            *g = 2;
            panic!("half-way");
        }));
        assert!(r.is_err());
        assert!(m.is_poisoned() && m.panicked_while_held());
        m.poison();
        assert!(m.panicked_while_held(), "the first cause stays");
        assert!(m.lock_unpoisoned().is_none());
        assert_eq!(*m.lock(), 2, "it still locks, for views and drops");
    }

    #[test]
    fn a_panic_while_a_try_lock_is_held_poisons_and_so_does_a_try_while_unwinding() {
        let m = Mutex::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _g = m.try_lock().expect("free");
            panic!("half-way");
        }));
        assert!(r.is_err() && m.panicked_while_held());
        // The documented safe side: a try taken while a panic unwinds poisons at its release.
        struct TriesOnDrop<'a>(&'a Mutex<u32>);
        impl Drop for TriesOnDrop<'_> {
            fn drop(&mut self) {
                *self.0.try_lock().expect("free") += 1;
            }
        }
        let m = Mutex::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _d = TriesOnDrop(&m);
            panic!("elsewhere");
        }));
        assert!(r.is_err() && m.panicked_while_held());
        assert_eq!(*m.lock(), 1);
    }

    #[test]
    fn a_lock_taken_while_already_unwinding_does_not_poison() {
        struct LocksOnDrop<'a>(&'a Mutex<u32>);
        impl Drop for LocksOnDrop<'_> {
            fn drop(&mut self) {
                *self.0.lock() += 1;
            }
        }
        let m = Mutex::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _d = LocksOnDrop(&m);
            panic!("elsewhere");
        }));
        assert!(r.is_err());
        assert_eq!(*m.lock(), 1);
        assert!(
            !m.is_poisoned(),
            "the panic did not happen while it was held"
        );
        m.poison();
        assert!(m.lock_unpoisoned().is_none() && !m.panicked_while_held());
    }
}

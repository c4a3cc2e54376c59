//! `fork()`: whether this process is a fork child of a process that had started using streampool,
//! and [`Published`], a value looked up once that a fork child never waits for. A leaf module (it
//! imports nothing of the crate), so that any layer may ask.
//!
//! Invariants: the `pthread_atfork` handler is registered when the library is loaded (an ELF
//! constructor), never lazily on first use, so no fork can find its registration half done; the
//! handler only stores to atomics (async-signal-safe). A fork taken after the first use began —
//! even while another thread is still inside it, building the allocator or looking up the C++
//! runtime — gives a child that knows it is one, and whose calls then touch nothing a thread of
//! the parent may have held at the fork (a `Once`, a `OnceLock`, the allocator's locks).

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// Set at the start of the first use (before anything is built), in the parent.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Set in a fork child if `STARTED` was set in the parent at the fork.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn note_fork_in_child() {
    if STARTED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    }
}

extern "C" fn register_atfork() {
    // SAFETY: registers a handler that only loads and stores atomics (async-signal-safe).
    unsafe {
        libc::pthread_atfork(None, None, Some(note_fork_in_child));
    }
}

/// Runs [`register_atfork`] when the library is loaded (`dlopen`, or program start when linked
/// statically). `#[used]` keeps it in the object, and rustc keeps used statics of an rlib in the
/// link, so the test binaries that link the rlib run it too.
#[used]
#[link_section = ".init_array"]
static REGISTER_ATFORK_AT_LOAD: extern "C" fn() = register_atfork;

/// Called first by every use of the process-wide allocator: from now on a fork child refuses
/// to use it.
#[inline]
pub fn note_first_use() {
    if !STARTED.load(Ordering::Relaxed) {
        STARTED.store(true, Ordering::Relaxed);
    }
}

/// True in a `fork()` child of a process that had started using streampool: nothing may take a
/// lock there that a thread of the parent could have held at the fork (the allocator's,
/// stderr's, a `Once` being run).
#[inline]
pub fn in_fork_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Where a test can hold a thread inside a first-use path (see [`set_first_use_hook`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstUse {
    /// The first use has begun; the allocator is not built yet.
    Started,
    /// Inside the build of the process-wide allocator.
    BuildingAllocator,
    /// Inside the first lookup of the C++ runtime that `my_malloc`'s throw uses.
    FindingCxxRuntime,
}

#[cfg(feature = "sim")]
static FIRST_USE_HOOK: std::sync::OnceLock<fn(FirstUse)> = std::sync::OnceLock::new();

/// For tests (builds with the simulated driver only): `hook` runs at each [`FirstUse`] point, so a
/// test can hold a thread there and fork. Set once, before the first use.
#[doc(hidden)]
#[cfg(feature = "sim")]
pub fn set_first_use_hook(hook: fn(FirstUse)) {
    let _ = FIRST_USE_HOOK.set(hook);
}

/// Runs the test hook at `point`, if one is set (one atomic load; first-use paths only).
#[inline]
pub(crate) fn first_use_point(point: FirstUse) {
    #[cfg(feature = "sim")]
    if let Some(hook) = FIRST_USE_HOOK.get() {
        hook(point);
    }
    #[cfg(not(feature = "sim"))]
    let _ = point;
}

/// What a lookup found, published once for the life of the process (never freed). Not a
/// `OnceLock`: a fork child must not wait for a lookup that a thread of its parent was in the
/// middle of at the fork; a thread that finds nothing published looks up itself (a lookup is
/// idempotent), and the first to publish wins.
pub(crate) struct Published<T: 'static> {
    slot: AtomicPtr<T>,
}

impl<T: Send + Sync + 'static> Published<T> {
    pub(crate) const fn new() -> Published<T> {
        Published {
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The published value, or the result of `find` published now; None (not published, so a
    /// later call looks again) if `find` finds nothing.
    pub(crate) fn get_or_find(&self, find: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        let published = self.slot.load(Ordering::Acquire);
        if !published.is_null() {
            // SAFETY: published below from a leaked Box, never freed.
            return Some(unsafe { &*published });
        }
        let found = Box::into_raw(Box::new(find()?));
        match self.slot.compare_exchange(
            std::ptr::null_mut(),
            found,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `found` is ours, leaked for the rest of the process.
            Ok(_) => Some(unsafe { &*found }),
            Err(first) => {
                // SAFETY: another thread published first; ours was never shared.
                drop(unsafe { Box::from_raw(found) });
                // SAFETY: as above.
                Some(unsafe { &*first })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Published;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn nothing_found_is_not_published_and_the_first_value_found_stays() {
        static VALUE: Published<u32> = Published::new();
        assert_eq!(VALUE.get_or_find(|| None), None);
        assert_eq!(
            VALUE.get_or_find(|| Some(5)),
            Some(&5),
            "looked up again after None"
        );
        let looked = AtomicUsize::new(0);
        let again = VALUE.get_or_find(|| {
            looked.fetch_add(1, Ordering::Relaxed);
            Some(6)
        });
        assert_eq!(again, Some(&5), "the published value stays");
        assert_eq!(
            looked.load(Ordering::Relaxed),
            0,
            "no lookup once one is published"
        );
    }

    #[test]
    fn threads_that_look_up_at_once_all_get_the_one_value_published() {
        static VALUE: Published<usize> = Published::new();
        let seen: Vec<usize> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    s.spawn(move || {
                        VALUE
                            .get_or_find(|| Some(i))
                            .map(|v| v as *const usize as usize)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap().unwrap())
                .collect()
        });
        assert!(
            seen.iter().all(|&p| p == seen[0]),
            "one value for all: {seen:?}"
        );
    }
}

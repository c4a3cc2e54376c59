//! `fork()`: whether this process is a fork child of a process that had started using streampool.
//! A leaf module (it imports nothing of the crate), so that any layer may ask.
//!
//! Invariants: the `pthread_atfork` handler is registered when the library is loaded (an ELF
//! constructor), never lazily on first use, so no fork can find its registration half done; the
//! handler only stores to atomics (async-signal-safe). A fork taken after the first use began —
//! even while another thread is still inside it, building the allocator or looking up the C++
//! runtime — gives a child that knows it is one, and whose calls then touch nothing a thread of
//! the parent may have held at the fork (a `Once`, a `OnceLock`, the allocator's locks).

use std::sync::atomic::{AtomicBool, Ordering};

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

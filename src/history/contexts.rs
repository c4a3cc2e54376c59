//! Stack contexts of timeline events (the frames of `torch.cuda.memory._record_memory_history`):
//! a gatherer set from outside (streampool's Python side) is called at the C entries `my_malloc`
//! and `my_free`, before any lock is taken, and returns an id for where the call came from; the
//! events the call records carry that id.
//!
//! Invariants: with no gatherer set, an entry costs one atomic load and nothing else; the gatherer
//! is called with no lock of streampool held (it may take Python's); an id set for a call is
//! cleared when the call returns, so no other call's events carry it.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// `uint64_t gatherer(int kind)`: an id for the calling thread's stack now (0: none).
pub type Gatherer = unsafe extern "C" fn(kind: c_int) -> u64;

/// Gather at allocations (`kind` 1).
pub const GATHER_ALLOC: u32 = 1;
/// Gather at frees (`kind` 2).
pub const GATHER_FREE: u32 = 2;

/// The gatherer's address (0: none) and when it is called.
static GATHERER: AtomicUsize = AtomicUsize::new(0);
static WHEN: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The context of the entry this thread is in (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Sets the gatherer (None: none), called at the kinds of entry `when` names.
pub fn set_gatherer(gatherer: Option<Gatherer>, when: u32) {
    WHEN.store(when, Ordering::Relaxed);
    GATHERER.store(gatherer.map_or(0, |g| g as usize), Ordering::Release);
}

/// The context of the entry the calling thread is in (0: none).
#[inline]
pub fn current() -> u64 {
    CURRENT.with(Cell::get)
}

/// The context of one C entry: set while it lives.
pub struct Scope {
    set: bool,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.set {
            CURRENT.with(|c| c.set(0));
        }
    }
}

/// At a C entry of `kind` ([`GATHER_ALLOC`] or [`GATHER_FREE`]): the gatherer's id for it, if
/// one is set for that kind, becomes the context of the events recorded until the scope ends.
#[inline]
pub fn enter(kind: u32) -> Scope {
    let address = GATHERER.load(Ordering::Acquire);
    if address == 0 {
        return Scope { set: false };
    }
    gather(address, kind)
}

#[cold]
fn gather(address: usize, kind: u32) -> Scope {
    if WHEN.load(Ordering::Relaxed) & kind == 0 || current() != 0 {
        return Scope { set: false };
    }
    // SAFETY: `address` was stored from a `Gatherer` by `set_gatherer`; whoever set it keeps it
    // callable until it is unset (streampool's Python side keeps its ctypes callback alive).
    let gatherer = unsafe { std::mem::transmute::<usize, Gatherer>(address) };
    // SAFETY: a C function of the documented signature; `kind` is 1 or 2.
    let id = unsafe { gatherer(kind as c_int) };
    CURRENT.with(|c| c.set(id));
    Scope { set: id != 0 }
}

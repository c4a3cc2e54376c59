//! PyTorch's memory-pool hooks on the allocation path: which pool claims an allocation (the
//! filters PyTorch passed to `beginAllocateToPool`, run here), and the one-shot directives that
//! make an allocation restore a checkpointed block at its old address.
//!
//! Invariants: a filter runs outside any lock of streampool's and outside `catch_unwind`, so an
//! exception it throws reaches PyTorch as it would from PyTorch's own allocator; a restore
//! directive belongs to the thread that set it and serves the first allocation of its device and
//! size on that thread, once; with no directive pending anywhere, the check is one atomic load.

use super::std_function::{FilterSignature, OwnedFunction};
use crate::api::global;
use crate::device::StreamFilter;
use crate::driver::{DevicePtr, Stream};
use crate::error::guarded;
use crate::resource::graph_pool::PoolId;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A filter PyTorch passed (a copy of its `std::function<bool(cudaStream_t)>`).
pub(crate) struct TorchFilter(pub(crate) OwnedFunction<FilterSignature>);

impl StreamFilter for TorchFilter {
    fn claims(&self, stream: Stream) -> bool {
        self.0.call(stream.0 as *mut c_void)
    }
}

/// The pool that claims an allocation on `stream` of `device`, if any: the routes begun last
/// are asked first, as PyTorch does. Call outside `catch_unwind` (a filter may throw).
#[inline]
pub(crate) fn route(device: i64, stream: Stream) -> Option<PoolId> {
    let allocator = guarded(global).ok()?;
    allocator
        .device(device)
        .ok()?
        .graph_pools()
        .claiming(stream)
}

/// An allocation that must restore a checkpointed block of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restore {
    pub device: i64,
    pub pool: PoolId,
    pub ptr: DevicePtr,
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub stream: Stream,
}

thread_local! {
    static DIRECTIVE: Cell<Option<Restore>> = const { Cell::new(None) };
}

/// Threads with a directive set.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Sets (or, with None, clears) this thread's directive.
pub(crate) fn expect_restore(restore: Option<Restore>) {
    let before = DIRECTIVE.with(|d| d.replace(restore));
    match (before.is_some(), restore.is_some()) {
        (false, true) => {
            PENDING.fetch_add(1, Ordering::AcqRel);
        }
        (true, false) => {
            PENDING.fetch_sub(1, Ordering::AcqRel);
        }
        _ => {}
    }
}

/// This thread's directive, taken, if it is for an allocation of `requested_bytes` on `device`.
#[inline]
pub(crate) fn take_restore(device: i64, requested_bytes: u64) -> Option<Restore> {
    if PENDING.load(Ordering::Acquire) == 0 {
        return None;
    }
    let directive = DIRECTIVE.with(|d| d.get())?;
    if directive.device != device || directive.requested_bytes != requested_bytes {
        return None;
    }
    expect_restore(None);
    Some(directive)
}

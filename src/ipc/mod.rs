//! Sharing memory with other processes ("shareable" memory, the C ABI's `ipc`): the per-thread
//! shareable scope of `streampool.shareable()`, the handle that carries a block to another
//! process, the exporting side ([`export`]) and the importing side ([`imports`]).
//!
//! Invariants: the shareable scope is per thread (PyTorch allocates on the calling thread) and
//! costs other allocations one relaxed load while no thread is inside one; the allocator reads it
//! once per allocation, at its entry, and passes it down.

pub mod export;
pub mod imports;

use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    static SHAREABLE_DEPTH: Cell<u32> = const { Cell::new(0) };
}
/// Threads inside a shareable scope, so that allocations elsewhere skip the thread-local.
static THREADS_IN_SCOPE: AtomicUsize = AtomicUsize::new(0);

/// Enters a shareable scope on this thread; returns the new depth.
pub fn begin_shareable() -> u32 {
    SHAREABLE_DEPTH.with(|d| {
        if d.get() == 0 {
            THREADS_IN_SCOPE.fetch_add(1, Ordering::Relaxed);
        }
        d.set(d.get() + 1);
        d.get()
    })
}

/// Leaves a shareable scope; an unmatched end is an error.
pub fn end_shareable() -> Result<u32> {
    SHAREABLE_DEPTH.with(|d| match d.get() {
        0 => Err(Error::InvalidArgument(
            "streampool_shareable_end without a matching streampool_shareable_begin".into(),
        )),
        depth => {
            d.set(depth - 1);
            if depth == 1 {
                THREADS_IN_SCOPE.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(depth - 1)
        }
    })
}

/// True if this thread's allocations must come from a shareable pool.
#[inline]
pub fn in_shareable_scope() -> bool {
    THREADS_IN_SCOPE.load(Ordering::Relaxed) != 0
        && SHAREABLE_DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Everything another process needs to map a shareable block (`streampool_ipc_export`). The
/// pool's file descriptor stays the exporter's; it travels by the receiving side's means
/// (SCM_RIGHTS, e.g. Python's multiprocessing), the rest as bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolIpcHandle {
    /// `CUmemPoolPtrExportData` of the block.
    pub pointer_data: [u8; 64],
    /// `CUipcEventHandle` of an event recorded on the exporter's stream at export: the data is
    /// ready once it has completed.
    pub event_handle: [u8; 64],
    /// The exporter's own event, released with `streampool_ipc_release_export`.
    pub event: u64,
    pub block_bytes: u64,
    /// The exporting pool's file descriptor, valid in the exporting process.
    pub pool_fd: i32,
    pub device: i32,
}

//! Sharing memory with other processes ("shareable" memory, the C ABI's `ipc`): the per-thread
//! shareable scope of `streampool.shareable()`, the handle that carries a block to another
//! process, the exporting side ([`export`]) and the importing side ([`imports`]).
//!
//! Invariants: the shareable scope is per thread (PyTorch allocates on the calling thread) and
//! costs other allocations one relaxed load while no thread is inside one; the allocator reads it
//! once per allocation, at its entry, and passes it down; its depth never wraps: it stops at
//! `MAX_SHAREABLE_DEPTH` (the largest a C `int` returns) with an error.

pub mod export;
pub mod imports;
mod page_imports;

use crate::error::{Error, Result};
use crate::switches::SWITCHES;
use std::cell::Cell;
use std::sync::atomic::Ordering;

thread_local! {
    static SHAREABLE_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The deepest nesting of shareable scopes on a thread: `streampool_shareable_begin` returns the
/// depth as a C `int`.
pub(crate) const MAX_SHAREABLE_DEPTH: u32 = i32::MAX as u32;

/// Enters a shareable scope on this thread; returns the new depth. Past `MAX_SHAREABLE_DEPTH`
/// nothing changes and the answer is an error.
pub fn begin_shareable() -> Result<u32> {
    with_depth(|d| {
        let depth = d.get();
        if depth >= MAX_SHAREABLE_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "streampool_shareable_begin: shareable scopes are nested {depth} deep on this \
                 thread, the most there can be (each begin needs a matching end)"
            )));
        }
        if depth == 0 {
            SWITCHES.shareable_threads.fetch_add(1, Ordering::Relaxed);
        }
        d.set(depth + 1);
        Ok(depth + 1)
    })
}

/// This thread's depth, or an error while the thread is exiting (its locals are gone).
fn with_depth<T>(f: impl FnOnce(&Cell<u32>) -> Result<T>) -> Result<T> {
    SHAREABLE_DEPTH.try_with(f).unwrap_or_else(|_| {
        Err(Error::InvalidArgument(
            "shareable scopes cannot be entered or left while the thread exits".into(),
        ))
    })
}

/// Leaves a shareable scope; an unmatched end is an error.
pub fn end_shareable() -> Result<u32> {
    with_depth(|d| match d.get() {
        0 => Err(Error::InvalidArgument(
            "streampool_shareable_end without a matching streampool_shareable_begin".into(),
        )),
        depth => {
            d.set(depth - 1);
            if depth == 1 {
                SWITCHES.shareable_threads.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(depth - 1)
        }
    })
}

#[cfg(test)]
pub(crate) fn set_depth_for_test(depth: u32) {
    SHAREABLE_DEPTH.with(|d| {
        match (d.get(), depth) {
            (0, 1..) => SWITCHES.shareable_threads.fetch_add(1, Ordering::Relaxed),
            (1.., 0) => SWITCHES.shareable_threads.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
        d.set(depth);
    });
}

/// True if this thread's allocations must come from a shareable pool.
#[inline]
pub fn in_shareable_scope() -> bool {
    SWITCHES.shareable_threads.load(Ordering::Relaxed) != 0 && this_thread_in_scope()
}

/// [`in_shareable_scope`] once some thread is in a scope: out of line, so that an allocation
/// while none is reads one atomic and no thread-local.
#[cold]
#[inline(never)]
fn this_thread_in_scope() -> bool {
    SHAREABLE_DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
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

/// Everything but the file descriptors another process needs to map a block whose physical
/// pages are exportable (the vmm backend: `streampool_ipc_export_pages`); the descriptors, one
/// per page in address order, travel by the receiving side's means (SCM_RIGHTS).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolIpcPages {
    /// `CUipcEventHandle` of an event recorded on the exporter's stream at export: the data is
    /// ready once it has completed.
    pub event_handle: [u8; 64],
    /// The exporter's own event, released with `streampool_ipc_release_export`.
    pub event: u64,
    pub block_bytes: u64,
    /// Where the block starts from its first page (beyond it when one physical allocation of
    /// several pages begins before the block).
    pub offset_bytes: u64,
    pub page_bytes: u64,
    /// How many pages (and file descriptor entries, -1s included) there are.
    pub page_count: u64,
    pub device: i32,
}

/// How a live block can be shared with another process (`streampool_ipc_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcKind {
    /// It cannot (an ordinary pool's block).
    None = 0,
    /// Through its shareable pool (`streampool_ipc_export`).
    Pool = 1,
    /// Through its physical pages (`streampool_ipc_export_pages`).
    Pages = 2,
}

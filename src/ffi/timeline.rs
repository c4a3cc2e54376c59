//! The C entries of the memory timeline and the block listing.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; a caller's
//! buffer is written only within the capacity it gave.

use super::{guarded, status};
use crate::api::global;
use crate::error::{Error, Result};
use crate::history::{StreampoolBlock, StreampoolEvent};
use std::ffi::c_int;

/// Starts the memory timeline afresh (`enabled` != 0), keeping the newest `max_entries` (> 0)
/// events, or stops it (`enabled` == 0); stopping keeps what was recorded readable.
#[no_mangle]
pub extern "C" fn streampool_record_history(enabled: c_int, max_entries: usize) -> c_int {
    status(guarded(|| {
        global()?.record_history(enabled != 0, max_entries)
    }))
}

/// Copies the newest timeline events, oldest first, into `out` (room for `capacity`) and sets
/// `*count` to how many were copied; with `out` NULL, `*count` is how many there are. `*dropped`
/// (if not NULL) is how many events the full ring dropped since recording started.
///
/// # Safety
/// `out` must be NULL or writable for `capacity` events; `count` writable; `dropped` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_history(
    out: *mut StreampoolEvent,
    capacity: usize,
    count: *mut usize,
    dropped: *mut u64,
) -> c_int {
    status(guarded(|| {
        let wanted = if out.is_null() { usize::MAX } else { capacity };
        let (events, dropped_events) = global()?.history(wanted);
        if !dropped.is_null() {
            // SAFETY: checked non-NULL; the caller guarantees it is writable.
            unsafe { dropped.write(dropped_events) };
        }
        // SAFETY: forwarded from the caller's guarantees.
        unsafe { copy_out(&events, out, capacity, count) }
    }))
}

/// Copies the blocks `device` holds from its pool into `out` (room for `capacity`) and sets
/// `*count` to how many were copied; with `out` NULL, `*count` is how many there are.
///
/// # Safety
/// `out` must be NULL or writable for `capacity` blocks; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_blocks(
    device: c_int,
    out: *mut StreampoolBlock,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(guarded(|| {
        let blocks = global()?.blocks(device.into())?;
        // SAFETY: forwarded from the caller's guarantees.
        unsafe { copy_out(&blocks, out, capacity, count) }
    }))
}

/// Writes the bytes `device` holds from CUDA in all (`*current`) and their peak (`*peak`, may be
/// NULL): its pools, the shareable pool, graph memory and PyTorch memory pools' segments from
/// elsewhere — what the blocks `streampool_blocks` lists, the segments of PyTorch's memory pools
/// and the pools' memory streampool does not hold add up to.
///
/// # Safety
/// `current` must be writable; `peak` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_reserved_total(
    device: c_int,
    current: *mut u64,
    peak: *mut u64,
) -> c_int {
    status(guarded(|| {
        if current.is_null() {
            return Err(Error::InvalidArgument("current must not be NULL".into()));
        }
        let (now, high) = global()?.reserved_total(device.into())?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { current.write(now) };
        if !peak.is_null() {
            // SAFETY: checked non-NULL; the caller guarantees it is writable.
            unsafe { peak.write(high) };
        }
        Ok(())
    }))
}

/// Writes `items.len()` to `*count` if `out` is NULL, else copies the first `capacity` items to
/// `out` and writes how many to `*count`.
///
/// # Safety
/// `out` NULL or writable for `capacity` items; `count` writable.
unsafe fn copy_out<T: Copy>(
    items: &[T],
    out: *mut T,
    capacity: usize,
    count: *mut usize,
) -> Result<()> {
    if count.is_null() {
        return Err(Error::InvalidArgument("count must not be NULL".into()));
    }
    let n = if out.is_null() {
        items.len()
    } else {
        let n = items.len().min(capacity);
        // SAFETY: the caller guarantees room for `capacity` >= n items; the regions are distinct.
        unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, n) };
        n
    };
    // SAFETY: checked non-NULL; the caller guarantees it is writable.
    unsafe { count.write(n) };
    Ok(())
}

//! The C entries of the memory timeline and the block listing.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; a caller's
//! buffer is written only within the capacity it gave.

use super::{guarded, status};
use crate::api::{self, global};
use crate::error::{Error, Result};
use crate::history::{StreampoolBlock, StreampoolEvent};
use std::ffi::{c_int, c_void};

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

/// Sets the stack-context gatherer of the memory timeline, a `uint64_t (*)(int kind)` passed as
/// `void *` (NULL: none): `my_malloc` (when bit 1 of `when` is set) and `my_free` (bit 2) call
/// it, with 1 or 2, before they take any lock, and the events they record carry the id it
/// returns (0: none).
///
/// # Safety
/// `gatherer` must be NULL or a C function of that signature, callable from any thread until it
/// is unset.
#[no_mangle]
pub unsafe extern "C" fn streampool_history_set_gatherer(
    gatherer: *const c_void,
    when: c_int,
) -> c_int {
    status(guarded(|| {
        let when = u32::try_from(when)
            .ok()
            .filter(|w| *w <= 3)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("when must be 0 to 3 (1 alloc, 2 free), not {when}"))
            })?;
        // SAFETY: NULL or a function of this signature, as the caller promises.
        let gatherer = (!gatherer.is_null()).then(|| unsafe {
            std::mem::transmute::<*const c_void, crate::history::contexts::Gatherer>(gatherer)
        });
        crate::history::contexts::set_gatherer(gatherer, when);
        Ok(())
    }))
}

/// As `streampool_history`, and each copied event's stack context into `contexts` (room for
/// `capacity`; 0: none), from the same moment of the ring.
///
/// # Safety
/// `out` and `contexts` must both be NULL or writable for `capacity` items; `count` writable;
/// `dropped` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_history_contexts(
    out: *mut StreampoolEvent,
    contexts: *mut u64,
    capacity: usize,
    count: *mut usize,
    dropped: *mut u64,
) -> c_int {
    status(guarded(|| {
        if out.is_null() != contexts.is_null() {
            return Err(Error::InvalidArgument(
                "out and contexts must both be NULL or both be buffers".into(),
            ));
        }
        let wanted = if out.is_null() { usize::MAX } else { capacity };
        let (events, ids, dropped_events) = global()?.history_with_contexts(wanted);
        if !dropped.is_null() {
            // SAFETY: checked non-NULL; the caller guarantees it is writable.
            unsafe { dropped.write(dropped_events) };
        }
        // SAFETY: forwarded from the caller's guarantees (`count` is checked there).
        unsafe { copy_out(&events, out, capacity, count)? };
        if !contexts.is_null() {
            let n = ids.len().min(capacity);
            // SAFETY: the caller guarantees room for `capacity` >= n ids.
            unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), contexts, n) };
        }
        Ok(())
    }))
}

/// Copies (address, stack context) pairs of `device`'s live blocks allocated with a context while
/// recording into `out` (room for `capacity` pairs, 2 words each); `*count` as for
/// `streampool_blocks`.
///
/// # Safety
/// `out` must be NULL or writable for `2 * capacity` words; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_history_live_contexts(
    device: c_int,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(guarded(|| {
        let pairs: Vec<[u64; 2]> = global()?
            .live_contexts(device.into())?
            .into_iter()
            .map(|(address, context)| [address, context])
            .collect();
        // SAFETY: forwarded from the caller's guarantees; a pair is two words.
        unsafe { copy_out(&pairs, out.cast::<[u64; 2]>(), capacity, count) }
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
        let blocks = api::device(device)?.blocks();
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
        let (now, high) = api::device(device)?.reserved_total()?;
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

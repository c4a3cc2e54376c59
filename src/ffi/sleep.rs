//! The C entries of sleep and wake: the device's physical memory back to it, the addresses kept
//! (the vmm backend), and back again.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; an out
//! pointer may be NULL (the figure is not written) and is written only on success.

use super::{guarded, status};
use crate::api::global;
use crate::error::Error;
use std::ffi::c_int;

/// Writes `value` to `out` unless it is NULL.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn write_optional(out: *mut u64, value: u64) {
    if !out.is_null() {
        // SAFETY: non-NULL, writable (the caller's guarantee).
        unsafe { out.write(value) };
    }
}

/// Puts `device` to sleep: after synchronising it, every physical page goes back to the device
/// while the addresses stay reserved; at `level` 1 the contents of live blocks wait in
/// page-locked host memory, at level 2 they are discarded. Allocations on the device fail until
/// `streampool_wake`. Writes the bytes given back to `*given_back` (if not NULL). The vmm
/// backend only; an error (the pool backend, a capture, asleep already, host memory that cannot
/// be pinned) changes nothing.
///
/// # Safety
/// `given_back` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_sleep(
    device: c_int,
    level: c_int,
    given_back: *mut u64,
) -> c_int {
    status(guarded(|| {
        let level = u32::try_from(level)
            .map_err(|_| Error::InvalidArgument(format!("sleep level {level}: 1 or 2")))?;
        let bytes = global()?.sleep(device.into(), level)?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(given_back, bytes) };
        Ok(())
    }))
}

/// Wakes `device`: fresh memory mapped at the addresses it slept at, the contents of a level-1
/// sleep copied back. Writes the bytes restored to `*restored` (if not NULL). Out of memory part
/// way: what was restored stays, the rest sleeps on, and another call goes on.
///
/// # Safety
/// `restored` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_wake(device: c_int, restored: *mut u64) -> c_int {
    status(guarded(|| {
        let bytes = global()?.wake(device.into())?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(restored, bytes) };
        Ok(())
    }))
}

/// Writes the bytes of `device` asleep now to `*out` (0 when awake).
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_sleeping_bytes(device: c_int, out: *mut u64) -> c_int {
    status(guarded(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument("out must not be NULL".into()));
        }
        let bytes = global()?.sleeping_bytes(device.into())?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(bytes) };
        Ok(())
    }))
}

//! The C entries of sharing memory with other processes: the shareable scope, export, import,
//! close.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; pointers
//! the caller passes are checked for NULL before they are read or written.

use super::{guarded, ptr_of, status, stream_of};
use crate::api::{self, clear_last_error, global, set_last_error};
use crate::error::{Error, Result, StreampoolStatus};
use crate::ipc::{self, StreampoolIpcHandle};
use std::ffi::{c_int, c_void};

/// Enters a shareable scope on this thread: its allocations come from a pool other processes can
/// import (`streampool.shareable()`). Returns the scope depth, or a negative status when scopes
/// are nested `INT_MAX` deep.
#[no_mangle]
pub extern "C" fn streampool_shareable_begin() -> c_int {
    depth_or_status(guarded(ipc::begin_shareable))
}

/// Leaves a shareable scope: the remaining depth, or a negative status for an unmatched end.
#[no_mangle]
pub extern "C" fn streampool_shareable_end() -> c_int {
    depth_or_status(guarded(ipc::end_shareable))
}

/// A depth (at most `INT_MAX`, [`ipc::MAX_SHAREABLE_DEPTH`]) as it is, or a negative status.
fn depth_or_status(depth: Result<u32>) -> c_int {
    match depth.and_then(|d| {
        c_int::try_from(d).map_err(|_| Error::Internal(format!("shareable depth {d}")))
    }) {
        Ok(depth) => {
            clear_last_error();
            depth
        }
        Err(e) => {
            set_last_error(&e);
            StreampoolStatus::from(&e) as c_int
        }
    }
}

/// Exports the live shareable block at `ptr` on `device` into `*out`, with an event recorded on
/// `stream` that importers wait for. Until every importer has closed it, keep the block
/// allocated; then call `streampool_ipc_release_export(device, out->event)`.
///
/// # Safety
/// `out` must be NULL or writable for one `StreampoolIpcHandle`; `stream` a stream of `device`
/// (or NULL).
#[no_mangle]
pub unsafe extern "C" fn streampool_ipc_export(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
    out: *mut StreampoolIpcHandle,
) -> c_int {
    status(guarded(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument("out must not be NULL".into()));
        }
        let handle = api::device(device)?.export(ptr_of(ptr), stream_of(stream))?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(handle) };
        Ok(())
    }))
}

/// Releases the event of an export (`StreampoolIpcHandle::event`).
#[no_mangle]
pub extern "C" fn streampool_ipc_release_export(device: c_int, event: u64) -> c_int {
    status(guarded(|| api::device(device)?.release_export(event)))
}

/// Imports another process's pool on `device` from the file descriptor `fd` (which stays the
/// caller's to close) and writes a token for it to `*pool`.
///
/// # Safety
/// `pool` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_ipc_import_pool(
    device: c_int,
    fd: c_int,
    pool: *mut u64,
) -> c_int {
    status(guarded(|| {
        if pool.is_null() {
            return Err(Error::InvalidArgument("pool must not be NULL".into()));
        }
        let token = global()?.ipc_import_pool(device.into(), fd)?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { pool.write(token) };
        Ok(())
    }))
}

/// Maps the block `handle` describes from the imported `pool` and makes `stream` wait for the
/// exporter's event; writes the address to `*out`. Release it with `streampool_ipc_close`.
///
/// # Safety
/// `handle` must be NULL or point to a `StreampoolIpcHandle`; `out` NULL or writable; `stream` a
/// stream of the handle's device (or NULL).
#[no_mangle]
pub unsafe extern "C" fn streampool_ipc_import(
    pool: u64,
    handle: *const StreampoolIpcHandle,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    status(guarded(|| {
        if handle.is_null() || out.is_null() {
            return Err(Error::InvalidArgument(
                "handle and out must not be NULL".into(),
            ));
        }
        // SAFETY: checked non-NULL; the caller guarantees it points to a handle.
        let handle = unsafe { handle.read() };
        let ptr = global()?.ipc_import(pool, &handle, stream_of(stream))?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(ptr.0 as *mut c_void) };
        Ok(())
    }))
}

/// Releases an imported block: frees it on `stream` and waits for that stream, so the exporter
/// may free the block once this returns.
#[no_mangle]
pub extern "C" fn streampool_ipc_close(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    status(guarded(|| {
        global()?.ipc_close(ptr_of(ptr), stream_of(stream))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::last_error_ptr;
    use std::ffi::CStr;

    fn last_error() -> String {
        // SAFETY: this thread's message, read before the next call.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The depth is a C `int`: past `INT_MAX` it must neither wrap (it was a `u32` cast to
    /// `int`: `INT_MAX + 1` came back as `INT_MIN`, which reads as no status at all) nor change.
    #[test]
    fn shareable_depth_stops_at_int_max_with_an_error_and_unwinds_from_there() {
        ipc::set_depth_for_test(ipc::MAX_SHAREABLE_DEPTH - 1);
        assert_eq!(streampool_shareable_begin(), c_int::MAX);
        let refused = streampool_shareable_begin();
        assert_eq!(refused, StreampoolStatus::InvalidArgument as c_int);
        assert!(
            last_error().contains("nested 2147483647 deep"),
            "{}",
            last_error()
        );
        assert!(ipc::in_shareable_scope(), "still inside the scopes");
        assert_eq!(streampool_shareable_end(), c_int::MAX - 1);
        assert_eq!(last_error(), "", "a success clears the message");
        ipc::set_depth_for_test(1);
        assert_eq!(streampool_shareable_end(), 0);
        assert!(!ipc::in_shareable_scope());
        assert_eq!(
            streampool_shareable_end(),
            StreampoolStatus::InvalidArgument as c_int,
            "unmatched"
        );
    }
}

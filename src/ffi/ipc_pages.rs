//! The C entries of sharing a block page by page (the vmm backend): what kind of sharing a block
//! allows, the export of its pages, their import.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; pointers
//! the caller passes are checked for NULL before they are read or written; on an error nothing
//! is written and no descriptor is left open.

use super::{guarded, ptr_of, status, stream_of};
use crate::api::{self, clear_last_error, global, set_last_error};
use crate::error::{Error, StreampoolStatus};
use crate::ipc::StreampoolIpcPages;
use std::ffi::{c_int, c_void};

/// How the live block at `ptr` on `device` can be shared with another process: 0 not at all, 1
/// through its pool (`streampool_ipc_export`), 2 page by page (`streampool_ipc_export_pages`);
/// a negative status on an error (an unknown pointer, say).
#[no_mangle]
pub extern "C" fn streampool_ipc_kind(ptr: *mut c_void, device: c_int) -> c_int {
    match guarded(|| api::device(device)?.ipc_kind(ptr_of(ptr))) {
        Ok(kind) => {
            clear_last_error();
            kind as c_int
        }
        Err(e) => {
            set_last_error(&e);
            StreampoolStatus::from(&e) as c_int
        }
    }
}

/// Exports the live block at `ptr` on `device` page by page into `*out`, and one file
/// descriptor per page, in address order, into `fds` (at most `max_fds`; they are the caller's
/// to close once sent; -1 for a page that the descriptor before it also backs: one physical
/// allocation of several pages, which may begin before the block and end after it), with an
/// event recorded on `stream` that importers wait for. Until every importer has closed it, keep
/// the block allocated; then call
/// `streampool_ipc_release_export(device, out->event)`. Until then the device refuses to sleep
/// (an importer keeps the pages). Too small a `max_fds` is an error whose
/// message says how many are needed; an error writes nothing, leaves nothing open and marks
/// nothing.
///
/// # Safety
/// `out` must be NULL or writable for one `StreampoolIpcPages`; `fds` NULL or writable for
/// `max_fds` ints; `stream` a stream of `device` (or NULL).
#[no_mangle]
pub unsafe extern "C" fn streampool_ipc_export_pages(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
    out: *mut StreampoolIpcPages,
    fds: *mut c_int,
    max_fds: usize,
) -> c_int {
    status(guarded(|| {
        if out.is_null() || fds.is_null() {
            return Err(Error::InvalidArgument(
                "out and fds must not be NULL".into(),
            ));
        }
        let device = api::device(device)?;
        let (handle, made) = device.export_pages_within(ptr_of(ptr), stream_of(stream), max_fds)?;
        for (i, &fd) in made.iter().enumerate() {
            // SAFETY: checked non-NULL, `i < max_fds`; the caller guarantees the room.
            unsafe { fds.add(i).write(fd) };
        }
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(handle) };
        Ok(())
    }))
}

/// Maps the block `handle` describes from its page descriptors `fds` (`fd_count` of them, in
/// address order, -1s as the export wrote them; they stay the caller's to close) at addresses of
/// this process, makes `stream` wait for the exporter's event, and writes the block's address to
/// `*out`. Release it with `streampool_ipc_close`.
///
/// # Safety
/// `handle` must be NULL or point to a `StreampoolIpcPages`; `fds` NULL or readable for
/// `fd_count` ints; `out` NULL or writable; `stream` a stream of the handle's device (or NULL).
#[no_mangle]
pub unsafe extern "C" fn streampool_ipc_import_pages(
    handle: *const StreampoolIpcPages,
    fds: *const c_int,
    fd_count: usize,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    status(guarded(|| {
        if handle.is_null() || fds.is_null() || out.is_null() {
            return Err(Error::InvalidArgument(
                "handle, fds and out must not be NULL".into(),
            ));
        }
        // SAFETY: checked non-NULL; the caller guarantees it points to a handle.
        let handle = unsafe { handle.read() };
        if fd_count as u64 != handle.page_count {
            return Err(Error::InvalidArgument(format!(
                "{fd_count} file descriptors for a block on {} pages",
                handle.page_count
            )));
        }
        // SAFETY: checked non-NULL; the caller guarantees `fd_count` readable ints.
        let fds = unsafe { std::slice::from_raw_parts(fds, fd_count) };
        let ptr = global()?.ipc_import_pages(&handle, fds, stream_of(stream))?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(ptr.0 as *mut c_void) };
        Ok(())
    }))
}

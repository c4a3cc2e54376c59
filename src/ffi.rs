//! Every exported C function: argument conversion, `catch_unwind`, status codes. No policy here.
//!
//! Invariants: no Rust panic crosses this boundary (each body runs inside `catch_unwind`);
//! `my_malloc` never returns NULL for a positive size — it throws a C++ exception instead, which
//! PyTorch turns into a Python `RuntimeError`; every other entry reports failure by status code or
//! NULL plus `streampool_last_error()`.

use crate::api::{self, clear_last_error, global, last_error_ptr, set_last_error};
use crate::config::Config;
use crate::driver::Stream;
use crate::error::{Error, Result, StreampoolStatus};
use crate::history::{StreampoolBlock, StreampoolEvent};
use crate::ipc::{self, StreampoolIpcHandle};
use crate::stats::StreampoolStats;
use crate::units::{parse_size, SIZE_ACCEPTED};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, turning a panic into `Error::Internal`.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Internal(what))
    })
}

fn status(result: Result<()>) -> c_int {
    match result {
        Ok(()) => {
            clear_last_error();
            StreampoolStatus::Ok as c_int
        }
        Err(e) => {
            set_last_error(&e);
            StreampoolStatus::from(&e) as c_int
        }
    }
}

/// Logs an error from an entry point that returns nothing.
fn report(entry: &str, result: Result<()>) {
    if let Err(e) = result {
        set_last_error(&e);
        log::error!("{entry}: {e}");
    }
}

fn size_from_ssize(size: libc::ssize_t) -> Result<u64> {
    u64::try_from(size).map_err(|_| {
        Error::InvalidArgument(format!("allocation size must not be negative, got {size}"))
    })
}

/// PyTorch's allocation entry point (`CUDAPluggableAllocator(path, "my_malloc", "my_free")`).
///
/// # Safety
/// `stream` must be a valid CUDA stream of `device` (or NULL for the legacy default stream).
#[no_mangle]
pub unsafe extern "C-unwind" fn my_malloc(
    size: libc::ssize_t,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let result = guarded(|| match size_from_ssize(size)? {
        0 => Ok(0),
        bytes => global()?.malloc(bytes, device.into(), stream as Stream),
    });
    match result {
        Ok(ptr) => ptr as *mut c_void,
        Err(e) => {
            set_last_error(&e);
            drop(e);
            // SAFETY: the message is a valid C string, copied before the throw; nothing in this
            // frame needs dropping, and PyTorch's caller catches the exception.
            unsafe { crate::cxx_throw::throw_runtime_error(last_error_ptr()) }
        }
    }
}

/// PyTorch's free entry point. Never throws; errors are logged and kept in `streampool_last_error`.
///
/// # Safety
/// `ptr` must be NULL or a pointer this library returned for `device`.
#[no_mangle]
pub unsafe extern "C" fn my_free(
    ptr: *mut c_void,
    size: libc::ssize_t,
    device: c_int,
    stream: *mut c_void,
) {
    // The block remembers its size and allocation stream; PyTorch passes the same values.
    let _ = (size, stream);
    if ptr.is_null() {
        return;
    }
    report("my_free", guarded(|| api::free(ptr as u64, device.into())));
}

/// Allocation for C/C++ callers: NULL on failure (see `streampool_last_error`); size 0 gives NULL
/// and is not an error.
///
/// # Safety
/// `stream` must be a valid CUDA stream of `device` (or NULL for the legacy default stream).
#[no_mangle]
pub unsafe extern "C" fn streampool_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let result = guarded(|| match size {
        0 => Ok(0),
        bytes => global()?.malloc(bytes as u64, device.into(), stream as Stream),
    });
    match result {
        Ok(ptr) => {
            clear_last_error();
            ptr as *mut c_void
        }
        Err(e) => {
            set_last_error(&e);
            std::ptr::null_mut()
        }
    }
}

/// Free for C/C++ callers; NULL is a no-op. Returns a status code.
///
/// # Safety
/// `ptr` must be NULL or a pointer this library returned for `device`.
#[no_mangle]
pub unsafe extern "C" fn streampool_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    // The block remembers its size and allocation stream.
    let _ = (size, stream);
    if ptr.is_null() {
        return status(Ok(()));
    }
    status(guarded(|| api::free(ptr as u64, device.into())))
}

/// This thread's last error message ("" if none); valid until the next streampool call on this thread.
#[no_mangle]
pub extern "C" fn streampool_last_error() -> *const c_char {
    last_error_ptr()
}

/// PyTorch's init hook (`set_init_fn`): builds the allocator now so configuration errors show early.
#[no_mangle]
pub extern "C" fn streampool_init(device_count: c_int) {
    report(
        "streampool_init",
        guarded(|| {
            let seen = global()?.device_count();
            if usize::try_from(device_count).ok() != Some(seen) {
                log::warn!(
                    "streampool_init: PyTorch reports {device_count} devices, the driver {seen}"
                );
            }
            Ok(())
        }),
    );
}

/// PyTorch's reset hook (`torch.cuda.empty_cache()`): return cached memory, synchronise, trim pools.
#[no_mangle]
pub extern "C" fn streampool_empty_cache() {
    report(
        "streampool_empty_cache",
        guarded(|| global()?.empty_cache()),
    );
}

/// PyTorch's record_stream hook: `ptr` is reused only after work queued on `stream` so far is done.
///
/// # Safety
/// `stream` must be a valid CUDA stream.
#[no_mangle]
pub unsafe extern "C" fn streampool_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    report(
        "streampool_record_stream",
        guarded(|| global()?.record_stream(ptr as u64, stream as Stream)),
    );
}

/// PyTorch's memory fraction hook: caps the bytes held from `device`'s pool at `fraction` of its memory.
#[no_mangle]
pub extern "C" fn streampool_set_memory_fraction(fraction: f64, device: c_int) {
    report(
        "streampool_set_memory_fraction",
        guarded(|| {
            global()?
                .device(device.into())?
                .set_memory_fraction(fraction)
        }),
    );
}

/// Fills `out` with `device`'s statistics.
///
/// # Safety
/// `out` must be NULL or point to writable memory for one `StreampoolStats`.
#[no_mangle]
pub unsafe extern "C" fn streampool_get_stats(device: c_int, out: *mut StreampoolStats) -> c_int {
    status(guarded(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument(
                "streampool_get_stats: out is NULL".into(),
            ));
        }
        let stats = global()?.stats(device.into())?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(stats) };
        Ok(())
    }))
}

/// Resets the peak values of `device`'s statistics to their current values.
#[no_mangle]
pub extern "C" fn streampool_reset_peak_stats(device: c_int) {
    report(
        "streampool_reset_peak_stats",
        guarded(|| global()?.device(device.into())?.reset_peak_stats()),
    );
}

/// Sets the pool's release threshold: memory above it goes back to the device at synchronisation.
#[no_mangle]
pub extern "C" fn streampool_set_release_threshold(device: c_int, bytes: u64) -> c_int {
    status(guarded(|| {
        global()?
            .device(device.into())?
            .set_release_threshold(bytes)
    }))
}

/// Returns cached memory, synchronises and trims `device`'s pool to `keep_bytes`.
#[no_mangle]
pub extern "C" fn streampool_trim(device: c_int, keep_bytes: u64) -> c_int {
    status(guarded(|| {
        global()?.device(device.into())?.trim(keep_bytes)
    }))
}

/// Parses "8GiB", "512MB", "4096", "80%" (of `device`'s memory) or "max" into bytes.
///
/// # Safety
/// `spec` must be NULL or a NUL-terminated string; `out_bytes` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_parse_bytes(
    spec: *const c_char,
    device: c_int,
    out_bytes: *mut u64,
) -> c_int {
    status(guarded(|| {
        if spec.is_null() || out_bytes.is_null() {
            return Err(Error::InvalidArgument(
                "streampool_parse_bytes: spec and out_bytes must not be NULL".into(),
            ));
        }
        // SAFETY: checked non-NULL; the caller guarantees NUL termination.
        let text = unsafe { CStr::from_ptr(spec) }.to_string_lossy();
        let size = parse_size(&text).map_err(|reason| {
            Error::InvalidArgument(format!(
                "{text:?} is not a size ({reason}); accepted: {SIZE_ACCEPTED}"
            ))
        })?;
        let total = global()?.device(device.into())?.device_total_bytes()?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out_bytes.write(size.resolve_bytes(total)) };
        Ok(())
    }))
}

/// Grants every other device read/write access to `device`'s pool (every pool if `device` is
/// -1), after checking `cuDeviceCanAccessPeer`; a pair without peer capability is an error.
#[no_mangle]
pub extern "C" fn streampool_enable_peer_access(device: c_int) -> c_int {
    status(guarded(|| global()?.enable_peer_access(device.into())))
}

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

/// Enters a shareable scope on this thread: its allocations come from a pool other processes can
/// import (`streampool.shareable()`). Returns the scope depth.
#[no_mangle]
pub extern "C" fn streampool_shareable_begin() -> c_int {
    ipc::begin_shareable() as c_int
}

/// Leaves a shareable scope: the remaining depth, or a negative status for an unmatched end.
#[no_mangle]
pub extern "C" fn streampool_shareable_end() -> c_int {
    match ipc::end_shareable() {
        Ok(depth) => depth as c_int,
        Err(e) => {
            set_last_error(&e);
            StreampoolStatus::from(&e) as c_int
        }
    }
}

/// 1 if `device` supports stream-ordered memory pools, 0 if not, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_pools_supported(device: c_int) -> c_int {
    value_or_status(guarded(|| {
        Ok(global()?.pools_supported(device.into())? as c_int)
    }))
}

/// 1 if `device`'s pools can be shared with other processes, 0 if not, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_ipc_supported(device: c_int) -> c_int {
    value_or_status(guarded(|| {
        Ok(global()?.ipc_supported(device.into())? as c_int)
    }))
}

/// A non-negative answer as it is, or a negative status with the message kept.
fn value_or_status(answer: Result<c_int>) -> c_int {
    match answer {
        Ok(value) => {
            clear_last_error();
            value
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
        let handle = global()?.ipc_export(ptr as u64, device.into(), stream as Stream)?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(handle) };
        Ok(())
    }))
}

/// Releases the event of an export (`StreampoolIpcHandle::event`).
#[no_mangle]
pub extern "C" fn streampool_ipc_release_export(device: c_int, event: u64) -> c_int {
    status(guarded(|| {
        global()?.ipc_release_export(device.into(), event)
    }))
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
        let ptr = global()?.ipc_import(pool, &handle, stream as Stream)?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(ptr as *mut c_void) };
        Ok(())
    }))
}

/// Releases an imported block: frees it on `stream` and waits for that stream, so the exporter
/// may free the block once this returns.
#[no_mangle]
pub extern "C" fn streampool_ipc_close(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    status(guarded(|| {
        global()?.ipc_close(ptr as u64, stream as Stream)
    }))
}

/// Number of devices, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_device_count() -> c_int {
    value_or_status(guarded(|| Ok(global()?.device_count() as c_int)))
}

/// Parses the `STREAMPOOL_*` variables now: 0, or `STREAMPOOL_CONFIG_ERROR` with the message.
#[no_mangle]
pub extern "C" fn streampool_check_config() -> c_int {
    status(guarded(|| Config::from_env().map(|_| ())))
}

/// The library's version, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn streampool_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// "cuda" or "sim": the driver in use (or selected by STREAMPOOL_DRIVER if it failed to start);
/// "invalid" if the configuration is malformed.
#[no_mangle]
pub extern "C" fn streampool_driver_name() -> *const c_char {
    let name = guarded(|| match global() {
        Ok(a) => Ok(a.driver_name()),
        Err(_) => Ok(Config::from_env().map_or("invalid", |c| c.driver.name())),
    })
    .unwrap_or("invalid");
    match name {
        "cuda" => c"cuda".as_ptr(),
        "sim" => c"sim".as_ptr(),
        _ => c"invalid".as_ptr(),
    }
}

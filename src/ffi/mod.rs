//! Every exported C function: argument conversion, `catch_unwind`, status codes. No policy here.
//!
//! Invariants: no Rust panic crosses this boundary (each body runs inside `catch_unwind`);
//! `my_malloc` never returns NULL for a positive size — it throws a C++ exception instead, which
//! PyTorch turns into a Python `RuntimeError`; every other entry reports failure by status code or
//! NULL plus `streampool_last_error()`.

mod ipc;
mod ipc_pages;
mod sleep;
mod timeline;
mod torch;

use crate::api::{self, clear_last_error, global, last_error_ptr, set_last_error};
use crate::driver::{DevicePtr, Stream};
pub(crate) use crate::error::guarded;
use crate::error::{Error, Result, StreampoolStatus};
use crate::stats::StreampoolStats;
use std::ffi::{c_char, c_int, c_void, CStr};

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

/// Logs an error from an entry point that returns nothing. Not in a fork() child: a thread of the
/// parent may have held the logger's or stderr's lock at the fork, and it is never released there.
fn report(entry: &str, result: Result<()>) {
    if let Err(e) = result {
        set_last_error(&e);
        if !api::in_fork_child() {
            log::error!("{entry}: {e}");
        }
    }
}

/// The largest size `my_malloc` and `streampool_malloc` pass on: 2^48 bytes (256 TiB). A larger
/// size is out of memory at once (STREAMPOOL_STATUS_OUT_OF_MEMORY; the message starts
/// "CUDA out of memory." and says why), as is one at or below it that the device cannot hold.
/// (The value of `streampool::MAX_ALLOCATION_BYTES`, written out for the C header.)
pub const STREAMPOOL_MAX_ALLOCATION_BYTES: u64 = 0x1_0000_0000_0000;
const _: () = assert!(STREAMPOOL_MAX_ALLOCATION_BYTES == crate::MAX_ALLOCATION_BYTES);

fn stream_of(stream: *mut c_void) -> Stream {
    Stream(stream as usize)
}

fn ptr_of(ptr: *mut c_void) -> DevicePtr {
    DevicePtr(ptr as u64)
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
    #[cfg(feature = "call-counts")]
    let _timed = crate::driver::cuda::call_counts::Timed::start("my_malloc");
    // Where the call came from, for memory history's frames (one atomic load while none is asked).
    let _context = crate::history::contexts::enter(crate::history::contexts::GATHER_ALLOC);
    let (device, stream) = (i64::from(device), stream_of(stream));
    // A PyTorch memory pool that claims the allocation (its filter runs outside catch_unwind:
    // PyTorch's exceptions reach PyTorch).
    let pool = crate::torch_edge::graphs::route(device, stream);
    let result = guarded(|| {
        let bytes = size_from_ssize(size)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL); // whatever the device or the process (a fork child)
        }
        match crate::torch_edge::graphs::take_restore(device, bytes) {
            Some(r) => api::device(device)?.restore_in_graph_pool(
                r.pool,
                r.ptr,
                r.requested_bytes,
                r.block_bytes,
                r.stream,
            ),
            None => global()?.malloc_into(bytes, device, stream, pool),
        }
    });
    match result {
        Ok(ptr) => ptr.0 as *mut c_void,
        Err(e) => {
            use crate::torch_edge::c10_error::{self, Kind};
            let oom = matches!(e, Error::OutOfMemory(_));
            set_last_error(&e);
            // A copy: an observer below may call streampool, which clears the last error.
            // SAFETY: the last error is a valid C string.
            let message = unsafe { CStr::from_ptr(last_error_ptr()) }.to_owned();
            drop(e);
            if oom {
                // PyTorch's observers (memory history's OOM dump, ...) hear of it first.
                crate::torch_edge::notify_out_of_memory(device, u64::try_from(size).unwrap_or(0));
            }
            let kind = if oom { Kind::OutOfMemory } else { Kind::Error };
            // SAFETY: an extern "C-unwind" frame, `message` dropped on the way out; PyTorch's
            // caller catches the exception: PyTorch's own type where its library is loaded
            // (torch.OutOfMemoryError in Python), else std::runtime_error (RuntimeError).
            unsafe { c10_error::throw_message(kind, &message) }
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
    #[cfg(feature = "call-counts")]
    let _timed = crate::driver::cuda::call_counts::Timed::start("my_free");
    // The block remembers its size and allocation stream; PyTorch passes the same values.
    let _ = (size, stream);
    if ptr.is_null() {
        return;
    }
    let _context = crate::history::contexts::enter(crate::history::contexts::GATHER_FREE);
    report("my_free", guarded(|| api::free(ptr_of(ptr), device.into())));
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
        0 => Ok(DevicePtr::NULL), // whatever the device or the process (a fork child)
        _ => global()?.malloc(size as u64, device.into(), stream_of(stream)),
    });
    match result {
        Ok(ptr) => {
            clear_last_error();
            ptr.0 as *mut c_void
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
    status(guarded(|| api::free(ptr_of(ptr), device.into())))
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
            global()?.check_device_count(device_count.into());
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
        guarded(|| global()?.record_stream(ptr_of(ptr), stream_of(stream))),
    );
}

/// PyTorch's memory fraction hook: caps the bytes held from `device`'s pool at `fraction` of its memory.
#[no_mangle]
pub extern "C" fn streampool_set_memory_fraction(fraction: f64, device: c_int) {
    report(
        "streampool_set_memory_fraction",
        guarded(|| {
            api::device(device)?.set_memory_fraction(fraction)?;
            crate::torch_edge::note_memory_fraction(device.into(), fraction);
            Ok(())
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
        let stats = api::device(device)?.stats()?;
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
        guarded(|| api::device(device)?.reset_peak_stats()),
    );
}

/// Sets the pool's release threshold: memory above it goes back to the device at synchronisation.
#[no_mangle]
pub extern "C" fn streampool_set_release_threshold(device: c_int, bytes: u64) -> c_int {
    status(guarded(|| {
        api::device(device)?.set_release_threshold(bytes)
    }))
}

/// Tells streampool that this thread is about to synchronise `device` (`torch.cuda.synchronize()`
/// calls it under install(), before PyTorch's synchronisation): at its
/// `streampool_synchronized`, on the same thread, the blocks that waited for other streams
/// (record_stream) before this call go back without a driver query, and on the vmm backend what
/// was freed before it is ready for every stream without one (unless something was freed in
/// between). Optional: without it, `streampool_synchronized` asks the driver which are done.
#[no_mangle]
pub extern "C" fn streampool_synchronizing(device: c_int) -> c_int {
    status(guarded(|| api::device(device)?.synchronizing()))
}

/// Tells streampool that the program synchronised `device` (`torch.cuda.synchronize()` calls it
/// under install()): blocks waiting for other streams (record_stream) go back; on the vmm
/// backend what was freed before becomes ready for every stream (where more than one stream
/// allocated or freed since the last synchronisation), and, with a release threshold
/// set, memory above it goes back now (after synchronising the device again where a fence may
/// be outstanding), as a CUDA pool's does at a synchronisation. Without a threshold it does not
/// synchronise: driver queries, and event records on streams still busy.
#[no_mangle]
pub extern "C" fn streampool_synchronized(device: c_int) -> c_int {
    status(guarded(|| api::device(device)?.synchronized()))
}

/// Returns cached memory, synchronises and trims `device`'s pool to `keep_bytes`.
#[no_mangle]
pub extern "C" fn streampool_trim(device: c_int, keep_bytes: u64) -> c_int {
    status(guarded(|| api::device(device)?.trim(keep_bytes)))
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
        let bytes = api::device(device)?.parse_bytes(&text)?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out_bytes.write(bytes) };
        Ok(())
    }))
}

/// Grants every other device read/write access to `device`'s pool (every pool if `device` is
/// -1), after checking `cuDeviceCanAccessPeer`; a pair without peer capability is an error.
#[no_mangle]
pub extern "C" fn streampool_enable_peer_access(device: c_int) -> c_int {
    status(guarded(|| global()?.enable_peer_access(device.into())))
}

/// 1 if `device` supports stream-ordered memory pools, 0 if not, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_pools_supported(device: c_int) -> c_int {
    value_or_status(guarded(|| {
        Ok(api::device(device)?.pools_supported()? as c_int)
    }))
}

/// 1 if `device`'s pools can be shared with other processes, 0 if not, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_ipc_supported(device: c_int) -> c_int {
    value_or_status(guarded(|| {
        Ok(api::device(device)?.ipc_supported()? as c_int)
    }))
}

/// 1 if `device` supports virtual memory management (`STREAMPOOL_BACKEND=vmm`), 0 if not, or a
/// negative status.
#[no_mangle]
pub extern "C" fn streampool_vmm_supported(device: c_int) -> c_int {
    value_or_status(guarded(|| {
        Ok(api::device(device)?.vmm_supported()? as c_int)
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

/// Number of devices, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_device_count() -> c_int {
    value_or_status(guarded(|| Ok(global()?.device_count() as c_int)))
}

/// Parses the `STREAMPOOL_*` variables now: 0, or `STREAMPOOL_CONFIG_ERROR` with the message.
#[no_mangle]
pub extern "C" fn streampool_check_config() -> c_int {
    status(guarded(api::check_config))
}

/// Checks `value` for the variable `name` alone, as the library would read it were it the only
/// `STREAMPOOL_*` variable set; reads and keeps nothing: 0, `STREAMPOOL_CONFIG_ERROR` (or
/// `STREAMPOOL_INVALID_ARGUMENT` for NULL or a name not of a `STREAMPOOL_*` variable) with the
/// message.
///
/// # Safety
/// `name` and `value` must be NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn streampool_check_setting(
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    status(guarded(|| {
        if name.is_null() || value.is_null() {
            return Err(Error::InvalidArgument(
                "streampool_check_setting: name and value must not be NULL".into(),
            ));
        }
        // SAFETY: checked non-NULL; the caller guarantees NUL termination.
        let (name, value) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(value)) };
        api::check_setting(&name.to_string_lossy(), &value.to_string_lossy())
    }))
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
    let name = guarded(|| Ok(api::driver_name())).unwrap_or("invalid");
    match name {
        "cuda" => c"cuda".as_ptr(),
        "sim" => c"sim".as_ptr(),
        _ => c"invalid".as_ptr(),
    }
}

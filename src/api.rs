//! The process-wide allocator behind the C entry points, and this thread's last error.
//!
//! Invariants: the allocator is built once, from the environment, on first use; if that fails
//! (bad configuration, no libcuda) every later call reports the same error rather than retrying
//! with different settings. In a `fork()` child of a process that built it, no call reaches the
//! driver: CUDA cannot be used there, and the memory belongs to the parent.

use crate::allocator::Allocator;
use crate::device::DeviceAllocator;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::fork::{self, FirstUse};
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

pub use crate::fork::in_fork_child;

static GLOBAL: OnceLock<Result<Allocator>> = OnceLock::new();

/// The process's allocator, built on first use.
pub fn global() -> Result<&'static Allocator> {
    if in_fork_child() {
        return Err(Error::DriverUnavailable(
            "streampool cannot allocate in a fork() child of a process that had already used it: \
             CUDA does not survive fork(). Start worker processes with the 'spawn' start method \
             (multiprocessing.set_start_method('spawn') or torch.multiprocessing), or fork before \
             any CUDA work."
                .into(),
        ));
    }
    if let Some(built) = GLOBAL.get() {
        return built.as_ref().map_err(Clone::clone);
    }
    // Noted before the allocator is built, so a fork during the build gives a child that knows
    // (the fork handler itself is registered at load time: src/fork.rs).
    fork::note_first_use();
    fork::first_use_point(FirstUse::Started);
    GLOBAL
        .get_or_init(|| {
            fork::first_use_point(FirstUse::BuildingAllocator);
            init_logging();
            Allocator::from_env()
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Device `device` of the process's allocator: the C entries about one device call it.
pub fn device(device: impl Into<i64>) -> Result<&'static DeviceAllocator> {
    global()?.device(device.into())
}

/// Frees `ptr` through the process's allocator. In a fork() child it does nothing: memory
/// inherited from the parent belongs to the parent's CUDA context, which the child cannot touch.
pub fn free(ptr: DevicePtr, device: i64) -> Result<()> {
    if in_fork_child() {
        return Ok(());
    }
    global()?.free(ptr, device)
}

/// Parses the `STREAMPOOL_*` variables now, for an early, clear error.
pub fn check_config() -> Result<()> {
    crate::allocator::check_env()
}

/// Checks `value` for the variable `name` alone, reading no environment and keeping nothing.
pub fn check_setting(name: &str, value: &str) -> Result<()> {
    crate::allocator::check_setting(name, value)
}

/// The driver in use, or the one `STREAMPOOL_DRIVER` selects if the allocator could not start;
/// "invalid" if the configuration is malformed.
pub fn driver_name() -> &'static str {
    match global() {
        Ok(a) => a.driver_name(),
        Err(_) => crate::allocator::configured_driver_name(),
    }
}

/// Sets the logger from the filter the configuration resolves ([`crate::config::log_filter`]).
/// Never replaces a logger already set.
pub fn init_logging() {
    let filter = crate::config::log_filter();
    let _ = env_logger::Builder::new().parse_filters(&filter).try_init();
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

// `try_with` everywhere: a tensor freed while its thread exits reaches us after this thread's
// locals are gone, and `with` would panic outside any catch_unwind.

pub fn set_last_error(e: &Error) {
    let text = e.to_string().replace('\0', " ");
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = CString::new(text).unwrap_or_default());
}

pub fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        if !slot.borrow().as_bytes().is_empty() {
            *slot.borrow_mut() = CString::default();
        }
    });
}

/// Pointer to this thread's message; valid until the next call that sets or clears it.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"streampool: error message unavailable during thread exit".as_ptr())
}

//! Errors and the status codes they map to at the C boundary.
//!
//! Invariant: every failure inside streampool is an [`Error`] value with a message a user can act
//! on; the C ABI turns it into a [`StreampoolStatus`] code plus `streampool_last_error()` text.

use crate::units::format_bytes;

/// A CUDA driver result code (`CUresult`), kept as the raw integer.
pub type DriverCode = i32;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: DriverCode = 2;

/// What the allocator knew when an allocation failed for lack of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    pub requested_bytes: u64,
    pub device: usize,
    pub device_free_bytes: u64,
    pub device_total_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub cached_bytes: u64,
    /// Cap set by `set_memory_fraction`, if it is what refused the request.
    pub limit_bytes: Option<u64>,
    /// streampool's largest request, if the request is above it (refused before any driver call).
    pub max_bytes: Option<u64>,
    /// `STREAMPOOL_MAX_POOL_SIZE` on this device, if one is set.
    pub pool_cap_bytes: Option<u64>,
    /// `STREAMPOOL_VMM_HEADROOM` on this device, if the vmm backend kept it free and the request
    /// would have fitted in the free memory without it.
    pub headroom_bytes: Option<u64>,
}

impl std::fmt::Display for OomReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {} ({} bytes)",
            format_bytes(self.requested_bytes),
            self.requested_bytes,
        )?;
        if let Some(max) = self.max_bytes {
            write!(
                f,
                ", which is larger than streampool's maximum of {} ({max} bytes) for one allocation",
                format_bytes(max)
            )?;
        }
        write!(
            f,
            ". GPU {} has a total capacity of {} of which {} is free. \
             streampool holds {} allocated by live tensors, {} reserved by its pool and {} in its cache.",
            self.device,
            format_bytes(self.device_total_bytes),
            format_bytes(self.device_free_bytes),
            format_bytes(self.allocated_bytes),
            format_bytes(self.reserved_bytes),
            format_bytes(self.cached_bytes),
        )?;
        if let Some(limit) = self.limit_bytes {
            write!(
                f,
                " The request exceeds the limit of {} set by set_per_process_memory_fraction.",
                format_bytes(limit)
            )?;
        }
        if let Some(cap) = self.pool_cap_bytes {
            write!(
                f,
                " STREAMPOOL_MAX_POOL_SIZE caps what streampool holds on this GPU at {}.",
                format_bytes(cap)
            )?;
        }
        if let Some(headroom) = self.headroom_bytes {
            write!(
                f,
                " The vmm backend leaves {} of the GPU free for memory outside the allocator \
                 (STREAMPOOL_VMM_HEADROOM).",
                format_bytes(headroom)
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error(
        "unknown pointer {ptr:#x} on device {device}: it was not allocated by streampool, was already freed, \
         or points inside an allocation"
    )]
    UnknownPointer { ptr: u64, device: usize },
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    #[error("{var}={value:?} is not valid: use {accepted} ({reason})")]
    Config {
        var: &'static str,
        value: String,
        reason: String,
        accepted: &'static str,
    },
    /// A `STREAMPOOL_*` variable is set that streampool does not read (`config::names`).
    #[error(
        "{name} is set, but streampool has no such variable: {}",
        closest.as_ref().map_or_else(
            || "unset it (python -m streampool info lists the variables)".to_string(),
            |known| format!("did you mean {known}? (or unset it)")
        )
    )]
    UnknownVariable {
        name: String,
        closest: Option<String>,
    },
    #[error("CUDA driver call {call} failed with {name} ({code})")]
    Driver {
        call: &'static str,
        code: DriverCode,
        name: String,
    },
    #[error("{0}")]
    DriverUnavailable(String),
    #[error("internal error in streampool (please report): {0}")]
    Internal(String),
    /// A panic left the state of `device`'s `part` half-updated: the device refuses every call
    /// that could hand out or take back memory (its statistics stay readable).
    #[error(
        "device {device} is disabled after an internal error: a panic inside streampool's {part} \
         left its state half-updated, so the device refuses further calls rather than risk \
         handing out the same memory twice (the call that panicked reported it; please report \
         it). A new process can use the device again"
    )]
    Disabled { device: usize, part: &'static str },
}

impl Error {
    /// True for a driver call that failed because the device had no memory left.
    pub fn is_device_oom(&self) -> bool {
        matches!(self, Error::Driver { code, .. } if *code == CUDA_ERROR_OUT_OF_MEMORY)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Status codes returned by the C entry points (see `docs/abi.md`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreampoolStatus {
    Ok = 0,
    InvalidArgument = -1,
    OutOfMemory = -2,
    UnknownPointer = -3,
    ConfigError = -4,
    DriverError = -5,
    DriverUnavailable = -6,
    InternalError = -7,
}

impl From<&Error> for StreampoolStatus {
    fn from(e: &Error) -> Self {
        match e {
            Error::InvalidArgument(_) => StreampoolStatus::InvalidArgument,
            Error::UnknownPointer { .. } => StreampoolStatus::UnknownPointer,
            Error::OutOfMemory(_) => StreampoolStatus::OutOfMemory,
            Error::Config { .. } | Error::UnknownVariable { .. } => StreampoolStatus::ConfigError,
            Error::Driver { .. } => StreampoolStatus::DriverError,
            Error::DriverUnavailable(_) => StreampoolStatus::DriverUnavailable,
            Error::Internal(_) | Error::Disabled { .. } => StreampoolStatus::InternalError,
        }
    }
}

/// Runs `f`, turning a panic into `Error::Internal` (every C entry point and C++ method runs in
/// one: no panic crosses into C or C++).
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Internal(what))
    })
}

//! A device that a panic may have left half-updated refuses further calls.
//!
//! Invariant: once a thread panicked while holding the device lock (the lock is then poisoned,
//! [`crate::sync::Mutex`]), or a resource of the device reported itself disabled
//! ([`DeviceAllocator::disable`]), every entry that hands out or takes back memory — allocate,
//! free, record_stream, flush and trim, the release threshold — fails with
//! [`Error::Disabled`] before it reads the ledger, so no block is handed out twice. Views
//! (statistics, blocks) stay readable. The check is one relaxed load. The device disables itself:
//! every public entry that reaches a resource passes its result through
//! [`DeviceAllocator::disabling`], so no caller has to.

use super::{DeviceAllocator, DeviceState};
use crate::error::{Error, Result};
use crate::sync::MutexGuard;

impl DeviceAllocator {
    /// Err once the device is disabled.
    #[inline]
    pub(super) fn check_enabled(&self) -> Result<()> {
        match self.state.is_poisoned() {
            false => Ok(()),
            true => Err(self.disabled()),
        }
    }

    /// The device lock for an entry's first lock section, unless the device is disabled (checked
    /// with the lock held: a call that waited for it while another thread panicked holding it
    /// does not go on).
    #[inline(always)]
    pub(super) fn lock_enabled(&self) -> Result<MutexGuard<'_, DeviceState>> {
        self.state.lock_unpoisoned().ok_or_else(|| self.disabled())
    }

    #[cold]
    fn disabled(&self) -> Error {
        let part = match self.state.panicked_while_held() {
            true => "device allocator",
            // Disabled by `disable`: the one resource that reports itself disabled.
            false => "virtual-memory resource",
        };
        Error::Disabled {
            device: self.device,
            part,
        }
    }

    /// Refuses every later call: a resource of the device (the virtual-memory resource, the one
    /// with a lock of its own) reported itself disabled.
    pub(crate) fn disable(&self) {
        self.state.poison();
    }

    /// `result`; if it says a resource of the device is disabled, the whole device refuses every
    /// later call. Every public entry that reaches a resource returns through it.
    #[inline(always)]
    pub(crate) fn disabling<T>(&self, result: Result<T>) -> Result<T> {
        match result {
            Ok(value) => Ok(value),
            Err(e) => Err(self.disabling_error(e)),
        }
    }

    /// [`DeviceAllocator::disabling`] for an error.
    #[cold]
    pub(crate) fn disabling_error(&self, e: Error) -> Error {
        if let Error::Disabled { .. } = e {
            self.disable();
        }
        e
    }
}

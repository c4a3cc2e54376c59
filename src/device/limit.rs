//! The memory limit (`set_per_process_memory_fraction`) and out of memory: reserving a block's
//! bytes against the cap, the retry after a flush, and the report a user reads.
//!
//! Invariants: the cap is hard — a block's bytes join `held_bytes` in the same lock section that
//! checks them against the cap, and leave it again if the allocation then fails, so concurrent
//! allocations never hold more than the cap together; out of memory is retried once after a
//! flush, and reported as an [`Error::OutOfMemory`] that counts in `num_ooms`. This layer touches
//! the ledger only through `reserve`, `unreserve`, `evict` and the counters.

use super::{DeviceAllocator, Request};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, OomReport, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::Resource;
use crate::units::format_bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The cap on the bytes a device holds from its resources; `u64::MAX` when there is none. Shared
/// with the resources, which keep what they reserve from the device under it too.
#[derive(Debug)]
pub(super) struct Limit(Arc<AtomicU64>);

impl Default for Limit {
    fn default() -> Limit {
        Limit(Arc::new(AtomicU64::new(u64::MAX)))
    }
}

impl Limit {
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn shared(&self) -> &Arc<AtomicU64> {
        &self.0
    }

    /// Caps the bytes held at `fraction` (0..=1) of `total_bytes`, and returns the cap; a
    /// fraction outside 0..=1 (NaN included) is refused and changes nothing.
    pub fn set_fraction(&self, fraction: f64, total_bytes: u64) -> Result<u64> {
        Limit::check_fraction(fraction)?;
        let limit_bytes = (total_bytes as f64 * fraction) as u64;
        self.0.store(limit_bytes, Ordering::Relaxed);
        Ok(limit_bytes)
    }

    /// `fraction` as a share of a device's memory: refused outside 0..=1 (NaN included).
    pub fn check_fraction(fraction: f64) -> Result<()> {
        match (0.0..=1.0).contains(&fraction) {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} is outside 0..=1"
            ))),
        }
    }
}

impl DeviceAllocator {
    /// Step 3: `block_bytes` join the bytes held from the resources if that stays within the cap;
    /// if not, cached blocks are given back to make room, and if that is not enough either, the
    /// request is out of memory. The caller must `unreserve` if its allocation then fails.
    pub(super) fn reserve_within_limit(&self, request: Request) -> Result<()> {
        let limit_bytes = self.limit.bytes();
        let evicted = {
            let mut st = self.state.lock();
            let over_bytes = match st.ledger.reserve(request.block_bytes, limit_bytes) {
                Ok(()) => return Ok(()),
                Err(over_bytes) => over_bytes,
            };
            st.ledger.evict(over_bytes, request.stream)
        };
        // A block the driver refuses stays held (and counted) until the next flush.
        let _ = self.return_blocks(evicted);
        if self
            .state
            .lock()
            .ledger
            .reserve(request.block_bytes, limit_bytes)
            .is_ok()
        {
            return Ok(());
        }
        Err(self.out_of_memory(request.requested_bytes, request.stream, Some(limit_bytes)))
    }

    /// Steps 5 and 6: `resource` serves the block; out of memory, the cache goes back, the
    /// device is synchronised and its resources trimmed (their unused memory may be what is
    /// missing, for the shareable pool too), and the resource is asked once more.
    pub(super) fn allocate_or_retry(
        &self,
        resource: &dyn Resource,
        request: Request,
    ) -> Result<DevicePtr> {
        let (block_bytes, stream) = (request.block_bytes, request.stream);
        let result = match resource.allocate(block_bytes, stream) {
            Err(e) if e.is_device_oom() => {
                log::warn!(
                    "device {}: out of memory for {}; flushing the cache, synchronising, trimming, retrying",
                    self.device,
                    format_bytes(block_bytes)
                );
                self.state.lock().ledger.counters_mut().num_alloc_retries += 1;
                if let Err(e) = self.flush(0) {
                    log::warn!("device {}: before the retry: {e}", self.device);
                }
                resource.allocate(block_bytes, stream)
            }
            other => other,
        };
        match result {
            Err(e) if e.is_device_oom() => {
                Err(self.out_of_memory(request.requested_bytes, stream, None))
            }
            other => other,
        }
    }

    /// The error a user reads, with what the device and streampool hold; counted in `num_ooms`
    /// and noted on the timeline.
    pub(super) fn out_of_memory(
        &self,
        requested_bytes: u64,
        stream: Stream,
        limit_bytes: Option<u64>,
    ) -> Error {
        let mem = self.driver.mem_info(self.device).unwrap_or_default();
        let reserved_bytes = self
            .setup
            .get()
            .and_then(|setup| setup.reserved_bytes().ok())
            .unwrap_or(0);
        let mut st = self.state.lock();
        st.ledger.counters_mut().num_ooms += 1;
        self.note(
            &st,
            Event::Oom,
            stream,
            DevicePtr(mem.free_bytes),
            requested_bytes,
        );
        let report = OomReport {
            requested_bytes,
            device: self.device,
            device_free_bytes: mem.free_bytes,
            device_total_bytes: mem.total_bytes,
            allocated_bytes: st.ledger.counters().allocated_bytes.current,
            reserved_bytes,
            cached_bytes: st.ledger.cached_bytes(),
            limit_bytes,
            max_bytes: None,
        };
        drop(st);
        log::warn!("{report}");
        Error::OutOfMemory(Box::new(report))
    }

    /// A request above `max_bytes`, streampool's largest: out of memory at once, with the reason,
    /// counted in `num_ooms` like any other; nothing else changes, and the device's resources
    /// are not created for it.
    pub(crate) fn out_of_memory_above(
        &self,
        requested_bytes: u64,
        stream: Stream,
        max_bytes: u64,
    ) -> Error {
        let mut e = self.out_of_memory(requested_bytes, stream, None);
        if let Error::OutOfMemory(report) = &mut e {
            report.max_bytes = Some(max_bytes);
        }
        e
    }

    /// Caps the bytes held from the device's resources at `fraction` (0..=1) of its memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        // Refused before the device's memory is asked for: a bad value creates nothing.
        Limit::check_fraction(fraction)?;
        let total_bytes = self.device_total_bytes()?;
        let limit_bytes = self.limit.set_fraction(fraction, total_bytes)?;
        log::info!(
            "device {}: memory limit set to {} ({fraction} of {})",
            self.device,
            format_bytes(limit_bytes),
            format_bytes(total_bytes)
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_caps_the_device_and_a_bad_one_changes_nothing() {
        let limit = Limit::default();
        assert_eq!(limit.bytes(), u64::MAX, "no cap until one is set");
        assert_eq!(limit.set_fraction(0.25, 1 << 30).unwrap(), 1 << 28);
        assert_eq!(limit.bytes(), 1 << 28);
        for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            let e = limit.set_fraction(bad, 1 << 30).unwrap_err().to_string();
            assert!(e.contains("outside 0..=1"), "{bad}: {e}");
            assert_eq!(limit.bytes(), 1 << 28, "{bad} changed the cap");
        }
        assert_eq!(limit.set_fraction(1.0, 1 << 30).unwrap(), 1 << 30);
        assert_eq!(limit.set_fraction(0.0, 1 << 30).unwrap(), 0);
    }
}

//! The memory limit (`set_per_process_memory_fraction`) and out of memory: reserving a block's
//! bytes against the cap, the retry after making room, and the report a user reads.
//!
//! The rules are the limit's own ([`Limit::reserve`], [`allocate_or_retry`]); what they ask of
//! the device — its ledger, giving blocks back, making room, the report — is [`LimitHost`].
//!
//! Invariants: the cap is hard — a block's bytes join `held_bytes` in the same lock section that
//! checks them against the cap, and leave it again if the allocation then fails, so concurrent
//! allocations never hold more than the cap together; a request over the cap evicts cached blocks
//! once and is checked once more; out of memory is retried once after making room, and reported
//! as an [`Error::OutOfMemory`] that counts in `num_ooms`; any other error is not retried.

use super::freed::Returning;
use super::{DeviceAllocator, Request};
use crate::config::Backend;
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, OomReport, Result};
use crate::history::StreampoolEventKind as Event;
use crate::units::{format_bytes, round_up};
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

/// What the limit asks of its device: the ledger's reservation (with the eviction it may need in
/// the same lock section), giving evicted blocks back, making room before a retry, and the report
/// a user reads.
pub(super) trait LimitHost {
    /// Cached blocks taken out of the ledger, on their way back to their sources.
    type Evicted;
    /// Holds `block_bytes` more if that stays within `limit_bytes`; if not, in the same lock
    /// section, takes at least the bytes over out of the cache (blocks of `stream` first).
    fn reserve_or_evict(
        &self,
        block_bytes: u64,
        limit_bytes: u64,
        stream: Stream,
    ) -> std::result::Result<(), Self::Evicted>;
    /// Holds `block_bytes` more if that stays within `limit_bytes`.
    fn reserve(&self, block_bytes: u64, limit_bytes: u64) -> bool;
    fn give_back(&self, evicted: Self::Evicted);
    /// Before the one retry of a request the source found no memory for: the cache goes back,
    /// the device is synchronised and its resources trimmed.
    fn make_room(&self, block_bytes: u64);
    /// The out-of-memory error of `request`, counted and noted.
    fn out_of_memory(&self, request: Request, limit_bytes: Option<u64>) -> Error;
}

impl Limit {
    /// Step 3: `request`'s block bytes join the bytes held from the resources if that stays
    /// within the cap; if not, cached blocks go back to make room, and if that is not enough
    /// either, the request is out of memory (nothing stays reserved). The caller must
    /// `unreserve` if its allocation then fails.
    pub fn reserve<H: LimitHost>(&self, host: &H, request: Request) -> Result<()> {
        let limit_bytes = self.bytes();
        let evicted = match host.reserve_or_evict(request.block_bytes, limit_bytes, request.stream)
        {
            Ok(()) => return Ok(()),
            Err(evicted) => evicted,
        };
        host.give_back(evicted);
        match host.reserve(request.block_bytes, limit_bytes) {
            true => Ok(()),
            false => Err(host.out_of_memory(request, Some(limit_bytes))),
        }
    }
}

/// Steps 5 and 6: `allocate` serves `request`; out of device memory, the device makes room and
/// `allocate` is asked once more; out of memory again, the request is (with the device's report).
/// Any other error is returned as it is, without a retry.
pub(super) fn allocate_or_retry<H: LimitHost>(
    host: &H,
    request: Request,
    mut allocate: impl FnMut() -> Result<DevicePtr>,
) -> Result<DevicePtr> {
    let result = match allocate() {
        Err(e) if e.is_device_oom() => {
            host.make_room(request.block_bytes);
            allocate()
        }
        other => other,
    };
    match result {
        Err(e) if e.is_device_oom() => Err(host.out_of_memory(request, None)),
        other => other,
    }
}

impl LimitHost for DeviceAllocator {
    type Evicted = Vec<Returning>;

    fn reserve_or_evict(
        &self,
        block_bytes: u64,
        limit_bytes: u64,
        stream: Stream,
    ) -> std::result::Result<(), Vec<Returning>> {
        let mut st = self.state.lock();
        match st.ledger.reserve(block_bytes, limit_bytes) {
            Ok(()) => Ok(()),
            Err(over_bytes) => Err(st.ledger.evict(over_bytes, stream)),
        }
    }

    fn reserve(&self, block_bytes: u64, limit_bytes: u64) -> bool {
        let mut st = self.state.lock();
        st.ledger.reserve(block_bytes, limit_bytes).is_ok()
    }

    fn give_back(&self, evicted: Vec<Returning>) {
        // A block the driver refuses stays held (and counted) until the next flush.
        let _ = self.return_blocks(evicted);
    }

    fn make_room(&self, block_bytes: u64) {
        log::warn!(
            "device {}: out of memory for {}; flushing the cache, synchronising, trimming, retrying",
            self.device,
            format_bytes(block_bytes)
        );
        self.state.lock().ledger.counters_mut().num_alloc_retries += 1;
        if let Err(e) = self.flush(0) {
            log::warn!("device {}: before the retry: {e}", self.device);
        }
    }

    fn out_of_memory(&self, request: Request, limit_bytes: Option<u64>) -> Error {
        let (requested_bytes, stream) = (request.requested_bytes, request.stream);
        DeviceAllocator::out_of_memory(self, requested_bytes, stream, limit_bytes)
    }
}

impl DeviceAllocator {
    /// The error a user reads, with what the device and streampool hold; counted in `num_ooms`
    /// and noted on the timeline.
    pub(super) fn out_of_memory(
        &self,
        requested_bytes: u64,
        stream: Stream,
        limit_bytes: Option<u64>,
    ) -> Error {
        // (In relaxed mode: a capture in global mode may be under way on another thread, which
        // the read would otherwise break.)
        let driver = self.driver.as_ref();
        let mem = crate::driver::in_relaxed_mode(driver, || driver.mem_info(self.device))
            .unwrap_or_default();
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
        let (pool_cap_bytes, headroom_bytes) = self.oom_caps(requested_bytes, mem.free_bytes);
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
            pool_cap_bytes,
            headroom_bytes,
        };
        drop(st);
        log::warn!("{report}");
        Error::OutOfMemory(Box::new(report))
    }

    /// The settings an out-of-memory error names: `STREAMPOOL_MAX_POOL_SIZE` if set, and the vmm
    /// backend's headroom if the request (in whole pages) would have fitted in `free_bytes`
    /// without it.
    fn oom_caps(&self, requested_bytes: u64, free_bytes: u64) -> (Option<u64>, Option<u64>) {
        let Some(setup) = self.setup.get() else {
            return (None, None);
        };
        let sources = &setup.settings.sources;
        let cap = sources.pool.max_size_bytes;
        let headroom = sources.vmm.headroom_bytes;
        // The vmm backend grows a page at a time: a smaller request needs a whole one.
        let granule = setup
            .own
            .first()
            .map_or(1, |r| r.traits().growth_granule_bytes);
        let needed_bytes = round_up(requested_bytes, granule.max(1)).unwrap_or(requested_bytes);
        let headroom_refused = sources.backend == Backend::Vmm
            && headroom > 0
            && needed_bytes <= free_bytes
            && needed_bytes > free_bytes.saturating_sub(headroom);
        (
            (cap != u64::MAX).then_some(cap),
            headroom_refused.then_some(headroom),
        )
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

    /// A device as the limit sees it: bytes held, a cache of blocks (bytes), and what was asked.
    #[derive(Default)]
    struct Host {
        held_bytes: std::cell::Cell<u64>,
        cached: std::cell::RefCell<Vec<u64>>,
        calls: std::cell::RefCell<Vec<String>>,
    }

    impl Host {
        fn reserve_now(&self, block_bytes: u64, limit_bytes: u64) -> bool {
            let after = self.held_bytes.get() + block_bytes;
            (after <= limit_bytes)
                .then(|| self.held_bytes.set(after))
                .is_some()
        }
    }

    impl LimitHost for Host {
        type Evicted = Vec<u64>;

        fn reserve_or_evict(&self, block: u64, limit: u64, _: Stream) -> Result<(), Vec<u64>> {
            if self.reserve_now(block, limit) {
                return Ok(());
            }
            let over = self.held_bytes.get() + block - limit;
            let mut cached = self.cached.borrow_mut();
            let mut evicted = Vec::new();
            while evicted.iter().sum::<u64>() < over && !cached.is_empty() {
                evicted.push(cached.remove(0));
            }
            Err(evicted)
        }

        fn reserve(&self, block_bytes: u64, limit_bytes: u64) -> bool {
            self.reserve_now(block_bytes, limit_bytes)
        }

        fn give_back(&self, evicted: Vec<u64>) {
            self.held_bytes
                .set(self.held_bytes.get() - evicted.iter().sum::<u64>());
            self.calls
                .borrow_mut()
                .push(format!("give back {evicted:?}"));
        }

        fn make_room(&self, block_bytes: u64) {
            self.calls
                .borrow_mut()
                .push(format!("make room for {block_bytes}"));
        }

        fn out_of_memory(&self, request: Request, limit_bytes: Option<u64>) -> Error {
            let what = format!("oom {} {limit_bytes:?}", request.requested_bytes);
            self.calls.borrow_mut().push(what.clone());
            Error::InvalidArgument(what)
        }
    }

    fn request(bytes: u64) -> Request {
        Request::new(bytes, Stream(1)).unwrap()
    }

    #[test]
    fn a_reservation_evicts_what_it_is_over_once_then_is_out_of_memory() {
        let limit = Limit::default();
        limit.0.store(4096, Ordering::Relaxed);
        let host = Host::default();
        limit.reserve(&host, request(2048)).unwrap();
        assert_eq!(host.held_bytes.get(), 2048);
        assert!(
            host.calls.borrow().is_empty(),
            "within the cap: nothing else"
        );
        // 1,024 B over: one cached block of 512 is not enough, two are (the third stays).
        host.held_bytes.set(2048 + 3 * 512);
        *host.cached.borrow_mut() = vec![512, 512, 512];
        limit.reserve(&host, request(1536)).unwrap();
        assert_eq!(*host.calls.borrow(), ["give back [512, 512]"]);
        assert_eq!(host.held_bytes.get(), 4096);
        // Over again, and what is cached is not enough: out of memory with the cap, and
        // nothing held for the request.
        host.calls.borrow_mut().clear();
        let e = limit.reserve(&host, request(1024)).unwrap_err();
        assert!(e.to_string().contains("oom 1024 Some(4096)"), "{e}");
        assert_eq!(
            *host.calls.borrow(),
            ["give back [512]", "oom 1024 Some(4096)"]
        );
        assert_eq!(
            host.held_bytes.get(),
            4096 - 512,
            "a refused request holds nothing"
        );
    }

    #[test]
    fn out_of_memory_is_retried_once_after_making_room_and_other_errors_never() {
        let host = Host::default();
        let oom = || {
            Err(Error::Driver {
                call: "cuMemCreate",
                code: crate::error::CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            })
        };
        let mut answers = vec![oom(), Ok(DevicePtr(0x1000))];
        let served = allocate_or_retry(&host, request(512), || answers.remove(0));
        assert_eq!(served.unwrap(), DevicePtr(0x1000));
        assert_eq!(*host.calls.borrow(), ["make room for 512"]);

        host.calls.borrow_mut().clear();
        let mut asked = 0;
        let e = allocate_or_retry(&host, request(100), || {
            asked += 1;
            oom()
        });
        assert!(e.unwrap_err().to_string().contains("oom 100 None"));
        assert_eq!(asked, 2, "one retry, no more");
        assert_eq!(*host.calls.borrow(), ["make room for 512", "oom 100 None"]);

        host.calls.borrow_mut().clear();
        asked = 0;
        let e = allocate_or_retry(&host, request(100), || {
            asked += 1;
            Err(Error::InvalidArgument("bad".into()))
        });
        assert_eq!(
            e.unwrap_err().to_string(),
            Error::InvalidArgument("bad".into()).to_string()
        );
        assert_eq!(asked, 1, "not retried");
        assert!(host.calls.borrow().is_empty(), "no room made, no report");
    }
}

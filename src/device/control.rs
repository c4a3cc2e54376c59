//! The device's knobs and views: release threshold, peak reset, peer access, statistics, the
//! blocks it holds, the timeline's starting point, trims.
//!
//! Invariant: a view reads the ledger under the device lock and the resources' own accounting
//! outside it; nothing here changes what is allocated.

use super::{DeviceAllocator, DeviceSetup};
use crate::driver::{DevicePtr, PoolUsage, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolBlock;
use crate::resource::{peer_target, usage_with_peaks, Accessible, DriverCounts, Resource, Sleep};
use crate::stats::{DeviceFigures, StreampoolStats};
use crate::tag::TagId;
use crate::units::{parse_size, SIZE_ACCEPTED};
use std::sync::Arc;

impl DeviceAllocator {
    /// Sets the release threshold of the device's resources that keep one.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.check_enabled()?;
        let set = self.setup().and_then(|setup| {
            setup.for_each_own(|r| match r.capabilities().release_threshold {
                Some(threshold) => threshold.set_release_threshold(bytes),
                None => Ok(()),
            })
        });
        self.disabling(set)
    }

    /// The device's memory, read once.
    pub fn device_total_bytes(&self) -> Result<u64> {
        match self.setup.get() {
            Some(setup) => Ok(setup.total_bytes),
            None => Ok(self.driver.mem_info(self.device)?.total_bytes),
        }
    }

    pub fn stats(&self) -> Result<StreampoolStats> {
        let (counters, cached_bytes, shareable) = {
            let st = self.state.lock();
            let sources = st.ledger.sources();
            let shareable = sources.shareable().and_then(|id| sources.get(id).ok());
            (
                st.ledger.counters().clone(),
                st.ledger.cached_bytes(),
                shareable,
            )
        };
        let mut usage = PoolUsage::default();
        let mut driver_counts = DriverCounts::default();
        if let Some(setup) = self.setup.get() {
            for r in &setup.own {
                usage = usage.plus(usage_with_peaks(r.as_ref())?);
                if let Some(statistics) = r.capabilities().statistics {
                    driver_counts = driver_counts.plus(statistics.driver_counts());
                }
            }
        }
        let shareable = match shareable {
            Some(pool) => usage_with_peaks(&*pool)?,
            None => PoolUsage::default(),
        };
        Ok(StreampoolStats::assemble(DeviceFigures {
            counters: &counters,
            cached_bytes,
            usage,
            shareable,
            limit_bytes: self.limit.bytes(),
            driver_counts,
            device_total_bytes: self.device_total_bytes()?,
        }))
    }

    /// The peaks back to the current figures: the device's counters', its own resources' and
    /// the shareable pool's (whose peak `reserved_total` adds to the reserved peak).
    pub fn reset_peak_stats(&self) -> Result<()> {
        self.state.lock().ledger.counters_mut().reset_peaks();
        let Some(setup) = self.setup.get() else {
            return Ok(());
        };
        let reset = |r: &dyn Resource| match r.capabilities().statistics {
            Some(statistics) => statistics.reset_peaks(),
            None => Ok(()),
        };
        let own = setup.for_each_own(reset);
        let shareable = self.shareable_apart(setup);
        own.and(shareable.map_or(Ok(()), |pool| reset(pool.as_ref())))
    }

    /// Grants every other device access to this device's resources (see `Peers::grant_all`).
    pub fn enable_peer_access(&self) -> Result<()> {
        let own: Vec<Arc<dyn Accessible>> =
            self.setup()?.own.iter().filter_map(peer_target).collect();
        let granted = self
            .peers
            .grant_all(self.driver.as_ref(), self.device, &own);
        self.disabling(granted)
    }

    /// The blocks this device holds from its resources (for `dump_snapshot`).
    pub fn blocks(&self) -> Vec<StreampoolBlock> {
        let st = self.state.lock();
        st.ledger.blocks(self.device, st.waits.blocks())
    }

    /// The device's reserved bytes, read only while the timeline is recording.
    pub(super) fn reserved_for_timeline(&self) -> Option<u64> {
        match self.recorder.enabled() {
            true => self.setup.get()?.reserved_bytes().ok(),
            false => None,
        }
    }

    /// Called when the timeline starts: its gauges begin at the device's current values (events
    /// of a resource, such as mappings, carry them until the device's next event).
    pub(crate) fn start_timeline(&self) {
        if let Some(reserved_bytes) = self.reserved_for_timeline() {
            self.recorder.set_reserved(reserved_bytes);
        }
        self.recorder.set_last(self.state.lock().ledger.gauges());
    }

    /// The program is about to synchronise the device (`torch.cuda.synchronize()`, through
    /// install(), before PyTorch's own): at the [`DeviceAllocator::synchronized`] that follows on
    /// this thread, the blocks that waited for other streams before now go back without a
    /// query, their streams' work on them done, and each resource that tends its memory is told
    /// (the vmm resource's fences then complete without a query where nothing was freed since).
    /// Nothing during a capture, nor on a disabled device.
    pub fn synchronizing(&self) -> Result<()> {
        let Some(setup) = self.setup.get() else {
            return Ok(());
        };
        match self.lock_enabled() {
            Ok(mut st) => st.waits.note_sync_begins(),
            Err(_) => return Ok(()),
        }
        for tending in setup.tending() {
            tending.synchronizing();
        }
        Ok(())
    }

    /// The program synchronised the device (`torch.cuda.synchronize()`, through install()):
    /// blocks that waited for other streams (record_stream) go back to their sources, and each
    /// resource that tends its memory is told — the vmm resource makes what was freed before
    /// it ready for every stream (where more than one stream allocated or freed since the last
    /// synchronisation), and, with a release threshold, gives back the memory above it
    /// (after synchronising the device again where a fence may be outstanding), as a CUDA pool
    /// does at a synchronisation. Nothing during a capture, nor on a disabled device.
    pub fn synchronized(&self) -> Result<()> {
        self.disabling(self.settle_at_sync())
    }

    /// [`DeviceAllocator::synchronized`]'s work.
    fn settle_at_sync(&self) -> Result<()> {
        let Some(setup) = self.setup.get() else {
            return Ok(());
        };
        // A disabled device has nothing to settle, and says so at the program's next call:
        // not at every synchronisation. Blocks whose events completed (all recorded before the
        // synchronisation) go back as at the next allocation, and as idle.
        let Ok(st) = self.lock_enabled() else {
            return Ok(());
        };
        if !self.return_finished_waits(st, true)? {
            return Ok(());
        }
        for tending in setup.tending() {
            tending.synchronized()?;
        }
        Ok(())
    }

    /// Every physical page of the device goes back to it, the addresses kept (streampool.sleep()):
    /// after the device synchronised, so nothing half-written is saved; at `level` 1 what live
    /// blocks hold waits in page-locked host memory, but for blocks allocated under a tag in
    /// `discard`. The bytes given back. Only on a resource that can keep its addresses (the vmm
    /// backend); never during a capture. A tag name no thread ever pushed is an error naming it,
    /// and nothing changes.
    pub fn sleep(&self, level: u32, discard: &[&str]) -> Result<u64> {
        let discard = discard
            .iter()
            .map(|name| crate::tag::lookup(name))
            .collect::<Result<Vec<TagId>>>()?;
        self.disabling(self.sleep_discarding(level, &discard))
    }

    /// [`DeviceAllocator::sleep`]'s work, the tags found.
    fn sleep_discarding(&self, level: u32, discard: &[TagId]) -> Result<u64> {
        if !matches!(level, 1 | 2) {
            return Err(Error::InvalidArgument(format!(
                "sleep level {level}: 1 keeps the contents in host memory, 2 discards them"
            )));
        }
        self.refuse_unless_vmm("sleep")?;
        let setup = self.setup()?;
        let sleepers = self.sleepers(setup, "sleep")?;
        // Refusals first, in one lock section with the sleep's announcement: a refused sleep
        // changes nothing (the flush would). The blocks freed and waiting for other streams are
        // handed back by the flush before the sleep.
        {
            let mut st = self.lock_enabled()?;
            if st.waits.capturing_now(self.driver.as_ref(), self.device) {
                return Err(Error::InvalidArgument(format!(
                    "device {} cannot sleep while a stream of it captures a CUDA graph",
                    self.device
                )));
            }
            let freed: Vec<DevicePtr> = st.waits.blocks().map(|w| w.block.ptr).collect();
            for sleeper in &sleepers {
                sleeper.may_sleep_now(&freed)?;
            }
            st.sleeps_under_way += 1;
            st.asleep_maybe = true;
        }
        let slept = self.flush_and_sleep(&sleepers, level, discard);
        let mut st = self.state.lock();
        st.sleeps_under_way -= 1;
        self.note_asleep(&mut st);
        slept
    }

    /// The sleep itself, the refusals passed: the waiting blocks back, then each resource.
    fn flush_and_sleep(
        &self,
        sleepers: &[&dyn Sleep],
        level: u32,
        discard: &[TagId],
    ) -> Result<u64> {
        self.flush(u64::MAX)?; // blocks that waited for streams go back; the device synchronises
        (sleepers.iter()).try_fold(0u64, |sum, sleep| {
            Ok(sum.saturating_add(sleep.sleep(level, discard)?))
        })
    }

    /// The device's own resources, every one of which can sleep (the vmm backend's); else an
    /// error saying that `entry` needs the vmm backend, naming the first that cannot.
    fn sleepers<'a>(&self, setup: &'a DeviceSetup, entry: &str) -> Result<Vec<&'a dyn Sleep>> {
        match setup.own.iter().find(|r| r.capabilities().sleep.is_none()) {
            // The backend can sleep, but this device's memory comes from elsewhere: say why.
            Some(_) if setup.settings.every_block_shareable => {
                Err(Error::InvalidArgument(format!(
                    "device {}: streampool.{entry}() is not possible with STREAMPOOL_IPC=1 \
                     (install(ipc=True)): every block comes from a shareable CUDA pool, which \
                     cannot give memory back and keep its addresses (on the vmm backend a plain \
                     install() shares tensors page by page, or share from inside \
                     streampool.shareable())",
                    self.device
                )))
            }
            Some(r) => Err(self.needs_vmm(
                entry,
                &format!(
                    "the {} that serves this device (the vmm backend falls back to CUDA pools on a \
                     device without virtual memory management)",
                    r.traits().label
                ),
            )),
            None => Ok((setup.own.iter())
                .filter_map(|r| r.capabilities().sleep)
                .collect()),
        }
    }

    /// `entry` refused on a backend whose resources cannot sleep, before the device is set up:
    /// a refusal creates nothing (a device that cannot run vmm, and got the pool's, is refused
    /// once set up, where its resources are asked).
    fn refuse_unless_vmm(&self, entry: &str) -> Result<()> {
        let backend = self.settings.backend();
        match crate::resource::backend_sleeps(backend) {
            true => Ok(()),
            false => Err(self.needs_vmm(entry, &format!("the {} backend", backend.name()))),
        }
    }

    /// The error of `entry` on a device whose memory comes from `what`, which cannot sleep.
    fn needs_vmm(&self, entry: &str, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "device {}: streampool.{entry}() needs the vmm backend (STREAMPOOL_BACKEND=vmm): \
             {what} cannot give memory back and keep its addresses",
            self.device
        ))
    }

    /// Maps memory again where the device slept (streampool.wake()); the bytes restored.
    pub fn wake(&self) -> Result<u64> {
        let woken = self.disabling(self.wake_all());
        self.note_asleep(&mut self.state.lock());
        woken
    }

    /// Whether a resource may sleep, under the device's lock: a sleep under way, or one asleep.
    fn note_asleep(&self, st: &mut super::DeviceState) {
        st.asleep_maybe = st.sleeps_under_way > 0 || self.is_asleep();
    }

    /// [`DeviceAllocator::wake`]'s work. The device's memory running out part way is an
    /// out-of-memory error for what still sleeps (counted, and torch.OutOfMemoryError in Python),
    /// not the driver's error of one call.
    fn wake_all(&self) -> Result<u64> {
        self.refuse_unless_vmm("wake")?;
        let not_asleep = || {
            Err(Error::InvalidArgument(format!(
                "device {} is not asleep: nothing to wake",
                self.device
            )))
        };
        // A device never used never slept: refused without setting it up (which would grant
        // other devices' memory access to it, a change a refused call must not make); nor does
        // an awake one collect its waits.
        let Some(setup) = self.setup.get() else {
            return not_asleep();
        };
        let sleepers = self.sleepers(setup, "wake")?;
        let asleep = (sleepers.iter()).try_fold(false, |any, s| Ok::<_, Error>(any | s.asleep()?));
        if !asleep? {
            return not_asleep();
        }
        // Blocks freed while asleep that waited for other streams (record_stream) and whose
        // streams are done go back first: the wake need not map them again.
        self.return_finished_waits(self.lock_enabled()?, false)?;
        let woken: Result<u64> =
            (sleepers.iter()).try_fold(0u64, |sum, sleep| Ok(sum.saturating_add(sleep.wake()?)));
        match woken {
            Err(e) if e.is_device_oom() => {
                Err(self.out_of_memory(self.sleeping_bytes(), Stream::LEGACY, None))
            }
            other => other,
        }
    }

    /// [`DeviceAllocator::refuse_while_asleep`] for an allocation's slow path, the device's lock
    /// held: the resources are asked only where one may sleep.
    #[inline(always)]
    pub(super) fn refuse_if_asleep(&self, st: &super::DeviceState) -> Result<()> {
        match st.asleep_maybe {
            false => Ok(()),
            true => self.refuse_while_asleep(),
        }
    }

    /// The error of an allocation outside the device's own resources (the shareable pool) while
    /// they sleep: allocating on a sleeping device raises until wake(), whatever the pool.
    pub(super) fn refuse_while_asleep(&self) -> Result<()> {
        match self.own_sleepers().find_map(|s| s.asleep_error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether the device sleeps now ([`DeviceAllocator::sleep`] without its wake).
    pub fn is_asleep(&self) -> bool {
        self.own_sleepers().any(|s| s.asleep_error().is_some())
    }

    /// Bytes of the device asleep now.
    pub fn sleeping_bytes(&self) -> u64 {
        self.sum_over_sleepers(|s| s.sleeping_bytes())
    }

    /// Bytes of the sleeping device's contents waiting in page-locked host memory.
    pub fn sleep_saved_bytes(&self) -> u64 {
        self.sum_over_sleepers(|s| s.saved_bytes())
    }

    /// Bytes of page-locked host memory held for sleeping: the contents while asleep, the
    /// buffer kept for the next sleep once awake.
    pub fn sleep_host_buffer_bytes(&self) -> u64 {
        self.sum_over_sleepers(|s| s.host_buffer_bytes())
    }

    /// Frees the host buffer kept for the next sleep (streampool.release_sleep_buffer()); the
    /// bytes freed. An error while the device is asleep.
    pub fn release_sleep_buffer(&self) -> Result<u64> {
        let Some(setup) = self.setup.get() else {
            return Ok(0);
        };
        let freed = (setup.own.iter().filter_map(|r| r.capabilities().sleep))
            .try_fold(0u64, |sum, sleep| {
                Ok(sum.saturating_add(sleep.release_host_buffer()?))
            });
        self.disabling(freed)
    }

    /// Page-locks the host buffer of the next level-1 sleep now
    /// (streampool.reserve_sleep_buffer()): `bytes`, or with 0 what the memory under live blocks
    /// needs now; a kept buffer at least that large stays. The bytes kept. Only on a resource
    /// that can sleep (the vmm backend); an error while asleep.
    pub fn reserve_sleep_buffer(&self, bytes: u64) -> Result<u64> {
        self.refuse_unless_vmm("reserve_sleep_buffer")?;
        // Nothing live on a device never used: nothing to reserve, and nothing is created.
        if bytes == 0 && self.setup.get().is_none() {
            return Ok(0);
        }
        let setup = self.setup()?;
        // (A device that cannot run the vmm backend got the pool's.)
        let sleepers = self.sleepers(setup, "reserve_sleep_buffer")?;
        let kept = (sleepers.iter()).try_fold(0u64, |sum, sleep| {
            Ok(sum.saturating_add(sleep.reserve_host_buffer(bytes)?))
        });
        self.disabling(kept)
    }

    /// `figure` summed over the device's resources that can sleep (0 before its first use).
    fn sum_over_sleepers(&self, figure: impl Fn(&dyn Sleep) -> u64) -> u64 {
        self.own_sleepers().map(figure).fold(0, u64::saturating_add)
    }

    /// The device's own resources that can sleep; none before its first use.
    fn own_sleepers(&self) -> impl Iterator<Item = &dyn Sleep> {
        let own = self.setup.get().map_or(&[][..], |setup| &setup.own[..]);
        own.iter().filter_map(|r| r.capabilities().sleep)
    }

    /// Returns the cache, synchronises and trims each resource to `keep_bytes`.
    pub fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.setup()?;
        self.disabling(self.flush(keep_bytes))
    }
}

/// What the driver says of the device, and sizes read against its memory.
impl DeviceAllocator {
    /// True if the device supports stream-ordered memory pools.
    pub fn pools_supported(&self) -> Result<bool> {
        self.driver.pools_supported(self.device)
    }

    /// True if the device's pools can be shared with other processes.
    pub fn ipc_supported(&self) -> Result<bool> {
        self.driver.ipc_supported(self.device)
    }

    /// True if the device supports virtual memory management (`STREAMPOOL_BACKEND=vmm`).
    pub fn vmm_supported(&self) -> Result<bool> {
        self.driver.vmm_supported(self.device)
    }

    /// The device's memory now, from the driver.
    pub fn mem_info(&self) -> Result<crate::driver::MemInfo> {
        self.driver.mem_info(self.device)
    }

    /// `spec` ("8GiB", "80%" of the device's memory, "max", ...) in bytes.
    pub fn parse_bytes(&self, spec: &str) -> Result<u64> {
        let size = parse_size(spec).map_err(|reason| {
            Error::InvalidArgument(format!(
                "{spec:?} is not a size: use {SIZE_ACCEPTED} ({reason})"
            ))
        })?;
        Ok(size.resolve_bytes(self.device_total_bytes()?))
    }

    /// `cacheInfo`: the largest block the device could serve now — its free memory plus what
    /// streampool holds there unused (cached, or reserved by its resources and not handed out).
    pub fn cache_info_bytes(&self) -> Result<u64> {
        let stats = self.stats()?;
        let free = self.mem_info()?.free_bytes;
        let unused = stats
            .reserved_bytes
            .saturating_sub(stats.pool_used_bytes)
            .saturating_add(stats.cached_bytes);
        Ok(free.saturating_add(unused))
    }
}

//! The virtual-memory resource as the device sees it: the [`Resource`] interface — allocate,
//! deallocate (with its stream's fence), usage, trim — and its capabilities (release threshold,
//! statistics, background release, peer access, capture notice); and its teardown.
//!
//! Invariants: those of the resource ([`super`]); a deallocation keeps the block in the slot
//! ([`super::slot`]) and records at most one fence per stream and millisecond, never on a
//! capturing stream — but one handed back idle at a synchronisation whose stream the driver says
//! has finished, which goes to its ranges ready for every stream, with no fence; the teardown
//! waits for the device before it unmaps anything.

use super::live::Refused;
use super::spans::GiveBack;
use super::{VmmResource, VmmState};
use crate::driver::{DevicePtr, PoolUsage, Stream};
use crate::error::{Error, Result};
use crate::resource::{
    Accessible, Capabilities, CaptureNotice, DriverCounts, PageExport, ReleaseThreshold, Resource,
    Statistics, Tending, Traits, Usage,
};
use std::sync::atomic::Ordering;

impl Accessible for VmmResource {
    fn label(&self) -> &'static str {
        "virtual memory resource"
    }

    fn grant_access(&self, peer: usize) -> Result<()> {
        let mut st = self.lock_enabled()?;
        let pages: Vec<u64> = st.pages.keys().copied().collect();
        self.set_access(&mut st, &pages, &[peer])?;
        if !st.peers.contains(&peer) {
            st.peers.push(peer);
        }
        Ok(())
    }
}

impl VmmResource {
    /// [`Resource::deallocate`] under the resource's lock; a refusal's error is built by the
    /// caller ([`VmmResource::refused_free`]), so that the common outcome returns a small value.
    #[inline(always)]
    fn deallocate_locked(
        &self,
        st: &mut VmmState,
        ptr: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> std::result::Result<(), Refused> {
        Self::take_back(st, ptr, bytes)?;
        // Kept aside for the stream's next request of its size; the block freed before it goes
        // back to its ranges.
        self.put_slot(st, ptr.0, bytes, stream);
        Ok(())
    }

    /// A free's first step, whatever follows: the live block of `bytes` at `ptr` is no longer in
    /// use (refused, and nothing changes, if there is none).
    #[inline(always)]
    fn take_back(
        st: &mut VmmState,
        ptr: DevicePtr,
        bytes: u64,
    ) -> std::result::Result<(), Refused> {
        st.live.remove(ptr.0, bytes)?;
        st.used_bytes -= bytes;
        Ok(())
    }

    /// The error of a free the live blocks refused (built off the hot path).
    #[cold]
    fn refused_free(&self, ptr: DevicePtr, bytes: u64, refused: Refused) -> Error {
        match refused {
            Refused::Size(b) => {
                Error::InvalidArgument(format!("{ptr:#x} is a block of {b} B, not {bytes} B"))
            }
            Refused::Unknown => Error::UnknownPointer {
                ptr: ptr.0,
                device: self.device,
            },
        }
    }
}

impl Resource for VmmResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let mut st = timed_section!("vmm allocate: lock", self.lock_enabled())?;
        if st.asleep.is_some() {
            return Err(super::sleep::asleep_error(self.device));
        }
        if let Some(start) = self.take_slot(&mut st, bytes, stream) {
            return Ok(self.hand_out(&mut st, start, bytes));
        }
        let start = if self.in_slab(bytes) {
            self.place_in_slab(&mut st, bytes, stream)?
        } else if bytes <= self.small_max_bytes {
            self.place_small(&mut st, bytes, stream)?
        } else {
            self.place_large(&mut st, bytes, stream)?
        };
        let ptr = self.hand_out(&mut st, start, bytes);
        if st.device_full {
            self.release_surplus(&mut st);
        }
        Ok(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        let mut st = timed_section!("vmm deallocate: lock", self.lock_enabled())?;
        self.deallocate_locked(&mut st, ptr, bytes, stream)
            .map_err(|refused| self.refused_free(ptr, bytes, refused))
    }

    fn deallocate_idle(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        let mut st = self.lock_enabled()?;
        // While a capture is known, a free is a plain one.
        if self.capturing(&mut st) {
            return (self.deallocate_locked(&mut st, ptr, bytes, stream))
                .map_err(|refused| self.refused_free(ptr, bytes, refused));
        }
        Self::take_back(&mut st, ptr, bytes)
            .map_err(|refused| self.refused_free(ptr, bytes, refused))?;
        self.return_slot(&mut st);
        let now_ms = self.driver.now_ms();
        self.give_back(&mut st, ptr.0, bytes, super::ranges::State::Ready, now_ms);
        Ok(())
    }

    #[inline]
    fn try_allocate(&self, bytes: u64, stream: Stream) -> Option<DevicePtr> {
        let mut st = self.try_lock_enabled()?;
        if st.asleep.is_some() {
            return None; // (the slow path says why)
        }
        if let Some(start) = self.take_slot(&mut st, bytes, stream) {
            let ptr = self.hand_out(&mut st, start, bytes);
            // The common exit releases the lock inline, not through the drop glue.
            st.unlock();
            return Some(ptr);
        }
        let start = self.take_at_hand(&mut st, bytes, stream)?;
        Some(self.hand_out(&mut st, start, bytes))
    }

    #[inline]
    fn try_deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Option<Result<()>> {
        let mut st = self.try_lock_enabled()?;
        match self.deallocate_locked(&mut st, ptr, bytes, stream) {
            Ok(()) => Some(Ok(())),
            Err(refused) => Some(Err(self.refused_free(ptr, bytes, refused))),
        }
    }

    fn usage(&self) -> Result<Usage> {
        let st = self.state.lock();
        Ok(Usage {
            reserved_bytes: st.physical_bytes(self.page_bytes),
            used_bytes: st.used_bytes,
        })
    }

    fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.trim_after_sync(keep_bytes, GiveBack::Asked)
    }

    fn traits(&self) -> Traits {
        Traits {
            label: "virtual memory resource",
            // It reuses a block freed on a stream on that stream at once itself (the slot, then
            // the ranges); a small block cached in front of it would pin its carrier page
            // (replayed llama_decode and BERT held 1.07x and 1.18x their live bytes with the
            // device's cache, 1.02x without).
            cacheable: false,
            held: true,
            shareable: false,
            returns_before_growth: false,
            // A slot, a fit in a carrier or a mapped range: under the resource's lock if free.
            fast_path: true,
            reuses_across_streams: true,
            trims: true,
            checks_free_size: true,
            growth_granule_bytes: self.page_bytes,
            // Its trim records its fences and synchronises itself.
            frees_applied_at_sync: false,
            takes_idle_blocks: true,
            keeps_under_limit: true,
        }
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            release_threshold: Some(self),
            statistics: Some(self),
            tending: Some(self),
            peer_access: Some(self),
            capture_notice: Some(self),
            export: None,
            page_export: self.exportable.then_some(self as &dyn PageExport),
            sleep: Some(self),
        }
    }
}

impl ReleaseThreshold for VmmResource {
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.release_threshold_bytes.store(bytes, Ordering::Relaxed);
        Ok(())
    }
}

impl Statistics for VmmResource {
    fn usage_with_peaks(&self) -> Result<PoolUsage> {
        let st = self.state.lock();
        Ok(PoolUsage {
            reserved_bytes: st.physical_bytes(self.page_bytes),
            reserved_bytes_high: st.physical_high_bytes,
            used_bytes: st.used_bytes,
            used_bytes_high: st.used_high_bytes,
        })
    }

    fn reset_peaks(&self) -> Result<()> {
        let mut st = self.state.lock();
        st.used_high_bytes = st.used_bytes;
        st.physical_high_bytes = st.physical_bytes(self.page_bytes);
        Ok(())
    }

    fn driver_counts(&self) -> DriverCounts {
        self.state.lock().counts
    }
}

impl Tending for VmmResource {
    fn release_above_threshold(&self) -> bool {
        VmmResource::release_above_threshold(self)
    }

    fn release_idle(&self) -> Result<bool> {
        Ok(VmmResource::release_idle(self))
    }

    fn synchronizing(&self) {
        self.note_sync_begins();
    }

    fn synchronized(&self) -> Result<()> {
        match self.release_threshold_bytes.load(Ordering::Relaxed) {
            u64::MAX => self.settle_after_sync(),
            threshold => self.trim_after_sync(threshold, GiveBack::Threshold),
        }
    }
}

impl CaptureNotice for VmmResource {
    fn capture_started(&self, stream: Stream) {
        let Ok(mut st) = self.lock_enabled() else {
            return;
        };
        st.captures.note(stream);
    }
}

impl Drop for VmmResource {
    /// Waits for the device, then unmaps and releases everything and frees the addresses.
    fn drop(&mut self) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let _ = driver.synchronize(device);
        let st = &mut *self.state.lock();
        st.fences.destroy(driver, device);
        let asleep = st.asleep.take().and_then(|a| a.host());
        for host in asleep.into_iter().chain(st.sleep_buffer.take()) {
            driver.host_free(device, host.buffer);
        }
        for r in std::mem::take(&mut st.retiring) {
            let _ = driver.mem_unmap(device, DevicePtr(r.page), self.page_bytes);
        }
        for (page, p) in std::mem::take(&mut st.pages) {
            // A mapping at a time (a span's pages share one).
            if p.mapping.first == page {
                let bytes = p.mapping.pages * self.page_bytes;
                let _ = driver.mem_unmap(device, DevicePtr(page), bytes);
                st.spare_handles.push(p.handle);
            }
        }
        let spans = st.spare_spans.drain(..).map(|(handle, _)| handle);
        for handle in st.spare_handles.drain(..).chain(spans) {
            let _ = driver.mem_release(device, handle);
        }
        for (base, bytes) in st.large.extents().chain(st.carriers.extents()) {
            let _ = driver.address_free(device, DevicePtr(base), bytes);
        }
    }
}

//! streampool's own virtual-memory pool for large blocks (`STREAMPOOL_BACKEND=vmm`): one address
//! range per device, shared by every stream, backed page by page with physical handles
//! (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`).
//!
//! - A block freed on stream S is reusable on S at once, on other streams once a fence (an event
//!   recorded on S at the free) has completed ([`fences`]); free neighbours coalesce
//!   ([`ranges`]).
//! - A request that fits no mapped free range gets a window of free addresses; its unmapped pages
//!   are backed first by handles taken out of idle pages elsewhere (holes whose fences have
//!   completed), then by fresh handles — the device's memory grows only when no idle page is left.
//! - Physical memory above the release threshold that no work uses is unmapped and released at
//!   frees and allocations, and, for what the GPU had not finished at the last free, by a
//!   background releaser ([`releaser`]) — without the program having to synchronise.
//!
//! Invariants: a page is unmapped only once no work uses it — it lies in a `Ready` range, whose
//! fences have completed; every mapping gives the device and every granted peer access before any
//! block in it is handed out; while a capture is known on the device nothing is mapped, unmapped
//! or queried (an allocation that would need a mapping fails with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the device serves it elsewhere; frees wait for the
//! capture's end), and the resource asks the driver when the capture has ended; the resource's
//! lock is held across map and unmap calls (they are rare: growth, release), never while the
//! device lock is.

mod fences;
mod mapping;
mod ranges;
mod releaser;

use super::{Accessible, Resource};
use crate::config::Config;
use crate::driver::{DevicePtr, Driver, MemHandle, PoolUsage, Stream};
use crate::error::{
    Error, Result, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
};
use crate::fasthash::WordMap;
use crate::history::{Recorder, StreampoolEventKind as Event};
use crate::sync::Mutex;
use crate::units::{format_bytes, format_limit};
use fences::Fences;
use ranges::{FreeRanges, State};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// The address space reserved up front, as a multiple of the device's memory: live blocks take
/// at most 1x, so half of it is always free for new windows, however fragmented. More is reserved
/// only if no window fits.
const ADDRESS_SPACE_PER_DEVICE_MEMORY: u64 = 2;

pub struct VmmResource {
    driver: Arc<dyn Driver>,
    device: usize,
    page_bytes: u64,
    extent_bytes: u64,
    max_physical_bytes: u64,
    device_total_bytes: u64,
    background_release: bool,
    recorder: Arc<Recorder>,
    state: Mutex<VmmState>,
    release_threshold_bytes: AtomicU64,
    me: Weak<VmmResource>,
}

#[derive(Default)]
struct VmmState {
    free: FreeRanges,
    /// Mapped pages and their handles.
    pages: BTreeMap<u64, MemHandle>,
    /// Handles taken out of idle pages and not mapped again yet (counted as reserved).
    spare_handles: Vec<MemHandle>,
    /// Live blocks: start -> bytes.
    live: WordMap<u64, u64>,
    used_bytes: u64,
    used_high_bytes: u64,
    physical_high_bytes: u64,
    fences: Fences,
    /// Streams of the device known to capture a graph (from the device's allocations on them):
    /// while one still does, nothing is mapped, unmapped or queried.
    capture_streams: Vec<Stream>,
    /// Freed on a stream that was capturing a graph: they get fences once the capture ends.
    deferred: Vec<(u64, u64, Stream)>,
    /// Devices other than its own with access.
    peers: Vec<usize>,
    /// Some pages are blocked (mapped without access): settling tries to fix them.
    blocked: bool,
    /// Pages mapped and unmapped so far.
    maps: u64,
    unmaps: u64,
}

impl VmmState {
    fn physical_bytes(&self, page_bytes: u64) -> u64 {
        (self.pages.len() + self.spare_handles.len()) as u64 * page_bytes
    }
}

fn paused() -> Error {
    Error::Driver {
        call: "cuMemMap",
        code: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        name: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (streampool maps no memory while a stream of \
               the device captures a graph)"
            .into(),
    }
}

impl VmmResource {
    /// The resource of `device` (of `total_bytes` memory), with its first address reservation.
    pub fn create(
        driver: &Arc<dyn Driver>,
        device: usize,
        config: &Config,
        total_bytes: u64,
        recorder: Arc<Recorder>,
    ) -> Result<Arc<VmmResource>> {
        if !driver.vmm_supported(device)? {
            return Err(Error::DriverUnavailable(format!(
                "device {device} does not support CUDA virtual memory management \
                 (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): set \
                 STREAMPOOL_BACKEND=pool"
            )));
        }
        let granularity = driver.vmm_granularity_bytes(device)?;
        let crate::config::VmmLayout {
            page_bytes,
            extent_bytes,
        } = config.vmm_layout(
            device,
            driver.name(),
            granularity,
            total_bytes,
            ADDRESS_SPACE_PER_DEVICE_MEMORY,
        )?;
        let resource = Arc::new_cyclic(|me| VmmResource {
            driver: Arc::clone(driver),
            device,
            page_bytes,
            extent_bytes,
            max_physical_bytes: config.max_pool_size.resolve_bytes(total_bytes),
            device_total_bytes: total_bytes,
            background_release: config.vmm_background_release,
            recorder,
            state: Mutex::new(VmmState {
                free: FreeRanges::new(page_bytes),
                ..VmmState::default()
            }),
            release_threshold_bytes: AtomicU64::new(
                config.release_threshold.resolve_bytes(total_bytes),
            ),
            me: me.clone(),
        });
        resource.reserve(&mut resource.state.lock(), extent_bytes)?;
        log::info!(
            "device {device}: created the virtual memory resource ({} pages, {} of addresses, \
             release threshold {})",
            format_bytes(page_bytes),
            format_bytes(extent_bytes),
            format_limit(resource.release_threshold_bytes.load(Ordering::Relaxed)),
        );
        Ok(resource)
    }

    /// Reserves another extent of at least `bytes` of addresses.
    fn reserve(&self, st: &mut VmmState, bytes: u64) -> Result<()> {
        let bytes = bytes.div_ceil(self.page_bytes) * self.page_bytes;
        let base = self.driver.address_reserve(self.device, bytes)?;
        st.free.add_extent(base.0, bytes);
        Ok(())
    }

    /// Hands `[start, start + bytes)` out as a live block.
    fn hand_out(&self, st: &mut VmmState, start: u64, bytes: u64) -> DevicePtr {
        st.free.take(start, bytes);
        st.live.insert(start, bytes);
        st.used_bytes += bytes;
        st.used_high_bytes = st.used_high_bytes.max(st.used_bytes);
        DevicePtr(start)
    }

    /// True while a known capture is under way on the device (ended ones are forgotten: asking
    /// whether a stream captures is allowed during a capture).
    fn capturing(&self, st: &mut VmmState) -> bool {
        if !st.capture_streams.is_empty() {
            let (driver, device) = (self.driver.as_ref(), self.device);
            st.capture_streams
                .retain(|s| driver.is_capturing(device, *s).unwrap_or(true));
        }
        !st.capture_streams.is_empty()
    }

    /// Freed ranges whose fences completed become ready for every stream; blocks freed during a
    /// capture that has ended get their fences; blocked pages are fixed. Nothing during a known
    /// capture, which forbids event queries.
    fn settle(&self, st: &mut VmmState) {
        if self.capturing(st) {
            return;
        }
        if !st.deferred.is_empty() {
            self.fence_deferred(st);
        }
        if st.blocked {
            self.unblock(st);
            st.blocked = !st.free.blocked_pages().is_empty();
        }
        for (stream, completed) in st.fences.poll(self.driver.as_ref(), self.device) {
            st.free.promote(stream, completed);
        }
    }

    fn fence_deferred(&self, st: &mut VmmState) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        for (start, bytes, stream) in std::mem::take(&mut st.deferred) {
            if driver.is_capturing(device, stream).unwrap_or(true) {
                st.deferred.push((start, bytes, stream));
                continue;
            }
            match st.fences.record(driver, device, stream) {
                Ok(seq) => st.free.give(start, bytes, State::Freed { stream, seq }),
                Err(_) => st.deferred.push((start, bytes, stream)),
            }
        }
    }

    /// At a free or an allocation: memory above the release threshold that no work uses goes
    /// back to the device; what the GPU has not finished with yet is left to the releaser.
    fn apply_release_threshold(&self, st: &mut VmmState) {
        let threshold = self.release_threshold_bytes.load(Ordering::Relaxed);
        if st.physical_bytes(self.page_bytes) <= threshold {
            return;
        }
        self.settle(st);
        self.release_down_to(st, threshold);
        if self.background_release
            && st.physical_bytes(self.page_bytes) > threshold
            && (st.free.freed_bytes() > 0 || !st.deferred.is_empty())
        {
            releaser::wake(self.me.clone());
        }
    }

    /// One pass of the releaser: true while memory above the threshold still waits for the GPU.
    pub(super) fn release_pass(&self) -> bool {
        let Ok(mut st) = self.lock_enabled() else {
            return false;
        };
        let threshold = self.release_threshold_bytes.load(Ordering::Relaxed);
        if st.physical_bytes(self.page_bytes) <= threshold {
            return false;
        }
        self.settle(&mut st);
        self.release_down_to(&mut st, threshold);
        st.physical_bytes(self.page_bytes) > threshold
            && (st.free.freed_bytes() > 0 || !st.deferred.is_empty() || self.capturing(&mut st))
    }

    /// The resource's lock for an entry point, unless a panic while it was held left the state
    /// half-updated: then every entry that maps, hands out or takes back memory refuses
    /// (`crate::sync::Mutex`; views stay readable).
    #[inline]
    fn lock_enabled(&self) -> Result<crate::sync::MutexGuard<'_, VmmState>> {
        self.state.lock_unpoisoned().ok_or(Error::Disabled {
            device: self.device,
            part: "virtual-memory resource",
        })
    }

    /// Counts a page mapped or unmapped, and notes it on the timeline.
    fn count(&self, kind: Event, page: u64, st: &mut VmmState) {
        match kind {
            Event::Map => st.maps += 1,
            _ => st.unmaps += 1,
        }
        let reserved_bytes = st.physical_bytes(self.page_bytes);
        self.recorder
            .note_resource(kind, DevicePtr(page), self.page_bytes, reserved_bytes);
    }
}

impl Accessible for VmmResource {
    fn label(&self) -> &'static str {
        "virtual memory resource"
    }

    fn grant_access(&self, peer: usize) -> Result<()> {
        let mut st = self.lock_enabled()?;
        let pages: Vec<u64> = st.pages.keys().copied().collect();
        self.set_access(&pages, &[peer])?;
        if !st.peers.contains(&peer) {
            st.peers.push(peer);
        }
        Ok(())
    }
}

impl Resource for VmmResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let mut st = self.lock_enabled()?;
        if let Some(start) = st.free.best_fit(bytes, stream) {
            return Ok(self.hand_out(&mut st, start, bytes));
        }
        self.settle(&mut st);
        if let Some(start) = st.free.best_fit(bytes, stream) {
            return Ok(self.hand_out(&mut st, start, bytes));
        }
        if self.capturing(&mut st) {
            return Err(paused());
        }
        if bytes > self.max_physical_bytes.min(self.device_total_bytes) {
            return Err(Error::Driver {
                call: "cuMemCreate",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY (more than the device has)".into(),
            });
        }
        let window = match st.free.window(bytes, stream) {
            Some(window) => window,
            None => {
                self.reserve(&mut st, bytes.max(self.extent_bytes))?;
                st.free.window(bytes, stream).ok_or_else(|| {
                    Error::Internal(format!("no window for {bytes} B in a new reservation"))
                })?
            }
        };
        self.map_window(&mut st, &window, bytes)?;
        let ptr = self.hand_out(&mut st, window.start, bytes);
        self.apply_release_threshold(&mut st);
        Ok(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        let capturing = self
            .driver
            .is_capturing(self.device, stream)
            .unwrap_or(true);
        let mut st = self.lock_enabled()?;
        match st.live.remove(&ptr.0) {
            Some(b) if b == bytes => {}
            Some(b) => {
                st.live.insert(ptr.0, b);
                return Err(Error::InvalidArgument(format!(
                    "{ptr:#x} is a block of {b} B, not {bytes} B"
                )));
            }
            None => {
                return Err(Error::UnknownPointer {
                    ptr: ptr.0,
                    device: self.device,
                })
            }
        }
        st.used_bytes -= bytes;
        // On a capturing stream no fence can be recorded; during a known capture elsewhere none
        // can be queried: the block waits for the capture's end.
        if capturing || self.capturing(&mut st) {
            st.deferred.push((ptr.0, bytes, stream));
            // Above the threshold the releaser looks again once the capture is over.
            self.apply_release_threshold(&mut st);
            return Ok(());
        }
        match st.fences.record(self.driver.as_ref(), self.device, stream) {
            Ok(seq) => {
                st.free.give(ptr.0, bytes, State::Freed { stream, seq });
                // Keeps the fence queues short: each free looks at their fronts.
                self.settle(&mut st);
            }
            Err(e) => {
                // No fence: wait for the stream, after which no work uses the block.
                drop(st);
                log::warn!(
                    "device {}: {e}; synchronising the stream before reusing {ptr:#x}",
                    self.device
                );
                let synced = self.driver.stream_synchronize(self.device, stream);
                st = self.state.lock();
                match synced {
                    Ok(()) => st.free.give(ptr.0, bytes, State::Ready),
                    // The block is ours now either way: it waits, like a block freed during a
                    // capture, for a fence at the next try (the caller must not free it again).
                    Err(e) => {
                        log::warn!(
                            "device {}: {e}; {ptr:#x} waits for a later fence",
                            self.device
                        );
                        st.deferred.push((ptr.0, bytes, stream));
                    }
                }
            }
        }
        self.apply_release_threshold(&mut st);
        Ok(())
    }

    fn usage(&self) -> Result<PoolUsage> {
        let st = self.state.lock();
        Ok(PoolUsage {
            reserved_bytes: st.physical_bytes(self.page_bytes),
            reserved_bytes_high: st.physical_high_bytes,
            used_bytes: st.used_bytes,
            used_bytes_high: st.used_high_bytes,
        })
    }

    fn reserved_used_bytes(&self) -> Result<(u64, u64)> {
        let st = self.state.lock();
        Ok((st.physical_bytes(self.page_bytes), st.used_bytes))
    }

    fn trim(&self, keep_bytes: u64) -> Result<()> {
        let mut st = self.lock_enabled()?;
        if !st.deferred.is_empty() {
            // Blocks freed during a capture get their fences only now, after the device's
            // synchronisation: wait for those too, so that empty_cache releases every free page.
            self.fence_deferred(&mut st);
            drop(st);
            self.driver.synchronize(self.device)?;
            st = self.state.lock();
        }
        self.settle(&mut st);
        self.release_down_to(&mut st, keep_bytes);
        Ok(())
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.release_threshold_bytes.store(bytes, Ordering::Relaxed);
        self.apply_release_threshold(&mut *self.lock_enabled()?);
        Ok(())
    }

    fn reset_peaks(&self) -> Result<()> {
        let mut st = self.state.lock();
        st.used_high_bytes = st.used_bytes;
        st.physical_high_bytes = st.physical_bytes(self.page_bytes);
        Ok(())
    }

    fn returns_before_growth(&self) -> bool {
        false
    }

    fn capture_started(&self, stream: Stream) {
        let Ok(mut st) = self.lock_enabled() else {
            return;
        };
        if !st.capture_streams.contains(&stream) {
            st.capture_streams.push(stream);
        }
    }

    fn map_counts(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.maps, st.unmaps)
    }
}

impl Drop for VmmResource {
    /// Waits for the device, then unmaps and releases everything and frees the addresses.
    fn drop(&mut self) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let _ = driver.synchronize(device);
        let st = &mut *self.state.lock();
        st.fences.destroy(driver, device);
        for (page, handle) in std::mem::take(&mut st.pages) {
            let _ = driver.mem_unmap(device, DevicePtr(page), self.page_bytes);
            st.spare_handles.push(handle);
        }
        for handle in st.spare_handles.drain(..) {
            let _ = driver.mem_release(device, handle);
        }
        for (base, bytes) in st.free.extents() {
            let _ = driver.address_free(device, DevicePtr(base), bytes);
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;

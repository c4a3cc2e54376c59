//! Managed (unified) memory as a [`Resource`] (`STREAMPOOL_BACKEND=managed`): each block is one
//! `cuMemAllocManaged` allocation, usable from the host and from every device and stream. A
//! small backend, and the example of docs/layout.md's "Adding a backend".
//!
//! `cuMemFree` is not stream-ordered and waits for the whole device, so a freed block is kept:
//! it serves its own stream's next request of its size at once (stream order), any stream's once
//! the fence recorded on its stream after the free has completed ([`crate::stream_order`]), and
//! goes back to the driver, once that fence completed, when memory runs out, on `trim`, and
//! before a new allocation would take the live and kept bytes above the device's memory or its
//! limit (managed memory oversubscribes: past the device's memory a new allocation still
//! succeeds, and the GPU pages to the host, so running out is not a signal to wait for).
//! `STREAMPOOL_MAX_POOL_SIZE` and the memory fraction are hard caps: a new allocation that would
//! take the live and kept bytes above either, once the kept blocks done with went back, is out
//! of memory (the device then waits for its streams and tries again, as on every backend).
//!
//! Invariants: a block is handed to a stream other than the one that freed it only once the
//! work queued on that stream before the free has completed; `cuMemFree` is called only for such
//! blocks and never while a capture is known on the device; the calls a capture in global mode
//! forbids (allocating, freeing, recording and querying events) are made in relaxed capture mode,
//! and no fence is recorded on a capturing stream; a refused free changes nothing; `used` is the
//! live bytes, `reserved` the live and the kept freed bytes (those on their way back to the
//! driver included, until `cuMemFree` returns), which no new allocation takes above the cap or
//! the limit (checked under the lock with the allocation it admits); the resource's lock is never
//! held across a synchronisation.

use super::{
    Capabilities, CaptureNotice, Own, PoolUsage, Provisioning, Resource, Statistics, Traits, Usage,
};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::stream_order::{CaptureWatch, Fences};
use crate::sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A freed block kept for reuse, and the fence of its stream that covers the free.
#[derive(Debug, Clone, Copy)]
struct Freed {
    ptr: DevicePtr,
    bytes: u64,
    stream: Stream,
    fence: u64,
}

#[derive(Default)]
struct State {
    /// Live blocks: address -> bytes.
    live: HashMap<u64, u64>,
    /// Freed blocks not given back yet, oldest first.
    freed: Vec<Freed>,
    live_bytes: u64,
    freed_bytes: u64,
    /// Kept blocks on their way back to the driver (`cuMemFree` runs with the lock released):
    /// still held, so counted against the caps until the call returns.
    returning_bytes: u64,
    /// High-water marks of `live_bytes` and of what the driver holds ([`State::held_bytes`]).
    used_high_bytes: u64,
    reserved_high_bytes: u64,
    fences: Fences,
    captures: CaptureWatch,
}

impl State {
    /// What the driver holds for this resource: live, kept, and kept blocks being given back.
    fn held_bytes(&self) -> u64 {
        (self.live_bytes)
            .saturating_add(self.freed_bytes)
            .saturating_add(self.returning_bytes)
    }

    /// Raises the high-water marks to the current figures (after a block became live).
    fn note_peaks(&mut self) {
        self.used_high_bytes = self.used_high_bytes.max(self.live_bytes);
        self.reserved_high_bytes = self.reserved_high_bytes.max(self.held_bytes());
    }
}

pub struct ManagedResource {
    driver: Arc<dyn Driver>,
    device: usize,
    /// The device's memory, and its limit (`set_per_process_memory_fraction`; shared with the
    /// device): kept blocks go back before a new one would take the reserved bytes above either.
    total_bytes: u64,
    limit_bytes: Arc<AtomicU64>,
    /// `STREAMPOOL_MAX_POOL_SIZE` (`u64::MAX`: none): what the live and kept bytes never pass.
    max_bytes: u64,
    state: Mutex<State>,
}

/// The `managed` backend's row of [`super::provision`]: one managed-memory resource serves every
/// size; `None` (logged) where the device has no managed memory.
pub fn own(at: &Provisioning<'_>) -> Result<Option<Own>> {
    let device = at.device;
    if !at.driver.managed_supported(device)? {
        log::warn!(
            "device {device} does not support managed memory (CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY): \
             it uses the pool backend instead of STREAMPOOL_BACKEND=managed"
        );
        return Ok(None);
    }
    let large = Arc::new(ManagedResource::new(
        at.driver,
        device,
        at.total_bytes,
        Arc::clone(at.limit_bytes),
        at.settings.pool.max_size_bytes,
    ));
    Ok(Some(Own::Split { large, small: None }))
}

impl ManagedResource {
    pub fn new(
        driver: &Arc<dyn Driver>,
        device: usize,
        total_bytes: u64,
        limit_bytes: Arc<AtomicU64>,
        max_bytes: u64,
    ) -> ManagedResource {
        ManagedResource {
            driver: Arc::clone(driver),
            device,
            total_bytes,
            limit_bytes,
            max_bytes,
            state: Mutex::new(State::default()),
        }
    }

    /// What the live and kept bytes may reach: the device's memory, its limit or the cap, the
    /// lowest.
    fn capacity_bytes(&self) -> u64 {
        self.total_bytes.min(self.bound_bytes())
    }

    /// The hard bound on what the driver holds for this resource: the cap or the device's limit,
    /// the lower (the device's memory is none: managed memory oversubscribes).
    fn bound_bytes(&self) -> u64 {
        (self.max_bytes).min(self.limit_bytes.load(Ordering::Relaxed))
    }

    /// Out of memory: a new block would take what the driver holds, `held_bytes`, past the bound.
    fn over_bound(&self, held_bytes: u64) -> Error {
        Error::Driver {
            call: "cuMemAllocManaged",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: format!(
                "CUDA_ERROR_OUT_OF_MEMORY (more than STREAMPOOL_MAX_POOL_SIZE or the memory \
                 fraction allows: {held_bytes} B held of {} B)",
                self.bound_bytes()
            ),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Brings the fences up to date with the GPU: pending ones of streams that finished their
    /// work complete, the others are recorded (not on capturing streams), recorded ones polled.
    fn settle(&self, st: &mut State) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let _ = driver.relaxed_capture(&mut || {
            st.fences.poll(driver, device);
            st.fences.settle_pending(driver, device);
            Ok(())
        });
    }

    /// The kept block `i` (its fence may not have completed: the caller checks) becomes live.
    fn take_freed(&self, st: &mut State, i: usize) -> DevicePtr {
        let f = st.freed.remove(i);
        st.freed_bytes -= f.bytes;
        st.live_bytes += f.bytes;
        st.live.insert(f.ptr.0, f.bytes);
        st.note_peaks();
        f.ptr
    }

    /// Gives kept blocks whose fences completed back to the driver, oldest first, until no more
    /// than `keep_bytes` is reserved; nothing while a capture is known. The blocks leave the
    /// list under the lock and are freed with it released (`cuMemFree` waits for the whole
    /// device); the first failure stops it, and that block and the rest are kept again, for a
    /// later try. Returns the lock, taken again.
    fn give_back<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        keep_bytes: u64,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        if st.captures.refresh(driver, device) {
            return (st, Ok(()));
        }
        let mut taken = Vec::new();
        let mut i = 0;
        while i < st.freed.len() && st.live_bytes + st.freed_bytes > keep_bytes {
            let f = st.freed[i];
            if st.fences.outstanding(f.stream, f.fence) {
                i += 1;
                continue;
            }
            st.freed.remove(i);
            st.freed_bytes -= f.bytes;
            taken.push(f);
        }
        if taken.is_empty() {
            return (st, Ok(()));
        }
        let taken_bytes: u64 = taken.iter().map(|f| f.bytes).sum();
        st.returning_bytes += taken_bytes;
        drop(st);
        let mut result = Ok(());
        let mut freed = 0;
        for f in &taken {
            if let Err(e) = driver.relaxed_capture(&mut || driver.mem_free(device, f.ptr)) {
                result = Err(e);
                break;
            }
            freed += 1;
        }
        let mut st = self.lock();
        st.returning_bytes -= taken_bytes;
        for f in &taken[freed..] {
            st.freed_bytes += f.bytes;
            st.freed.push(*f);
        }
        (st, result)
    }

    /// A new managed allocation of `bytes`, live; out of memory if it would take what the driver
    /// holds for this resource above the cap or the device's limit ([`Self::bound_bytes`]).
    fn allocate_new(&self, st: &mut State, bytes: u64) -> Result<DevicePtr> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let held_bytes = st.held_bytes();
        if held_bytes.saturating_add(bytes) > self.bound_bytes() {
            return Err(self.over_bound(held_bytes));
        }
        let ptr =
            crate::driver::in_relaxed_mode(driver, || driver.mem_alloc_managed(device, bytes))?;
        let live_bytes = st.live_bytes.checked_add(bytes);
        let Some(live_bytes) = live_bytes.filter(|_| !st.live.contains_key(&ptr.0)) else {
            // Not counted: handed back at once, and what is live stays as it was.
            let _ = driver.relaxed_capture(&mut || driver.mem_free(device, ptr));
            return Err(Error::Internal(format!(
                "cuMemAllocManaged returned {ptr:#x}, which is live or beyond counting"
            )));
        };
        st.live.insert(ptr.0, bytes);
        st.live_bytes = live_bytes;
        st.note_peaks();
        Ok(ptr)
    }
}

impl Resource for ManagedResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let mut st = self.lock();
        // Freed on this stream: its next work comes after the free (stream order).
        let own = |f: &Freed| f.stream == stream && f.bytes == bytes;
        if let Some(i) = st.freed.iter().rposition(own) {
            return Ok(self.take_freed(&mut st, i));
        }
        // Freed on another stream whose work up to the free has completed.
        self.settle(&mut st);
        let fences = &st.fences;
        let done = |f: &Freed| f.bytes == bytes && !fences.outstanding(f.stream, f.fence);
        if let Some(i) = st.freed.iter().position(done) {
            return Ok(self.take_freed(&mut st, i));
        }
        // Larger than the bound itself: nothing given back could make room.
        if bytes > self.bound_bytes() {
            return Err(self.over_bound(st.held_bytes()));
        }
        // Kept blocks go back first where a new one would take the reserved bytes past the
        // device's memory or its limit: managed memory would not fail there, it would page.
        let reserved = st.held_bytes();
        let capacity = self.capacity_bytes();
        if reserved.saturating_add(bytes) > capacity && !st.freed.is_empty() {
            let (again, result) = self.give_back(st, capacity.saturating_sub(bytes));
            st = again;
            if let Err(e) = result {
                log::debug!("device {}: giving managed memory back: {e}", self.device);
            }
        }
        match self.allocate_new(&mut st, bytes) {
            Err(e) if e.is_device_oom() && !st.freed.is_empty() => {
                // What is kept and done with goes back before the request fails.
                let (mut st, result) = self.give_back(st, 0);
                if let Err(e) = result {
                    log::debug!("device {}: giving managed memory back: {e}", self.device);
                }
                self.allocate_new(&mut st, bytes)
            }
            other => other,
        }
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        let mut st = self.lock();
        let Some(&live_bytes) = st.live.get(&ptr.0) else {
            return Err(Error::UnknownPointer {
                ptr: ptr.0,
                device: self.device,
            });
        };
        if live_bytes != bytes {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is a block of {live_bytes} B of managed memory, not {bytes} B"
            )));
        }
        st.live.remove(&ptr.0);
        st.live_bytes -= bytes;
        st.freed_bytes += bytes;
        let (fence, _) = st.fences.free_on(stream, self.driver.now_us(), 0);
        st.freed.push(Freed {
            ptr,
            bytes,
            stream,
            fence,
        });
        Ok(())
    }

    fn usage(&self) -> Result<Usage> {
        let st = self.lock();
        Ok(Usage {
            reserved_bytes: st.held_bytes(),
            used_bytes: st.live_bytes,
        })
    }

    /// After the device's synchronisation: fences of frees made before it are recorded (a
    /// stream destroyed since can record none: its frees are done once the device has
    /// synchronised again), and the kept blocks above `keep_bytes` go back.
    fn trim(&self, keep_bytes: u64) -> Result<()> {
        let mut st = self.lock();
        let (driver, device) = (self.driver.as_ref(), self.device);
        if st.captures.refresh(driver, device) {
            return Ok(());
        }
        let gone = st.fences.pending_of_gone_streams(driver, device);
        let recorded = st.fences.record_all_pending(driver, device);
        if recorded || !gone.is_empty() {
            drop(st);
            driver.synchronize(device)?;
            st = self.lock();
        }
        st.fences.complete_pending(&gone);
        self.settle(&mut st);
        self.give_back(st, keep_bytes).1
    }

    fn traits(&self) -> Traits {
        Traits {
            label: "managed memory",
            // Exact sizes only: the device's cache in front serves a stream's loop at once.
            cacheable: true,
            held: true,
            shareable: false,
            returns_before_growth: false,
            fast_path: false,
            reuses_across_streams: true,
            trims: true,
            checks_free_size: true,
            growth_granule_bytes: 1,
            // Its trim records its fences and waits for them itself.
            frees_applied_at_sync: false,
            takes_idle_blocks: false,
            keeps_under_limit: true,
        }
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            capture_notice: Some(self),
            statistics: Some(self),
            ..Capabilities::default()
        }
    }
}

impl Statistics for ManagedResource {
    fn usage_with_peaks(&self) -> Result<PoolUsage> {
        let st = self.lock();
        Ok(PoolUsage {
            reserved_bytes: st.held_bytes(),
            reserved_bytes_high: st.reserved_high_bytes,
            used_bytes: st.live_bytes,
            used_bytes_high: st.used_high_bytes,
        })
    }

    fn reset_peaks(&self) -> Result<()> {
        let mut st = self.lock();
        st.used_high_bytes = st.live_bytes;
        st.reserved_high_bytes = st.held_bytes();
        Ok(())
    }
}

impl CaptureNotice for ManagedResource {
    fn capture_started(&self, stream: Stream) {
        self.lock().captures.note(stream);
    }
}

impl Drop for ManagedResource {
    /// Waits for the device, then frees everything it still has (a block still live belongs to
    /// a caller who outlived the device's allocator: nothing may use it any more).
    fn drop(&mut self) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let _ = driver.synchronize(device);
        let st = &mut *self.state.lock();
        st.fences.destroy(driver, device);
        let live = st.live.drain().map(|(ptr, _)| DevicePtr(ptr));
        for ptr in live.chain(st.freed.drain(..).map(|f| f.ptr)) {
            if let Err(e) = driver.mem_free(device, ptr) {
                log::debug!("device {device}: freeing managed memory {ptr:#x}: {e}");
            }
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;

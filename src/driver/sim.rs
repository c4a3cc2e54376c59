//! A simulated CUDA driver on the host: stream-ordered pools, events, capture and fault injection.
//!
//! Invariants: work on a stream "completes" only when the test says so (`complete_stream`,
//! `complete_all`) or on `synchronize`; a freed block is reusable at once by its own stream, by
//! other streams only after completion; no two live allocations overlap; dropping a strict
//! simulator with live or pending allocations panics (leak check).

mod ipc;

use super::{DevicePtr, Driver, EventHandle, MemInfo, PoolAttr, PoolHandle, PoolUsage, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::units::round_up;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The pool's physical granule, as on real GPUs.
const GRANULE_BYTES: u64 = 2 << 20;
/// Address alignment of simulated allocations.
const ALIGN_BYTES: u64 = 512;
const CUDA_ERROR_INVALID_VALUE: i32 = 1;
const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;

/// Driver calls that can be made to fail on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimFault {
    PoolCreate,
    Alloc,
    Free,
    EventCreate,
    EventRecord,
    Synchronize,
}

#[derive(Default)]
struct StreamClock {
    submitted: u64,
    completed: u64,
}

struct PendingFree {
    ptr: DevicePtr,
    bytes: u64,
    stream: Stream,
    seq: u64,
}

struct SimPool {
    max_size_bytes: u64,
    release_threshold_bytes: u64,
    reserved_bytes: u64,
    reserved_high: u64,
    used_bytes: u64,
    used_high: u64,
    live: HashMap<DevicePtr, u64>,
    pending: Vec<PendingFree>,
    /// Other devices granted access (`pool_grant_access`).
    peers: Vec<usize>,
    shareable: bool,
}

#[derive(Default)]
struct SimDevice {
    pools: Vec<SimPool>,
    streams: HashMap<Stream, StreamClock>,
    /// event id -> (stream, sequence number) of its last record
    events: HashMap<usize, Option<(Stream, u64)>>,
    capturing: Vec<Stream>,
    captured_live: HashMap<DevicePtr, u64>,
    /// Pointers imported from a shareable pool (`pointer_import`), with how often.
    imported: HashMap<DevicePtr, u32>,
    /// free address ranges: start -> length; the address space is carved on demand
    free_ranges: BTreeMap<u64, u64>,
    next_addr: u64,
    sticky_error: Option<i32>,
}

pub struct SimDriver {
    memory_bytes: u64,
    devices: Vec<Mutex<SimDevice>>,
    next_event: AtomicUsize,
    capturing_streams: AtomicUsize,
    faults: Mutex<HashMap<SimFault, u32>>,
    strict_leak_check: bool,
    /// (device, peer) pairs where `peer` cannot access `device`'s memory; all others can.
    peer_incapable: Mutex<Vec<(usize, usize)>>,
    ipc_unsupported: Mutex<Vec<usize>>,
    /// inode of an exported pool's file descriptor -> (device, pool).
    exported_pools: Mutex<HashMap<u64, (usize, PoolHandle)>>,
}

impl SimDriver {
    /// `device_count` simulated devices of `memory_bytes` each.
    pub fn new(device_count: usize, memory_bytes: u64) -> SimDriver {
        let devices = (0..device_count)
            .map(|d| {
                Mutex::new(SimDevice {
                    next_addr: 0x7f00_0000_0000 + ((d as u64) << 44),
                    ..SimDevice::default()
                })
            })
            .collect();
        SimDriver {
            memory_bytes,
            devices,
            next_event: AtomicUsize::new(1),
            capturing_streams: AtomicUsize::new(0),
            faults: Mutex::new(HashMap::new()),
            strict_leak_check: false,
            peer_incapable: Mutex::new(Vec::new()),
            ipc_unsupported: Mutex::new(Vec::new()),
            exported_pools: Mutex::new(HashMap::new()),
        }
    }

    /// Makes `Drop` panic if allocations are still live or pending (for tests).
    pub fn strict(mut self) -> SimDriver {
        self.strict_leak_check = true;
        self
    }

    /// The next `count` calls of `fault` fail.
    pub fn inject_fault(&self, fault: SimFault, count: u32) {
        *self.faults.lock().entry(fault).or_default() += count;
    }

    /// All work submitted so far on `stream` completes.
    pub fn complete_stream(&self, device: usize, stream: Stream) {
        let mut d = self.devices[device].lock();
        let clock = d.streams.entry(stream).or_default();
        clock.completed = clock.submitted;
        d.retire_completed();
    }

    /// All work on every stream of every device completes.
    pub fn complete_all(&self) {
        for d in &self.devices {
            let mut d = d.lock();
            d.complete_all_streams();
        }
    }

    pub fn begin_capture(&self, device: usize, stream: Stream) {
        self.devices[device].lock().capturing.push(stream);
        self.capturing_streams.fetch_add(1, Ordering::SeqCst);
    }

    pub fn end_capture(&self, device: usize, stream: Stream) {
        let mut d = self.devices[device].lock();
        if let Some(i) = d.capturing.iter().position(|s| *s == stream) {
            d.capturing.swap_remove(i);
            self.capturing_streams.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Bytes still allocated (live or pending) across all pools and graph allocations.
    pub fn outstanding_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| {
                let d = d.lock();
                d.pools.iter().map(|p| p.used_bytes).sum::<u64>()
                    + d.captured_live.values().sum::<u64>()
            })
            .sum()
    }

    fn take_fault(&self, fault: SimFault, call: &'static str) -> Result<()> {
        let mut faults = self.faults.lock();
        match faults.get_mut(&fault) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(driver_error(call, 999, "CUDA_ERROR_UNKNOWN (injected)"))
            }
            _ => Ok(()),
        }
    }

    /// The device for `call`, or the device's sticky error (see [`SimDriver::set_sticky_error`]).
    fn device(
        &self,
        device: usize,
        call: &'static str,
    ) -> Result<parking_lot::MutexGuard<'_, SimDevice>> {
        let d = self
            .devices
            .get(device)
            .map(|d| d.lock())
            .ok_or_else(|| driver_error("cuDeviceGet", 101, "CUDA_ERROR_INVALID_DEVICE"))?;
        match d.sticky_error {
            Some(code) => Err(driver_error(
                call,
                code,
                "CUDA_ERROR_ILLEGAL_ADDRESS (sticky)",
            )),
            None => Ok(d),
        }
    }

    /// Makes `peer` unable to access memory on `device` (as `cuDeviceCanAccessPeer` reporting 0).
    pub fn set_peer_incapable(&self, device: usize, peer: usize) {
        self.peer_incapable.lock().push((device, peer));
    }

    /// How many pools `device` has created.
    pub fn pool_count(&self, device: usize) -> usize {
        self.devices[device].lock().pools.len()
    }

    /// The devices granted access to `device`'s `pool`, in the order granted.
    pub fn pool_peers(&self, device: usize, pool: PoolHandle) -> Vec<usize> {
        self.devices[device].lock().pools[pool.0].peers.clone()
    }

    /// From now on every call on `device` fails with `CUDA_ERROR_ILLEGAL_ADDRESS`, as after a
    /// kernel fault: the context is unusable for the rest of the process, other devices are not.
    pub fn set_sticky_error(&self, device: usize) {
        self.devices[device].lock().sticky_error = Some(CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

impl SimDevice {
    fn tick(&mut self, stream: Stream) -> u64 {
        let clock = self.streams.entry(stream).or_default();
        clock.submitted += 1;
        clock.submitted
    }

    fn complete_all_streams(&mut self) {
        for clock in self.streams.values_mut() {
            clock.completed = clock.submitted;
        }
        self.retire_completed();
    }

    /// Returns completed frees to their pools' free memory.
    fn retire_completed(&mut self) {
        let streams = &self.streams;
        let mut released = Vec::new();
        for pool in &mut self.pools {
            pool.pending.retain(|f| {
                let done = streams.get(&f.stream).is_some_and(|c| c.completed >= f.seq);
                if done {
                    pool.used_bytes -= f.bytes;
                    released.push((f.ptr, f.bytes));
                }
                !done
            });
        }
        for (ptr, bytes) in released {
            self.release_range(ptr, bytes);
        }
    }

    /// A free pending on `stream` itself is reusable by that stream at once (stream order), but by
    /// no other stream until it completes. Takes the smallest such free that holds `bytes`; what
    /// is left of it stays pending, with the same stream and sequence number.
    fn reuse_own_stream(&mut self, pool: usize, stream: Stream, bytes: u64) -> Option<DevicePtr> {
        let wanted = round_up(bytes, ALIGN_BYTES);
        let p = &mut self.pools[pool];
        let i = p
            .pending
            .iter()
            .enumerate()
            .filter(|(_, f)| f.stream == stream && round_up(f.bytes, ALIGN_BYTES) >= wanted)
            .min_by_key(|(_, f)| f.bytes)
            .map(|(i, _)| i)?;
        let f = p.pending.swap_remove(i);
        p.used_bytes -= f.bytes;
        let rest = round_up(f.bytes, ALIGN_BYTES) - wanted;
        if rest > 0 {
            p.used_bytes += rest;
            p.pending.push(PendingFree {
                ptr: f.ptr + wanted,
                bytes: rest,
                ..f
            });
        }
        Some(f.ptr)
    }

    fn claim_range(&mut self, bytes: u64) -> DevicePtr {
        let bytes = round_up(bytes, ALIGN_BYTES);
        let fit = self
            .free_ranges
            .iter()
            .find(|(_, len)| **len >= bytes)
            .map(|(a, l)| (*a, *l));
        match fit {
            Some((addr, len)) => {
                self.free_ranges.remove(&addr);
                if len > bytes {
                    self.free_ranges.insert(addr + bytes, len - bytes);
                }
                addr
            }
            None => {
                let addr = self.next_addr;
                self.next_addr += bytes;
                addr
            }
        }
    }

    fn release_range(&mut self, addr: u64, bytes: u64) {
        let mut start = addr;
        let mut len = round_up(bytes, ALIGN_BYTES);
        if let Some((&prev, &prev_len)) = self.free_ranges.range(..addr).next_back() {
            if prev + prev_len == addr {
                self.free_ranges.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free_ranges.get(&(start + len)) {
            self.free_ranges.remove(&(start + len));
            len += next_len;
        }
        self.free_ranges.insert(start, len);
    }

    fn reserved_elsewhere(&self, pool: usize) -> u64 {
        let pools: u64 = self
            .pools
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != pool)
            .map(|(_, p)| p.reserved_bytes)
            .sum();
        pools + self.captured_live.values().sum::<u64>()
    }

    fn apply_release_threshold(&mut self) {
        for p in &mut self.pools {
            if p.reserved_bytes > p.release_threshold_bytes {
                p.reserved_bytes = p
                    .release_threshold_bytes
                    .max(round_up(p.used_bytes, GRANULE_BYTES));
            }
        }
    }
}

impl SimPool {
    fn note_usage(&mut self) {
        self.used_high = self.used_high.max(self.used_bytes);
        self.reserved_high = self.reserved_high.max(self.reserved_bytes);
    }
}

fn driver_error(call: &'static str, code: i32, name: &str) -> Error {
    Error::Driver {
        call,
        code,
        name: name.to_string(),
    }
}

impl Driver for SimDriver {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo> {
        let d = self.device(device, "cuMemGetInfo")?;
        let used: u64 = d.pools.iter().map(|p| p.reserved_bytes).sum::<u64>()
            + d.captured_live.values().sum::<u64>();
        Ok(MemInfo {
            free_bytes: self.memory_bytes.saturating_sub(used),
            total_bytes: self.memory_bytes,
        })
    }

    fn pools_supported(&self, device: usize) -> Result<bool> {
        drop(self.device(device, "cuDeviceGetAttribute")?);
        Ok(true)
    }

    fn pool_create(
        &self,
        device: usize,
        max_size_bytes: u64,
        shareable: bool,
    ) -> Result<PoolHandle> {
        self.take_fault(SimFault::PoolCreate, "cuMemPoolCreate")?;
        let mut d = self.device(device, "cuMemPoolCreate")?;
        d.pools.push(SimPool {
            max_size_bytes,
            release_threshold_bytes: 0,
            reserved_bytes: 0,
            reserved_high: 0,
            used_bytes: 0,
            used_high: 0,
            live: HashMap::new(),
            pending: Vec::new(),
            peers: Vec::new(),
            shareable,
        });
        Ok(PoolHandle(d.pools.len() - 1))
    }

    fn pool_set_attr(&self, device: usize, pool: PoolHandle, attr: PoolAttr) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolSetAttribute")?;
        if let PoolAttr::ReleaseThresholdBytes(b) = attr {
            d.pools[pool.0].release_threshold_bytes = b;
        }
        Ok(())
    }

    fn pool_usage(&self, device: usize, pool: PoolHandle) -> Result<PoolUsage> {
        let d = self.device(device, "cuMemPoolGetAttribute")?;
        let p = &d.pools[pool.0];
        Ok(PoolUsage {
            reserved_bytes: p.reserved_bytes,
            reserved_bytes_high: p.reserved_high,
            used_bytes: p.used_bytes,
            used_bytes_high: p.used_high,
        })
    }

    fn pool_reserved_used(&self, device: usize, pool: PoolHandle) -> Result<(u64, u64)> {
        let d = self.device(device, "cuMemPoolGetAttribute")?;
        let p = &d.pools[pool.0];
        Ok((p.reserved_bytes, p.used_bytes))
    }

    fn pool_reset_peaks(&self, device: usize, pool: PoolHandle) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolSetAttribute")?;
        let p = &mut d.pools[pool.0];
        p.reserved_high = p.reserved_bytes;
        p.used_high = p.used_bytes;
        Ok(())
    }

    fn pool_trim(&self, device: usize, pool: PoolHandle, keep_bytes: u64) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolTrimTo")?;
        d.retire_completed();
        let p = &mut d.pools[pool.0];
        p.reserved_bytes = p
            .reserved_bytes
            .min(keep_bytes.max(round_up(p.used_bytes, GRANULE_BYTES)));
        Ok(())
    }

    fn alloc_async(
        &self,
        device: usize,
        pool: PoolHandle,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.take_fault(SimFault::Alloc, "cuMemAllocFromPoolAsync")?;
        let mut d = self.device(device, "cuMemAllocFromPoolAsync")?;
        let reused = d.reuse_own_stream(pool.0, stream, bytes);
        let elsewhere = d.reserved_elsewhere(pool.0);
        let p = &mut d.pools[pool.0];
        let available = p.reserved_bytes - p.used_bytes.min(p.reserved_bytes);
        if reused.is_none() && bytes > available {
            let grown = p.reserved_bytes + round_up(bytes - available, GRANULE_BYTES);
            if grown > p.max_size_bytes || grown + elsewhere > self.memory_bytes {
                return Err(driver_error(
                    "cuMemAllocFromPoolAsync",
                    CUDA_ERROR_OUT_OF_MEMORY,
                    "CUDA_ERROR_OUT_OF_MEMORY",
                ));
            }
            p.reserved_bytes = grown;
        }
        p.used_bytes += bytes;
        p.note_usage();
        let ptr = reused.unwrap_or_else(|| d.claim_range(bytes));
        d.pools[pool.0].live.insert(ptr, bytes);
        d.tick(stream);
        Ok(ptr)
    }

    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        self.take_fault(SimFault::Alloc, "cuMemAllocAsync")?;
        let mut d = self.device(device, "cuMemAllocAsync")?;
        let reserved: u64 = d.pools.iter().map(|p| p.reserved_bytes).sum::<u64>()
            + d.captured_live.values().sum::<u64>();
        if reserved + bytes > self.memory_bytes {
            return Err(driver_error(
                "cuMemAllocAsync",
                CUDA_ERROR_OUT_OF_MEMORY,
                "CUDA_ERROR_OUT_OF_MEMORY",
            ));
        }
        let ptr = d.claim_range(bytes);
        d.captured_live.insert(ptr, bytes);
        d.tick(stream);
        Ok(ptr)
    }

    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::Free, "cuMemFreeAsync")?;
        let mut d = self.device(device, "cuMemFreeAsync")?;
        if let Some(count) = d.imported.get_mut(&ptr) {
            *count -= 1;
            if *count == 0 {
                d.imported.remove(&ptr);
            }
            return Ok(());
        }
        if let Some(bytes) = d.captured_live.remove(&ptr) {
            d.release_range(ptr, bytes);
            return Ok(());
        }
        let seq = d.tick(stream);
        for p in &mut d.pools {
            if let Some(bytes) = p.live.remove(&ptr) {
                p.pending.push(PendingFree {
                    ptr,
                    bytes,
                    stream,
                    seq,
                });
                return Ok(());
            }
        }
        Err(driver_error(
            "cuMemFreeAsync",
            CUDA_ERROR_INVALID_VALUE,
            "CUDA_ERROR_INVALID_VALUE",
        ))
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuCtxSynchronize")?;
        let mut d = self.device(device, "cuCtxSynchronize")?;
        d.complete_all_streams();
        d.apply_release_threshold();
        Ok(())
    }

    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuStreamSynchronize")?;
        let mut d = self.device(device, "cuStreamSynchronize")?;
        let clock = d.streams.entry(stream).or_default();
        clock.completed = clock.submitted;
        d.retire_completed();
        Ok(())
    }

    fn event_create(&self, device: usize) -> Result<EventHandle> {
        self.take_fault(SimFault::EventCreate, "cuEventCreate")?;
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        self.device(device, "cuEventCreate")?
            .events
            .insert(id, None);
        Ok(EventHandle(id))
    }

    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::EventRecord, "cuEventRecord")?;
        let mut d = self.device(device, "cuEventRecord")?;
        let seq = d.tick(stream);
        match d.events.get_mut(&event.0) {
            Some(slot) => {
                *slot = Some((stream, seq));
                Ok(())
            }
            None => Err(driver_error(
                "cuEventRecord",
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            )),
        }
    }

    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool> {
        let d = self.device(device, "cuEventQuery")?;
        match d.events.get(&event.0) {
            Some(None) => Ok(true),
            Some(Some((stream, seq))) => {
                Ok(d.streams.get(stream).is_some_and(|c| c.completed >= *seq))
            }
            None => Err(driver_error(
                "cuEventQuery",
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            )),
        }
    }

    fn event_destroy(&self, device: usize, event: EventHandle) {
        if let Ok(mut d) = self.device(device, "cuEventDestroy") {
            d.events.remove(&event.0);
        }
    }

    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool> {
        if self.capturing_streams.load(Ordering::Relaxed) == 0 {
            return Ok(false);
        }
        Ok(self
            .device(device, "cuStreamIsCapturing")?
            .capturing
            .contains(&stream))
    }

    fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool> {
        if peer >= self.devices.len() {
            return Err(driver_error(
                "cuDeviceGet",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            ));
        }
        drop(self.device(device, "cuDeviceCanAccessPeer")?);
        Ok(peer != device && !self.peer_incapable.lock().contains(&(device, peer)))
    }

    fn pool_grant_access(&self, device: usize, pool: PoolHandle, peer: usize) -> Result<()> {
        // As CUDA: the owner's access cannot be changed, and a peer must be capable.
        if !self.can_access_peer(device, peer)? {
            return Err(driver_error(
                "cuMemPoolSetAccess",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            ));
        }
        let mut d = self.device(device, "cuMemPoolSetAccess")?;
        let peers = &mut d.pools[pool.0].peers;
        if !peers.contains(&peer) {
            peers.push(peer);
        }
        Ok(())
    }
}

impl Drop for SimDriver {
    fn drop(&mut self) {
        let leaked = self.outstanding_bytes();
        if leaked > 0 {
            let msg =
                format!("simulated driver dropped with {leaked} bytes still allocated (leak)");
            if self.strict_leak_check && !std::thread::panicking() {
                panic!("{msg}");
            }
            log::warn!("{msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stream_reuses_at_once_other_streams_after_completion() {
        let sim = SimDriver::new(1, 64 << 20).strict();
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        let a = sim.alloc_async(0, pool, 4 << 20, 1).unwrap();
        sim.free_async(0, a, 1).unwrap();
        assert_eq!(
            sim.alloc_async(0, pool, 4 << 20, 1).unwrap(),
            a,
            "own stream reuses at once"
        );
        sim.free_async(0, a, 1).unwrap();
        let b = sim.alloc_async(0, pool, 4 << 20, 2).unwrap();
        assert_ne!(
            a, b,
            "another stream must not get memory whose free has not completed"
        );
        sim.free_async(0, b, 2).unwrap();
        sim.synchronize(0).unwrap();
        assert_eq!(sim.pool_usage(0, pool).unwrap().used_bytes, 0);
    }

    #[test]
    fn capacity_limits_growth_and_trim_releases() {
        let sim = SimDriver::new(1, 8 << 20).strict();
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        sim.pool_set_attr(0, pool, PoolAttr::ReleaseThresholdBytes(u64::MAX))
            .unwrap();
        let a = sim.alloc_async(0, pool, 6 << 20, 0).unwrap();
        let err = sim.alloc_async(0, pool, 4 << 20, 0).unwrap_err();
        assert!(err.is_device_oom());
        sim.free_async(0, a, 0).unwrap();
        sim.synchronize(0).unwrap();
        assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 6 << 20);
        sim.pool_trim(0, pool, 0).unwrap();
        assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 0);
    }

    #[test]
    fn events_complete_with_their_stream() {
        let sim = SimDriver::new(1, 8 << 20);
        let e = sim.event_create(0).unwrap();
        sim.event_record(0, e, 7).unwrap();
        assert!(!sim.event_query(0, e).unwrap());
        sim.complete_stream(0, 7);
        assert!(sim.event_query(0, e).unwrap());
        sim.event_destroy(0, e);
    }

    #[test]
    #[should_panic(expected = "leak")]
    fn strict_drop_reports_leaks() {
        let sim = SimDriver::new(1, 8 << 20).strict();
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        sim.alloc_async(0, pool, 512, 0).unwrap();
    }
}

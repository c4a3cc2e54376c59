//! A simulated CUDA driver on the host: stream-ordered pools, events, capture, virtual memory and
//! fault injection, for tests and machines without a GPU (cargo feature `sim`).
//!
//! Invariants: work on a stream "completes" only when the test says so (`complete_stream`,
//! `complete_all`) or on a synchronisation; a freed block is reusable at once by its own stream,
//! by other streams only after completion; no two live allocations overlap. A *strict*
//! simulator is also a checker: misuse that a real GPU would punish silently or later (unmapping
//! memory that unfinished work still uses, mapping over a mapping, touching memory without
//! access) panics, and dropping it with memory, handles, reservations or pools left panics too
//! (leak check).

mod ipc;
mod pools;
mod streams;
mod vmm;

use super::{DeviceDriver, DevicePtr, MemInfo, PeerDriver, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::units::round_up;
use parking_lot::Mutex;
use pools::SimPool;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use vmm::SimVmm;

pub use pools::SimPoolInfo;

/// Address alignment of simulated allocations.
const ALIGN_BYTES: u64 = 512;
const CUDA_ERROR_INVALID_VALUE: i32 = 1;
const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;

/// Driver calls that can be made to fail on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimFault {
    PoolCreate,
    PoolSetAttr,
    Alloc,
    Free,
    EventCreate,
    EventRecord,
    StreamWait,
    Synchronize,
    AddressReserve,
    MemCreate,
    MemMap,
    MemUnmap,
    MemRelease,
    SetAccess,
}

#[derive(Default)]
struct StreamClock {
    submitted: u64,
    completed: u64,
}

/// Work of `stream` from its tick `from_tick` on cannot complete before `on` has: completing
/// the one completes the other.
struct StreamWait {
    stream: Stream,
    from_tick: u64,
    on: (Stream, u64),
}

#[derive(Default)]
struct SimDevice {
    pools: Vec<SimPool>,
    streams: HashMap<Stream, StreamClock>,
    /// event id -> (stream, sequence number) of its last record
    events: HashMap<usize, Option<(Stream, u64)>>,
    /// Waits between streams (`stream_wait_event`) not yet known to be satisfied.
    waits: Vec<StreamWait>,
    /// The event recorded last (for tests).
    last_recorded_event: Option<usize>,
    /// Streams the program destroyed (`destroy_stream`): calls on them fail as on a GPU.
    destroyed: Vec<Stream>,
    capturing: Vec<Stream>,
    captured_live: HashMap<DevicePtr, u64>,
    /// Pointers imported from a shareable pool (`pointer_import`), with how often.
    imported: HashMap<DevicePtr, u32>,
    vmm: SimVmm,
    /// free address ranges: start -> length; the address space is carved on demand
    free_ranges: BTreeMap<u64, u64>,
    next_addr: u64,
    sticky_error: Option<i32>,
    /// The most memory in use at once (pools' reserved, graph and physical bytes), since the
    /// device was made or `reset_in_use_high`.
    in_use_high_bytes: u64,
    /// The pools' free memory is fragmented (`fragment_pools`).
    pools_fragmented: bool,
}

pub struct SimDriver {
    memory_bytes: u64,
    devices: Vec<Mutex<SimDevice>>,
    next_event: AtomicUsize,
    capturing_streams: AtomicUsize,
    /// How many streams were destroyed (`destroy_stream`), for a lock-free fast path.
    destroyed_streams: AtomicUsize,
    faults: Mutex<HashMap<SimFault, u32>>,
    /// How many times each driver call that can fail by injection was attempted (failed ones
    /// included), over all devices.
    calls: Mutex<HashMap<&'static str, u64>>,
    strict: bool,
    /// (device, peer) pairs where `peer` cannot access `device`'s memory; all others can.
    peer_incapable: Mutex<Vec<(usize, usize)>>,
    ipc_unsupported: Mutex<Vec<usize>>,
    vmm_unsupported: Mutex<Vec<usize>>,
    /// inode of an exported pool's file descriptor -> (device, pool).
    exported_pools: Mutex<HashMap<u64, (usize, usize)>>,
    /// The clock (`now_ms`): the monotonic clock, unless a test stopped it (`u64::MAX`: running),
    /// plus what tests moved it on by.
    clock_frozen_at_us: AtomicU64,
    clock_offset_us: AtomicU64,
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
            destroyed_streams: AtomicUsize::new(0),
            faults: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
            strict: false,
            peer_incapable: Mutex::new(Vec::new()),
            ipc_unsupported: Mutex::new(Vec::new()),
            vmm_unsupported: Mutex::new(Vec::new()),
            exported_pools: Mutex::new(HashMap::new()),
            clock_frozen_at_us: AtomicU64::new(u64::MAX),
            clock_offset_us: AtomicU64::new(0),
        }
    }

    /// Stops the clock (`now_ms`): from now on it moves only by [`SimDriver::advance_clock_ms`].
    pub fn stop_clock(&self) {
        let now_us = super::monotonic_us();
        let _ = self.clock_frozen_at_us.compare_exchange(
            u64::MAX,
            now_us,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Moves the clock on by `ms`.
    pub fn advance_clock_ms(&self, ms: u64) {
        self.advance_clock_us(ms.saturating_mul(1000));
    }

    /// Moves the clock on by `us`.
    pub fn advance_clock_us(&self, us: u64) {
        self.clock_offset_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Makes misuse and leaks panic (for tests; see the module's invariants).
    pub fn strict(mut self) -> SimDriver {
        self.strict = true;
        self
    }

    /// The next `count` calls of `fault` fail.
    pub fn inject_fault(&self, fault: SimFault, count: u32) {
        *self.faults.lock().entry(fault).or_default() += count;
    }

    /// Takes one pending injection of `fault` without calling anything: true if there was one.
    pub fn take_injected(&self, fault: SimFault) -> bool {
        self.take_fault(fault, "probe").is_err()
    }

    /// How many times `call` (a driver function's name, e.g. `"cuMemSetAccess"`) was attempted,
    /// over all devices. Counted: the calls with a [`SimFault`], `cuEventQuery`, and
    /// `"cuMemSetAccess handles"` (the mappings those calls covered, summed); others read 0.
    pub fn calls(&self, call: &str) -> u64 {
        self.calls.lock().get(call).copied().unwrap_or(0)
    }

    fn count(&self, call: &'static str, n: u64) {
        *self.calls.lock().entry(call).or_default() += n;
    }

    /// All work submitted so far on `stream` completes (and the work it waited for).
    pub fn complete_stream(&self, device: usize, stream: Stream) {
        self.devices[device].lock().complete_stream(stream);
    }

    /// All work on every stream of every device completes.
    pub fn complete_all(&self) {
        for d in &self.devices {
            d.lock().complete_all_streams();
        }
    }

    /// The program destroys `stream` (`cuStreamDestroy`): work already submitted to it still
    /// completes, a capture on it ends, and every later call that names it fails with
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub fn destroy_stream(&self, device: usize, stream: Stream) {
        self.end_capture(device, stream);
        let mut d = self.devices[device].lock();
        if !d.destroyed.contains(&stream) {
            d.destroyed.push(stream);
            self.destroyed_streams.fetch_add(1, Ordering::SeqCst);
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

    /// Makes `peer` unable to access memory on `device` (as `cuDeviceCanAccessPeer` reporting 0).
    pub fn set_peer_incapable(&self, device: usize, peer: usize) {
        self.peer_incapable.lock().push((device, peer));
    }

    /// From now on every call on `device` fails with `CUDA_ERROR_ILLEGAL_ADDRESS`, as after a
    /// kernel fault: the context is unusable for the rest of the process, other devices are not.
    /// The most memory `device` had in use at once (pools' reserved bytes, graph allocations and
    /// physical handles) since it was made or [`SimDriver::reset_in_use_high`].
    pub fn in_use_high_bytes(&self, device: usize) -> u64 {
        self.devices[device].lock().in_use_high_bytes
    }

    /// Models fragmented pool memory on `device`: from now on, an allocation that does not reuse
    /// a free of its own stream grows its pool by its whole size, whatever the pool has free.
    pub fn fragment_pools(&self, device: usize) {
        self.devices[device].lock().pools_fragmented = true;
    }

    /// Restarts [`SimDriver::in_use_high_bytes`] from what `device` has in use now.
    pub fn reset_in_use_high(&self, device: usize) {
        let mut d = self.devices[device].lock();
        d.in_use_high_bytes = d.memory_in_use_bytes();
    }

    pub fn set_sticky_error(&self, device: usize) {
        self.devices[device].lock().sticky_error = Some(CUDA_ERROR_ILLEGAL_ADDRESS);
    }

    /// Work on `stream` of device `from` reads and writes `[ptr, ptr + bytes)` of `device`'s
    /// memory, as a kernel would. An error says why it may not: that memory is not allocated, or
    /// not mapped, or `from` has no access to it (a test asserts it is `Ok`).
    pub fn touch(
        &self,
        device: usize,
        from: usize,
        ptr: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let mut d = self.devices[device].lock();
        let seq = d.tick(stream);
        let outcome = match d.vmm.contains(ptr) {
            true => d.vmm.touch(ptr, bytes, from, device, (stream, seq)),
            false => d.touch_pool_memory(ptr, bytes, from, device),
        };
        outcome.map_err(|why| {
            driver_error(
                "touch",
                CUDA_ERROR_ILLEGAL_ADDRESS,
                &format!("CUDA_ERROR_ILLEGAL_ADDRESS ({why})"),
            )
        })
    }

    fn take_fault(&self, fault: SimFault, call: &'static str) -> Result<()> {
        if call != "probe" {
            self.count(call, 1);
        }
        let mut faults = self.faults.lock();
        match faults.get_mut(&fault) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(driver_error(call, 999, "CUDA_ERROR_UNKNOWN (injected)"))
            }
            _ => Ok(()),
        }
    }

    /// A call the driver would reject or a real GPU would punish: an error, or a panic if strict.
    fn misuse(&self, call: &'static str, why: String) -> Error {
        if self.strict && !std::thread::panicking() {
            panic!("simulated driver: {call}: {why}");
        }
        driver_error(
            call,
            CUDA_ERROR_INVALID_VALUE,
            &format!("CUDA_ERROR_INVALID_VALUE ({why})"),
        )
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

    fn out_of_memory(call: &'static str) -> Error {
        driver_error(call, CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY")
    }
}

impl SimDevice {
    fn tick(&mut self, stream: Stream) -> u64 {
        let clock = self.streams.entry(stream).or_default();
        clock.submitted += 1;
        clock.submitted
    }

    fn completed(&self, (stream, seq): (Stream, u64)) -> bool {
        self.streams
            .get(&stream)
            .is_some_and(|c| c.completed >= seq)
    }

    fn complete_all_streams(&mut self) {
        for clock in self.streams.values_mut() {
            clock.completed = clock.submitted;
        }
        self.waits.clear();
        self.retire_completed();
    }

    /// Everything submitted to `stream` completes, and with it what it waited for.
    fn complete_stream(&mut self, stream: Stream) {
        let to = self.streams.get(&stream).map_or(0, |c| c.submitted);
        self.complete_stream_to(stream, to);
    }

    /// `stream`'s work up to tick `to` completes, and with it what it waited for.
    fn complete_stream_to(&mut self, stream: Stream, to: u64) {
        let mut work = vec![(stream, to)];
        while let Some((s, to)) = work.pop() {
            let clock = self.streams.entry(s).or_default();
            clock.completed = clock.completed.max(to.min(clock.submitted));
            let done = clock.completed;
            self.waits
                .retain(|w| match w.stream == s && w.from_tick <= done {
                    true => {
                        work.push(w.on);
                        false
                    }
                    false => true,
                });
        }
        self.retire_completed();
    }

    /// Bytes of device memory in use: pools' reservations, graph memory, physical handles.
    /// Keeps the high-water mark of memory in use; called where it can grow.
    fn note_in_use(&mut self) {
        self.in_use_high_bytes = self.in_use_high_bytes.max(self.memory_in_use_bytes());
    }

    fn memory_in_use_bytes(&self) -> u64 {
        self.pools.iter().map(|p| p.reserved_bytes).sum::<u64>()
            + self.captured_live.values().sum::<u64>()
            + self.vmm.physical_bytes()
    }

    /// `bytes` (rounded to 512) of fresh address space.
    fn claim_range(&mut self, bytes: u64) -> Option<DevicePtr> {
        let bytes = round_up(bytes, ALIGN_BYTES)?;
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
                Some(DevicePtr(addr))
            }
            None => {
                let addr = self.next_addr;
                self.next_addr = addr.checked_add(bytes)?;
                Some(DevicePtr(addr))
            }
        }
    }

    fn release_range(&mut self, addr: DevicePtr, bytes: u64) {
        let mut start = addr.0;
        let mut len = round_up(bytes, ALIGN_BYTES).expect("a range that was claimed");
        if let Some((&prev, &prev_len)) = self.free_ranges.range(..start).next_back() {
            if prev + prev_len == start {
                self.free_ranges.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.free_ranges.remove(&(start + len)) {
            len += next_len;
        }
        self.free_ranges.insert(start, len);
    }

    /// Pool memory and graph memory: allocated, and accessible from `from`.
    fn touch_pool_memory(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        from: usize,
        device: usize,
    ) -> std::result::Result<(), String> {
        if self.captured_live.contains_key(&ptr) || self.imported.contains_key(&ptr) {
            return Ok(());
        }
        let pool = self.pools.iter().find(|p| p.holds(ptr, bytes));
        match pool {
            None => Err(format!(
                "{ptr:#x}+{bytes} is not allocated on device {device}"
            )),
            Some(p) if from != device && !p.peers.contains(&from) => Err(format!(
                "device {from} has no access to device {device}'s pool memory at {ptr:#x}"
            )),
            Some(_) => Ok(()),
        }
    }
}

fn driver_error(call: &'static str, code: i32, name: &str) -> Error {
    Error::Driver {
        call,
        code,
        name: name.to_string(),
    }
}

impl DeviceDriver for SimDriver {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn now_us(&self) -> u64 {
        let offset_us = self.clock_offset_us.load(Ordering::Relaxed);
        match self.clock_frozen_at_us.load(Ordering::Relaxed) {
            u64::MAX => super::monotonic_us() + offset_us,
            frozen_us => frozen_us + offset_us,
        }
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo> {
        let d = self.device(device, "cuMemGetInfo")?;
        Ok(MemInfo {
            free_bytes: self.memory_bytes.saturating_sub(d.memory_in_use_bytes()),
            total_bytes: self.memory_bytes,
        })
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuCtxSynchronize")?;
        let mut d = self.device(device, "cuCtxSynchronize")?;
        d.complete_all_streams();
        d.apply_release_threshold();
        Ok(())
    }
}

impl PeerDriver for SimDriver {
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

    fn pool_grant_access(&self, device: usize, pool: super::PoolHandle, peer: usize) -> Result<()> {
        // As CUDA: the owner's access cannot be changed, and a peer must be capable.
        if !self.can_access_peer(device, peer)? {
            return Err(driver_error(
                "cuMemPoolSetAccess",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            ));
        }
        let mut d = self.device(device, "cuMemPoolSetAccess")?;
        let peers = &mut pools::get_mut(&mut d, pool, "cuMemPoolSetAccess")?.peers;
        if !peers.contains(&peer) {
            peers.push(peer);
        }
        Ok(())
    }
}

impl Drop for SimDriver {
    fn drop(&mut self) {
        let mut leaks = Vec::new();
        let outstanding = self.outstanding_bytes();
        if outstanding > 0 {
            leaks.push(format!("{outstanding} bytes still allocated"));
        }
        for (i, d) in self.devices.iter().enumerate() {
            let d = d.lock();
            let pools = d.pools.iter().filter(|p| !p.destroyed).count();
            if pools > 0 {
                leaks.push(format!("device {i}: {pools} pools not destroyed"));
            }
            leaks.extend(
                d.vmm
                    .leaks()
                    .into_iter()
                    .map(|l| format!("device {i}: {l}")),
            );
        }
        if !leaks.is_empty() {
            let msg = format!("simulated driver dropped with {} (leak)", leaks.join(", "));
            if self.strict && !std::thread::panicking() {
                panic!("{msg}");
            }
            log::warn!("{msg}");
        }
    }
}

#[cfg(test)]
mod tests;

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

mod controls;
mod device;
mod ipc;
mod managed;
mod peers;
mod pools;
mod races;
mod streams;
mod vmm;

use super::{DeviceDriver, DevicePtr, MemInfo, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::units::round_up;
use parking_lot::Mutex;
use pools::SimPool;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use vmm::SimVmm;

pub use controls::CallHook;
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
    /// Both `cuCtxSynchronize` and `cuStreamSynchronize`.
    Synchronize,
    /// A wait for one stream's work: `cuStreamSynchronize` and `cuEventSynchronize` (not the
    /// device's).
    StreamSynchronize,
    AddressReserve,
    MemCreate,
    MemMap,
    MemUnmap,
    MemRelease,
    SetAccess,
    HostAlloc,
    Copy,
    MemExport,
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
    /// Waits between streams (`stream_wait_event`) not yet known to be satisfied: also what
    /// each stream's work is ordered after ([`device::ordered_after`]).
    waits: Vec<StreamWait>,
    /// The event recorded last (for tests).
    last_recorded_event: Option<usize>,
    /// Streams the program destroyed (`destroy_stream`): calls on them fail as on a GPU.
    destroyed: Vec<Stream>,
    capturing: Vec<Stream>,
    captured_live: HashMap<DevicePtr, u64>,
    /// Graph memory freed and not yet known to be done with (`free_async`): device memory still.
    captured_pending: Vec<pools::PendingFree>,
    /// Pool blocks allocated on a stream while it captured (a graph's allocations: the graph
    /// may free them on a capturing stream).
    pool_blocks_of_captures: std::collections::HashSet<DevicePtr>,
    /// Pointers imported from a shareable pool (`pointer_import`), with how often.
    imported: HashMap<DevicePtr, u32>,
    vmm: SimVmm,
    /// free address ranges: start -> length; the address space is carved on demand
    free_ranges: BTreeMap<u64, u64>,
    next_addr: u64,
    /// The end of the device's window of addresses (the next device's begins there): a claim
    /// past it fails, as an exhausted address space does.
    addr_end: u64,
    sticky_error: Option<i32>,
    /// The most memory in use at once (pools' reserved, graph and physical bytes), since the
    /// device was made or `reset_in_use_high`.
    in_use_high_bytes: u64,
    /// The pools' free memory is fragmented (`fragment_pools`).
    pools_fragmented: bool,
    /// Pools learn of completed frees only at a synchronisation (`pools_apply_frees_at_sync`).
    frees_applied_at_sync: bool,
    /// Work completes as it is submitted (`gpu_keeps_up`).
    keeps_up: bool,
    /// Unfinished uses of memory, for the race check (`check_races`).
    touches: races::Touches,
    /// Managed memory (`mem_alloc_managed`).
    managed: managed::SimManaged,
}

pub struct SimDriver {
    memory_bytes: u64,
    devices: Vec<Mutex<SimDevice>>,
    next_event: AtomicUsize,
    capturing_streams: AtomicUsize,
    /// How many streams were destroyed (`destroy_stream`), for a lock-free fast path.
    destroyed_streams: AtomicUsize,
    /// Per fault: calls still to succeed before the injected failures, and how many fail.
    faults: Mutex<HashMap<SimFault, (u32, u32)>>,
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
    /// inode of an exported handle's file descriptor -> (device, handle).
    exported_handles: Mutex<HashMap<u64, (usize, usize)>>,
    /// The clock (`now_ms`): the monotonic clock, unless a test stopped it (`u64::MAX`: running),
    /// plus what tests moved it on by.
    clock_frozen_at_us: AtomicU64,
    clock_offset_us: AtomicU64,
    /// Tests' code to run when a call that can fail by injection is made ([`CallHook`]).
    hooks: Mutex<Vec<CallHook>>,
}

thread_local! {
    /// How deep this thread is in `relaxed_capture`.
    static RELAXED_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with this thread's capture mode relaxed (the simulator's `relaxed_capture`).
pub(super) fn in_relaxed_mode<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            RELAXED_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    RELAXED_DEPTH.with(|d| d.set(d.get() + 1));
    let _restore = Restore;
    f()
}

/// Where the simulated devices' addresses begin, and the least window of them each device has
/// (16 TiB): a device's memory fits in its window sixteen times, so that the virtual-memory
/// resource's reservations (twice the memory up front, more as it grows) stay inside it; a
/// claim past the window fails, as an exhausted address space does. (A device of more than
/// [`crate::config::SIM_MAX_MEMORY_BYTES`], which only a test makes, has a larger window; past
/// 64 bits, one device alone has addresses.)
const SIM_ADDR_BASE: u64 = 0x7f00_0000_0000;
const SIM_ADDR_WINDOW_BYTES: u64 = 1 << 44;
const _: () = assert!(SIM_ADDR_WINDOW_BYTES >= 16 * crate::config::SIM_MAX_MEMORY_BYTES);

/// Each device's window of addresses, for devices of `memory_bytes`.
fn addr_window_bytes(memory_bytes: u64) -> u64 {
    let wanted = memory_bytes.saturating_mul(16).checked_next_power_of_two();
    wanted.unwrap_or(u64::MAX).max(SIM_ADDR_WINDOW_BYTES)
}

impl SimDriver {
    /// A call that a capture in global mode forbids (a query, a synchronisation, a mapping):
    /// made while a stream of the device captures and this thread's mode is not relaxed, it is
    /// counted as `"unsafe during capture"` (on a GPU it would invalidate the capture).
    fn check_capture_mode(&self, d: &SimDevice, call: &'static str) {
        if !d.capturing.is_empty() && RELAXED_DEPTH.with(|r| r.get()) == 0 {
            log::debug!("simulated driver: {call} during a capture, outside relaxed mode");
            self.count("unsafe during capture", 1);
        }
    }

    /// `device_count` simulated devices of `memory_bytes` each.
    pub fn new(device_count: usize, memory_bytes: u64) -> SimDriver {
        let window_bytes = addr_window_bytes(memory_bytes);
        let devices = (0..device_count)
            .map(|d| {
                let base = SIM_ADDR_BASE.saturating_add((d as u64).saturating_mul(window_bytes));
                Mutex::new(SimDevice {
                    next_addr: base,
                    addr_end: base.saturating_add(window_bytes),
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
            exported_handles: Mutex::new(HashMap::new()),
            clock_frozen_at_us: AtomicU64::new(u64::MAX),
            clock_offset_us: AtomicU64::new(0),
            hooks: Mutex::new(Vec::new()),
        }
    }

    fn count(&self, call: &'static str, n: u64) {
        *self.calls.lock().entry(call).or_default() += n;
    }

    fn take_fault(&self, fault: SimFault, call: &'static str) -> Result<()> {
        if call != "probe" {
            self.count(call, 1);
        }
        let hooks: Vec<CallHook> = (self.hooks.lock().iter())
            .filter(|(name, _)| *name == call)
            .cloned()
            .collect();
        for (_, f) in hooks {
            f();
        }
        let mut faults = self.faults.lock();
        match faults.get_mut(&fault) {
            Some((ok_calls, n)) if *n > 0 && *ok_calls > 0 && call != "probe" => {
                *ok_calls -= 1;
                Ok(())
            }
            Some((_, n)) if *n > 0 => {
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
        self.count("cuMemGetInfo", 1);
        let d = self.device(device, "cuMemGetInfo")?;
        self.check_capture_mode(&d, "cuMemGetInfo");
        Ok(MemInfo {
            free_bytes: self.memory_bytes.saturating_sub(d.memory_in_use_bytes()),
            total_bytes: self.memory_bytes,
        })
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        self.take_fault(SimFault::Synchronize, "cuCtxSynchronize")?;
        let mut d = self.device(device, "cuCtxSynchronize")?;
        // Whatever this thread's mode: a device synchronisation waits for the capturing stream
        // too, which breaks its capture (relaxed mode permits the call, not the wait).
        if !d.capturing.is_empty() {
            log::debug!("simulated driver: cuCtxSynchronize during a capture");
            self.count("unsafe during capture", 1);
        }
        d.complete_all_streams();
        d.retire_completed();
        d.apply_release_threshold();
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

//! Drives the allocator on the simulated driver with arbitrary operation sequences and checks it
//! against a reference model after every step.
//!
//! Run with `scripts/fuzz [seconds]` (see docs/reliability.md).
//!
//! Checked after every operation:
//! - live blocks of one device never overlap, pointers are 512-byte aligned;
//! - `allocated_bytes`, `allocations_current`, their peaks, `num_allocs`, `num_frees`,
//!   `allocated_bytes_total`, `freed_bytes_total` and `memory_limit_bytes` equal the model's;
//! - `active_bytes >= allocated_bytes`, `pool_used_bytes >= live pool bytes + cached_bytes`,
//!   `reserved_bytes >= pool_used_bytes`, `cached_bytes <=` the 64 MiB cache budget;
//! - after a malloc served by the pool under `set_memory_fraction`, the bytes held stay under the cap;
//! - sizes span the whole 64-bit range: 0 gives NULL and changes nothing, above
//!   `MAX_ALLOCATION_BYTES` is out of memory ("CUDA out of memory. Tried to allocate ..., which is
//!   larger than streampool's maximum ...") that changes no statistic but `num_ooms` (+1), at or
//!   below it but beyond the device is out of memory; freeing NULL does nothing;
//! - every error is the expected kind: invalid arguments and unknown pointers exactly when the
//!   model says so, out of memory only as "CUDA out of memory. ...", an injected driver error only
//!   when an injected fault fired during that very operation, nothing else;
//! - a rejected call (invalid argument, unknown pointer) changes no statistic of any device;
//! - stream safety: a freed block is handed out again on stream X only once every other stream
//!   that used it (its allocation stream and record_stream streams) has completed the work it had
//!   when the block was freed, or X has waited on the GPU for that work (checked with the
//!   harness's own simulated events).
//! - blocks allocated inside a shareable scope export, others are refused as "not in a shareable
//!   pool" without changing a statistic; an export imports, closes and releases cleanly; the
//!   shareable pool's used bytes cover its live blocks, and its blocks never reach the cache;
//! - with the memory timeline on, the newest event's allocated-bytes gauge equals the statistics;
//! - sleep and wake (sleep.rs): refusals change nothing, a sleeping device refuses allocations,
//!   and after a wake every live block can be used again; a device refuses to sleep while an
//!   export of a live block's pages is held (ipc.rs).
//!
//! - every new block can be used on its stream (the simulator's `touch`: allocated, and with
//!   `STREAMPOOL_BACKEND=vmm` mapped with access for the device).
//!
//! Each run picks the backend of large blocks (the pool or the vmm backend) from its first byte.
//! At the end (finish.rs): captures end, devices wake, held exports are released, everything is
//! freed, streams complete, the cache is emptied, and the simulator must hold no memory
//! (`outstanding_bytes() == 0`, nothing mapped).
//!
//! Bugs this harness found are fixed and kept as plain tests in tests/fuzz_regressions.rs
//! (docs/reliability.md); nothing is excused.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, EventHandle, Stream};
use streampool::ipc::{begin_shareable, end_shareable};
use streampool::{Allocator, Config, Error, StreampoolStats, MAX_ALLOCATION_BYTES};

const DEVICES: usize = 2;
const MIB: u64 = 1 << 20;
const MEMORY_BYTES: u64 = 64 * MIB;
const CACHE_LIMIT_BYTES: u64 = 64 * MIB; // Config::default()
const MAX_OPS: usize = 300;
const STREAMS: [Stream; 4] = [Stream(0), Stream(1), Stream(2), Stream(7)];
const SIM_BASE: u64 = 0x7f00_0000_0000;
const INJECTED_CODE: i32 = 999;

#[path = "allocator_ops/checks.rs"]
mod checks;
#[path = "allocator_ops/finish.rs"]
mod finish;
#[path = "allocator_ops/input.rs"]
mod input;
#[path = "allocator_ops/ipc.rs"]
mod ipc;
#[path = "allocator_ops/outcome.rs"]
mod outcome;
#[path = "allocator_ops/sleep.rs"]
mod sleep;
use input::{FreeTarget, Op, Run, FAULTS};
use outcome::{Expect, Outcome};

#[derive(Debug, Clone)]
struct Block {
    bytes: u64,
    stream: Stream,
    captured: bool,
    /// From the shareable pool.
    shareable: bool,
    recorded: Vec<Stream>,
    /// Which allocation this is (a later block at the same address has another).
    id: u64,
}

/// A freed block's range and, per stream that used it, a harness event recorded just before the
/// free: the block may be reused on stream X once the events of all streams other than X are done.
struct Quarantine {
    device: usize,
    start: u64,
    end: u64,
    waits: Vec<(Stream, EventHandle)>,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    allocs: u64,
    frees: u64,
    bytes_total: u64,
    freed_total: u64,
    peak_bytes: u64,
    peak_count: u64,
    limit: Option<u64>,
}

struct Harness {
    sim: Arc<SimDriver>,
    alloc: Allocator,
    live: BTreeMap<(usize, DevicePtr), Block>,
    counts: [Counts; DEVICES],
    capturing: Vec<(usize, Stream)>,
    last_freed: Option<(usize, DevicePtr)>,
    quarantine: Vec<Quarantine>,
    /// Faults injected and not yet consumed, per kind (index into FAULTS).
    pending_faults: [u32; FAULTS.len()],
    history_on: bool,
    /// Devices asleep (streampool.sleep() without its wake()).
    asleep: [bool; DEVICES],
    /// The vmm backend (else the pool's, which refuses to sleep).
    vmm: bool,
    /// Page exports not released: (device, block, its id, event).
    page_exports: Vec<(usize, DevicePtr, u64, u64)>,
    next_id: u64,
}

fn is_injected(e: &Error) -> bool {
    matches!(
        e,
        Error::Driver {
            code: INJECTED_CODE,
            ..
        }
    )
}

fn is_oom(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory(_)) && e.to_string().starts_with("CUDA out of memory.")
}

fn device_ok(d: i64) -> Option<usize> {
    usize::try_from(d).ok().filter(|d| *d < DEVICES)
}

impl Harness {
    fn new(vmm: bool) -> Harness {
        // Strict: misuse of the driver (an unmap under unfinished work, a map over a mapping) panics.
        let sim = Arc::new(SimDriver::new(DEVICES, MEMORY_BYTES).strict());
        let config = match vmm {
            false => Config {
                backend: Backend::Pool,
                ..Config::default()
            },
            true => Config {
                backend: Backend::Vmm,
                background: false,
                ..Config::default()
            },
        };
        let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config)
            .expect("allocator over the simulator");
        Harness {
            sim,
            alloc,
            live: BTreeMap::new(),
            counts: [Counts::default(); DEVICES],
            capturing: Vec::new(),
            last_freed: None,
            quarantine: Vec::new(),
            pending_faults: [0; FAULTS.len()],
            history_on: false,
            asleep: [false; DEVICES],
            vmm,
            page_exports: Vec::new(),
            next_id: 0,
        }
    }

    fn all_stats(&self) -> [StreampoolStats; DEVICES] {
        [0, 1].map(|d| {
            self.alloc
                .device(d)
                .and_then(|dev| dev.stats())
                .expect("stats of a valid device")
        })
    }

    /// Takes every pending fault out of the simulator; returns how many of each there were.
    fn drain_faults(&self) -> [u32; FAULTS.len()] {
        let mut left = [0; FAULTS.len()];
        for (i, f) in FAULTS.iter().enumerate() {
            while f.probe(&self.sim) {
                left[i] += 1;
            }
        }
        left
    }

    fn reinject(&self, left: [u32; FAULTS.len()]) {
        for (i, f) in FAULTS.iter().enumerate() {
            if left[i] > 0 {
                self.sim.inject_fault(f.sim(), left[i]);
            }
        }
    }

    fn live_nth(&self, pick: u16) -> Option<(usize, DevicePtr)> {
        if self.live.is_empty() {
            return None;
        }
        self.live
            .keys()
            .nth(usize::from(pick) % self.live.len())
            .copied()
    }

    fn is_capturing(&self, device: usize, stream: Stream) -> bool {
        self.capturing.contains(&(device, stream))
    }

    fn live_on(&self, device: usize) -> impl Iterator<Item = (&DevicePtr, &Block)> {
        self.live
            .range((device, DevicePtr(0))..=(device, DevicePtr(u64::MAX)))
            .map(|((_, p), b)| (p, b))
    }

    fn step(&mut self, op: Op) {
        let before = self.all_stats();
        let hits_before = [before[0].num_cache_hits, before[1].num_cache_hits];
        // Ok(()) or the error, plus what the model expects of an error: `Rejected` errors must be
        // the named kind and leave every statistic as it was.
        let outcome: Outcome = match op {
            Op::Malloc {
                size,
                device,
                stream,
            } => self.malloc(size.bytes(), device.index(), stream.stream()),
            Op::MallocShareable {
                size,
                device,
                stream,
            } => {
                begin_shareable().expect("a shallow scope");
                let outcome = self.malloc(size.bytes(), device.index(), stream.stream());
                end_shareable().expect("matched scope");
                match outcome {
                    Outcome::Malloc {
                        result,
                        device,
                        bytes,
                        stream,
                    } => Outcome::MallocShareable {
                        result,
                        device,
                        bytes,
                        stream,
                    },
                    other => other,
                }
            }
            Op::ExportImport { pick, stream } => match self.live_nth(pick) {
                Some((d, p)) => self.export_import(d, p, stream.stream()),
                None => Outcome::None,
            },
            Op::ExportPages { pick, stream } => match self.live_nth(pick) {
                Some((d, p)) => self.export_pages(d, p, stream.stream()),
                None => Outcome::None,
            },
            Op::ReleaseExport { pick } => self.release_page_export(pick),
            Op::RecordHistory { on } => {
                self.history_on = on;
                Outcome::MustSucceed(self.alloc.record_history(on, 64))
            }
            Op::Free(target) => self.free(target),
            Op::RecordStream { pick, stream } => match self.live_nth(pick) {
                Some((d, p)) => {
                    let s = stream.stream();
                    let r = self.alloc.record_stream(p, s);
                    let b = self.live.get_mut(&(d, p)).expect("picked live");
                    if r.is_ok() && s != b.stream && !b.recorded.contains(&s) {
                        b.recorded.push(s);
                    }
                    Outcome::MustSucceed(r)
                }
                None => Outcome::None,
            },
            Op::RecordStreamUnknown { offset, stream } => {
                let addr = DevicePtr(SIM_BASE + u64::from(offset) * 512);
                let live = (0..DEVICES).find(|d| self.live.contains_key(&(*d, addr)));
                let r = self.alloc.record_stream(addr, stream.stream());
                match live {
                    Some(d) => {
                        let s = stream.stream();
                        let b = self.live.get_mut(&(d, addr)).expect("live");
                        if r.is_ok() && s != b.stream && !b.recorded.contains(&s) {
                            b.recorded.push(s);
                        }
                        Outcome::MustSucceed(r)
                    }
                    None => Outcome::Rejected(r, Expect::UnknownPointer),
                }
            }
            Op::EmptyCache => Outcome::MustSucceed(self.alloc.empty_cache()),
            Op::SetReleaseThreshold { device, bytes } => {
                let d = device.index();
                let r =
                    (self.alloc.device(d)).and_then(|dev| dev.set_release_threshold(bytes.value()));
                match device_ok(d) {
                    Some(_) => Outcome::MustSucceed(r),
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                }
            }
            Op::Trim { device, keep } => {
                let d = device.index();
                let r = self.alloc.device(d).and_then(|dev| dev.trim(keep.value()));
                match device_ok(d) {
                    Some(_) => Outcome::MustSucceed(r),
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                }
            }
            Op::SetMemoryFraction { device, fraction } => {
                let d = device.index();
                let f = fraction.value();
                let r = self
                    .alloc
                    .device(d)
                    .and_then(|dev| dev.set_memory_fraction(f));
                match device_ok(d) {
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                    Some(di) if (0.0..=1.0).contains(&f) => {
                        self.counts[di].limit = Some((MEMORY_BYTES as f64 * f) as u64);
                        Outcome::MustSucceed(r)
                    }
                    Some(_) => Outcome::Rejected(r, Expect::Invalid("memory fraction")),
                }
            }
            Op::ResetPeaks { device } => {
                let d = device.index();
                let r = self.alloc.device(d).and_then(|dev| dev.reset_peak_stats());
                match device_ok(d) {
                    Some(di) => {
                        let (bytes, count) = self.current(di);
                        self.counts[di].peak_bytes = bytes;
                        self.counts[di].peak_count = count;
                        Outcome::MustSucceed(r)
                    }
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                }
            }
            Op::CompleteStream { device, stream } => {
                self.sim.complete_stream(device.index(), stream.stream());
                Outcome::None
            }
            Op::CompleteAll => {
                self.sim.complete_all();
                Outcome::None
            }
            Op::BeginCapture { device, stream } => {
                let (d, s) = (device.index(), stream.stream());
                // CUDA refuses to capture the legacy stream (the simulator too): nothing begins.
                if s != Stream::LEGACY && !self.is_capturing(d, s) {
                    self.sim.begin_capture(d, s);
                    self.capturing.push((d, s));
                }
                Outcome::None
            }
            Op::EndCapture { pick } => {
                if !self.capturing.is_empty() {
                    let (d, s) = self
                        .capturing
                        .remove(usize::from(pick) % self.capturing.len());
                    self.sim.end_capture(d, s);
                }
                Outcome::None
            }
            Op::InjectFault(f) => {
                self.sim.inject_fault(f.sim(), 1);
                self.pending_faults[FAULTS.iter().position(|x| *x == f).unwrap()] += 1;
                Outcome::None
            }
            Op::Sleep { device, level } => self.sleep(device.index(), level),
            Op::Wake { device } => self.wake(device.index()),
        };

        self.judge(op, outcome, before, hits_before);
    }

    fn malloc(&mut self, bytes: u64, device: i64, stream: Stream) -> Outcome {
        let r = self.alloc.malloc(bytes, device, stream);
        match device_ok(device) {
            None => Outcome::Rejected(r.map(drop), Expect::BadDevice(device)),
            Some(_) if bytes == 0 => Outcome::Unchanged(r.map(|p| match p {
                DevicePtr::NULL => (),
                p => panic!("malloc(0) gave {p:#x}, not NULL"),
            })),
            Some(d) if bytes > MAX_ALLOCATION_BYTES => Outcome::AboveMaximum {
                result: r.map(drop),
                device: d,
            },
            Some(d) if self.asleep[d] => Outcome::Rejected(r.map(drop), Expect::Invalid("asleep")),
            Some(d) => Outcome::Malloc {
                result: r,
                device: d,
                bytes,
                stream,
            },
        }
    }

    fn free(&mut self, target: FreeTarget) -> Outcome {
        let (addr, device): (DevicePtr, i64) = match target {
            FreeTarget::Live(pick) => match self.live_nth(pick) {
                Some((d, p)) => (p, d as i64),
                None => return Outcome::None,
            },
            FreeTarget::LiveOn(pick, dev) => match self.live_nth(pick) {
                Some((_, p)) => (p, dev.index()),
                None => return Outcome::None,
            },
            FreeTarget::Null(dev) => (DevicePtr::NULL, dev.index()),
            FreeTarget::Unknown(offset, dev) => {
                let d = dev.index().clamp(0, 1) as u64;
                let addr = SIM_BASE + (d << 44) + u64::from(offset) * 512;
                (DevicePtr(addr), dev.index())
            }
            FreeTarget::Interior(pick) => match self.live_nth(pick) {
                Some((d, p)) => (p.offset(512), d as i64),
                None => return Outcome::None,
            },
            FreeTarget::DoubleFree => match self.last_freed {
                Some((d, p)) => (p, d as i64),
                None => return Outcome::None,
            },
        };
        let Some(d) = device_ok(device) else {
            return Outcome::Rejected(self.alloc.free(addr, device), Expect::BadDevice(device));
        };
        if addr == DevicePtr::NULL {
            return Outcome::Unchanged(self.alloc.free(addr, device));
        }
        match self.live.get(&(d, addr)).cloned() {
            None => Outcome::Rejected(self.alloc.free(addr, device), Expect::UnknownPointer),
            Some(block) => {
                self.quarantine_before_free(d, addr, &block);
                let r = self.alloc.free(addr, device);
                // The block is gone whatever the driver said afterwards: counted as freed.
                self.live.remove(&(d, addr));
                self.last_freed = Some((d, addr));
                let c = &mut self.counts[d];
                c.frees += 1;
                c.freed_total += block.bytes;
                Outcome::MustSucceed(r)
            }
        }
    }
}

fuzz_target!(|run: Run| {
    let mut h = Harness::new(run.vmm);
    for op in run.ops.into_iter().take(MAX_OPS) {
        h.step(op);
    }
    h.finish();
});

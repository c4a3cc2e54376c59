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
//!   `MAX_ALLOCATION_BYTES` is an invalid argument that changes nothing, below it but beyond the
//!   device is out of memory; freeing NULL does nothing;
//! - every error is the expected kind: invalid arguments and unknown pointers exactly when the
//!   model says so, out of memory only as "CUDA out of memory. ...", an injected driver error only
//!   when an injected fault fired during that very operation, nothing else;
//! - a rejected call (invalid argument, unknown pointer) changes no statistic of any device;
//! - stream safety: a freed block is handed out again on stream X only once every other stream
//!   that used it (its allocation stream and record_stream streams) has completed the work it had
//!   when the block was freed (checked with the harness's own simulated events).
//! - blocks allocated inside a shareable scope export, others are refused as "not in a shareable
//!   pool" without changing a statistic; an export imports, closes and releases cleanly; the
//!   shareable pool's used bytes cover its live blocks, and its blocks never reach the cache;
//! - with the memory timeline on, the newest event's allocated-bytes gauge equals the statistics.
//!
//! At the end: captures end, everything is freed, streams complete, the cache is emptied, and the
//! simulator must hold no memory (`outstanding_bytes() == 0`).
//!
//! Bugs this harness found are fixed and kept as plain tests in tests/fuzz_regressions.rs
//! (docs/reliability.md); nothing is excused.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::Arc;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, EventHandle, Stream, StreamDriver};
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

#[path = "allocator_ops/input.rs"]
mod input;
use input::{FreeTarget, Op, FAULTS};

#[derive(Debug, Clone)]
struct Block {
    bytes: u64,
    stream: Stream,
    captured: bool,
    /// From the shareable pool.
    shareable: bool,
    recorded: Vec<Stream>,
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
    fn new() -> Harness {
        let sim = Arc::new(SimDriver::new(DEVICES, MEMORY_BYTES));
        let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, Config::default())
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
        }
    }

    fn all_stats(&self) -> [StreampoolStats; DEVICES] {
        [0, 1].map(|d| self.alloc.stats(d).expect("stats of a valid device"))
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

    /// Records harness events on every stream that used `block` (faults set aside meanwhile).
    fn quarantine_before_free(&mut self, device: usize, ptr: DevicePtr, block: &Block) {
        if block.captured {
            return; // graph memory: freed straight to the driver, outside the cache's rules
        }
        let left = self.drain_faults();
        let mut waits = Vec::new();
        for s in std::iter::once(block.stream).chain(block.recorded.iter().copied()) {
            let e = self.sim.event_create(device).expect("harness event");
            self.sim
                .event_record(device, e, s)
                .expect("harness event record");
            waits.push((s, e));
        }
        self.reinject(left);
        self.quarantine.push(Quarantine {
            device,
            start: ptr.0,
            end: ptr.0 + block.bytes,
            waits,
        });
    }

    fn event_done(&self, device: usize, e: EventHandle) -> bool {
        self.sim
            .event_query(device, e)
            .expect("harness event query")
    }

    fn prune_quarantine(&mut self) {
        let sim = &self.sim;
        self.quarantine.retain(|q| {
            let done = q
                .waits
                .iter()
                .all(|(_, e)| sim.event_query(q.device, *e).expect("harness event query"));
            if done {
                for (_, e) in &q.waits {
                    sim.event_destroy(q.device, *e);
                }
            }
            !done
        });
    }

    fn check_new_block(&self, device: usize, ptr: DevicePtr, bytes: u64, stream: Stream) {
        assert_eq!(ptr.0 % 512, 0, "pointer {ptr:#x} is not 512-byte aligned");
        let end = ptr.0 + bytes;
        if let Some(((d, p), b)) = self.live.range(..=(device, ptr)).next_back() {
            if *d == device && p.0 + b.bytes > ptr.0 {
                panic!(
                    "device {device}: new block {ptr:#x}+{bytes} overlaps live block {p:#x}+{}",
                    b.bytes
                );
            }
        }
        if let Some(((d, p), b)) = self.live.range((device, ptr)..).next() {
            if *d == device && p.0 < end {
                panic!(
                    "device {device}: new block {ptr:#x}+{bytes} overlaps live block {p:#x}+{}",
                    b.bytes
                );
            }
        }
        for q in &self.quarantine {
            if q.device != device || q.end <= ptr.0 || end <= q.start {
                continue;
            }
            for (s, e) in &q.waits {
                if *s != stream && !self.event_done(device, *e) {
                    panic!(
                        "device {device}: block {ptr:#x}+{bytes} handed to stream {stream:#x} overlaps \
                         freed block {:#x}..{:#x} that stream {s:#x} may still be using",
                        q.start, q.end
                    );
                }
            }
        }
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
                begin_shareable();
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
                let r = self.alloc.set_release_threshold(d, bytes.value());
                match device_ok(d) {
                    Some(_) => Outcome::MustSucceed(r),
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                }
            }
            Op::Trim { device, keep } => {
                let d = device.index();
                let r = self.alloc.trim(d, keep.value());
                match device_ok(d) {
                    Some(_) => Outcome::MustSucceed(r),
                    None => Outcome::Rejected(r, Expect::BadDevice(d)),
                }
            }
            Op::SetMemoryFraction { device, fraction } => {
                let d = device.index();
                let f = fraction.value();
                let r = self.alloc.set_memory_fraction(d, f);
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
                let r = self.alloc.reset_peak_stats(d);
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
                if !self.is_capturing(d, s) {
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
        };

        // Which injected faults fired during this operation.
        let left = self.drain_faults();
        let mut fired = false;
        for (now, before) in left.iter().zip(&self.pending_faults) {
            assert!(now <= before, "faults appeared");
            fired |= now < before;
        }
        self.reinject(left);
        self.pending_faults = left;

        let after = self.all_stats();
        let outcome_kind = match &outcome {
            Outcome::MallocShareable { .. } => OutcomeKind::MallocShareable,
            _ => OutcomeKind::Other,
        };
        match outcome {
            Outcome::None => {}
            Outcome::MustSucceed(r) => {
                if let Err(e) = r {
                    assert!(
                        fired && is_injected(&e),
                        "{op:?} failed unexpectedly: {e} ({e:?})"
                    );
                }
            }
            Outcome::Unchanged(r) => {
                if let Err(e) = r {
                    panic!("{op:?} failed: {e} ({e:?}); expected success without effect");
                }
                assert_eq!(before, after, "{op:?} must change no statistic");
            }
            Outcome::Rejected(r, want) => {
                let e = match r {
                    Ok(()) => panic!("{op:?} was accepted; expected {want:?}"),
                    Err(e) => e,
                };
                let ok = match want {
                    Expect::UnknownPointer => matches!(e, Error::UnknownPointer { .. }),
                    Expect::BadDevice(d) => {
                        matches!(&e, Error::InvalidArgument(m)
                            if m.contains(&format!("device index {d} is out of range")))
                    }
                    Expect::Invalid(text) => {
                        matches!(&e, Error::InvalidArgument(m) if m.contains(text))
                    }
                };
                assert!(ok, "{op:?}: expected {want:?}, got {e} ({e:?})");
                assert_eq!(
                    before, after,
                    "{op:?} was rejected ({e}) but changed statistics"
                );
            }
            Outcome::Malloc {
                result,
                device,
                bytes,
                stream,
            }
            | Outcome::MallocShareable {
                result,
                device,
                bytes,
                stream,
            } => {
                let shareable_scope = matches!(outcome_kind, OutcomeKind::MallocShareable);
                match result {
                    Ok(ptr) => {
                        let d = device;
                        let captured = self.is_capturing(d, stream);
                        self.check_new_block(d, ptr, bytes, stream);
                        self.live.insert(
                            (d, ptr),
                            Block {
                                bytes,
                                stream,
                                captured,
                                shareable: shareable_scope && !captured,
                                recorded: Vec::new(),
                            },
                        );
                        let (cur, n) = self.current(d);
                        let pool_live = self.pool_live_bytes(d);
                        let c = &mut self.counts[d];
                        c.allocs += 1;
                        c.bytes_total += bytes;
                        c.peak_bytes = c.peak_bytes.max(cur);
                        c.peak_count = c.peak_count.max(n);
                        // A block from the pool (not the cache, not a graph) must fit under the cap.
                        if let (Some(limit), false) = (c.limit, captured) {
                            if after[d].num_cache_hits == hits_before[d] {
                                let held = pool_live + after[d].cached_bytes;
                                assert!(
                                    held <= limit,
                                    "device {d}: {held} B held after a pool allocation, over the \
                                 memory-fraction cap of {limit} B"
                                );
                            }
                        }
                    }
                    Err(e) => {
                        assert!(
                        is_oom(&e) || (fired && is_injected(&e)),
                        "{op:?} failed with an unexpected error: {e} ({e:?}), fault fired: {fired}"
                    );
                        let (b, a) = (&before[device], &after[device]);
                        assert_eq!(
                            (b.allocated_bytes, b.allocations_current, b.num_allocs),
                            (a.allocated_bytes, a.allocations_current, a.num_allocs),
                            "{op:?} failed ({e}) but changed the live statistics"
                        );
                    }
                }
            }
        }
        self.prune_quarantine();
        self.check_stats(&after);
        if self.history_on {
            if let Some(e) = self.alloc.history(1).0.last() {
                let d = e.device as usize;
                assert_eq!(
                    e.allocated_bytes, after[d].allocated_bytes,
                    "device {d}: the newest timeline event's allocated_bytes gauge is stale: {e:?}"
                );
            }
        }
    }

    /// Exports the block; a shareable one must export (unless an injected fault fired) and then
    /// round-trips through import and close with faults set aside, as another process would.
    fn export_import(&mut self, d: usize, p: DevicePtr, stream: Stream) -> Outcome {
        let shareable = self.live[&(d, p)].shareable;
        let exported = self.alloc.ipc_export(p, d as i64, stream);
        if !shareable {
            return Outcome::Rejected(
                exported.map(drop),
                Expect::Invalid("not in a shareable pool"),
            );
        }
        let handle = match exported {
            Ok(h) => h,
            Err(e) => return Outcome::MustSucceed(Err(e)),
        };
        let left = self.drain_faults();
        let token = self
            .alloc
            .ipc_import_pool(d as i64, handle.pool_fd)
            .expect("import the pool");
        let imported = self
            .alloc
            .ipc_import(token, &handle, stream)
            .expect("import the block");
        assert_eq!(
            imported, p,
            "the simulator maps an import at the exporter's address"
        );
        self.alloc
            .ipc_close(imported, stream)
            .expect("close the import");
        assert_eq!(self.alloc.ipc_open_imports(), 0);
        self.alloc
            .ipc_release_export(d as i64, handle.event)
            .expect("release the export");
        self.reinject(left);
        Outcome::MustSucceed(Ok(()))
    }

    fn malloc(&mut self, bytes: u64, device: i64, stream: Stream) -> Outcome {
        let r = self.alloc.malloc(bytes, device, stream);
        match device_ok(device) {
            None => Outcome::Rejected(r.map(drop), Expect::BadDevice(device)),
            Some(_) if bytes == 0 => Outcome::Unchanged(r.map(|p| match p {
                DevicePtr::NULL => (),
                p => panic!("malloc(0) gave {p:#x}, not NULL"),
            })),
            Some(_) if bytes > MAX_ALLOCATION_BYTES => Outcome::Rejected(
                r.map(drop),
                Expect::Invalid("is larger than streampool's maximum"),
            ),
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

    fn current(&self, device: usize) -> (u64, u64) {
        self.live_on(device)
            .fold((0, 0), |(b, n), (_, blk)| (b + blk.bytes, n + 1))
    }

    /// Requested bytes of live blocks held from a pool (not graph memory), shareable included.
    fn pool_live_bytes(&self, device: usize) -> u64 {
        self.live_on(device)
            .filter(|(_, b)| !b.captured)
            .map(|(_, b)| b.bytes)
            .sum()
    }

    /// Requested bytes of live blocks of the shareable pool (`true`) or of the main pool.
    fn live_bytes_of(&self, device: usize, shareable: bool) -> u64 {
        self.live_on(device)
            .filter(|(_, b)| !b.captured && b.shareable == shareable)
            .map(|(_, b)| b.bytes)
            .sum()
    }

    fn check_stats(&self, stats: &[StreampoolStats; DEVICES]) {
        for (d, s) in stats.iter().enumerate() {
            let c = &self.counts[d];
            let (cur, n) = self.current(d);
            let got = (
                s.allocated_bytes,
                s.allocations_current,
                s.num_allocs,
                s.num_frees,
                s.allocated_bytes_total,
                s.freed_bytes_total,
            );
            let want = (cur, n, c.allocs, c.frees, c.bytes_total, c.freed_total);
            assert_eq!(
                got, want,
                "device {d}: (allocated_bytes, allocations_current, num_allocs, num_frees, \
                 allocated_bytes_total, freed_bytes_total) differ from the model"
            );
            assert_eq!(
                (s.allocated_bytes_peak, s.allocations_peak),
                (c.peak_bytes, c.peak_count),
                "device {d}: peaks differ from the model"
            );
            assert_eq!(
                s.memory_limit_bytes,
                c.limit.unwrap_or(u64::MAX),
                "device {d}: memory limit"
            );
            assert!(
                s.active_bytes >= s.allocated_bytes,
                "device {d}: active {} < allocated {}",
                s.active_bytes,
                s.allocated_bytes
            );
            let pool_live = self.live_bytes_of(d, false);
            let shared_live = self.live_bytes_of(d, true);
            assert!(
                s.ipc_used_bytes >= shared_live,
                "device {d}: shareable pool used {} < its live {shared_live}",
                s.ipc_used_bytes
            );
            assert!(
                s.pool_used_bytes >= pool_live + s.cached_bytes,
                "device {d}: pool used {} < live {pool_live} + cached {}",
                s.pool_used_bytes,
                s.cached_bytes
            );
            assert!(
                s.reserved_bytes >= s.pool_used_bytes,
                "device {d}: reserved {} < used {}",
                s.reserved_bytes,
                s.pool_used_bytes
            );
            assert!(
                s.cached_bytes <= CACHE_LIMIT_BYTES,
                "device {d}: cache {} over its budget",
                s.cached_bytes
            );
        }
    }

    /// Ends every capture, frees everything, completes all work, empties the cache: nothing may
    /// be left in the simulator.
    fn finish(mut self) {
        let left = self.drain_faults(); // no more faults from here on
        assert_eq!(left, self.pending_faults);
        for (d, s) in std::mem::take(&mut self.capturing) {
            self.sim.end_capture(d, s);
        }
        let live: Vec<_> = self.live.keys().copied().collect();
        for (d, p) in live {
            self.alloc
                .free(p, d as i64)
                .unwrap_or_else(|e| panic!("final free of {p:#x} on device {d}: {e}"));
            let b = self.live.remove(&(d, p)).expect("live");
            self.counts[d].frees += 1;
            self.counts[d].freed_total += b.bytes;
        }
        self.sim.complete_all();
        self.alloc
            .empty_cache()
            .unwrap_or_else(|e| panic!("final empty_cache: {e}"));
        self.sim.complete_all();
        let stats = self.all_stats();
        self.check_stats(&stats);
        for (d, s) in stats.iter().enumerate() {
            assert_eq!(
                (s.allocated_bytes, s.active_bytes, s.cached_bytes),
                (0, 0, 0),
                "device {d}: bytes left after freeing everything and emptying the cache"
            );
            assert_eq!(s.num_allocs, s.num_frees, "device {d}: allocs != frees");
        }
        let leaked = self.sim.outstanding_bytes();
        assert_eq!(leaked, 0, "{leaked} bytes still allocated in the simulator");
    }
}

#[derive(Debug)]
enum Expect {
    UnknownPointer,
    BadDevice(i64),
    Invalid(&'static str),
}

enum Outcome {
    /// Nothing to check beyond the invariants.
    None,
    /// Must succeed unless an injected fault fired.
    MustSucceed(Result<(), Error>),
    /// Must fail as expected and change nothing.
    Rejected(Result<(), Error>, Expect),
    /// Must succeed (no injected fault can reach it) and change nothing.
    Unchanged(Result<(), Error>),
    Malloc {
        result: Result<DevicePtr, Error>,
        device: usize,
        bytes: u64,
        stream: Stream,
    },
    MallocShareable {
        result: Result<DevicePtr, Error>,
        device: usize,
        bytes: u64,
        stream: Stream,
    },
}

enum OutcomeKind {
    MallocShareable,
    Other,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut h = Harness::new();
    for op in ops.into_iter().take(MAX_OPS) {
        h.step(op);
    }
    h.finish();
});

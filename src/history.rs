//! The memory timeline behind `streampool.record_history`: a bounded ring of what the allocator
//! did — allocations and frees, blocks taken from and returned to the pool, pool growth and trims,
//! out-of-memory — each with the device's byte gauges after it; and the block listing that
//! `dump_snapshot` turns into PyTorch's snapshot segments.
//!
//! Invariants: off by default; while no timeline of the process records, a recording point costs
//! one relaxed load of the process's switches (`crate::switches`). When
//! on, events are appended under the ring's own lock, which is a leaf: nothing else is locked or
//! called while it is held; an event's time is read under that lock, so the ring is in time order
//! whatever the threads. A full ring drops its oldest event and counts it. Each event carries the
//! stack context of the C entry that made it ([`contexts`]; 0 for none), and the context of each
//! live block's allocation is kept while recording, whatever the ring dropped.

pub mod contexts;

use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::switches::SWITCHES;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// What an event records (`StreampoolEvent::kind`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreampoolEventKind {
    /// A caller got `bytes` (requested size) at `address`.
    Alloc = 1,
    /// A caller freed the `bytes` it had requested at `address`.
    Free = 2,
    /// streampool took a block of `bytes` at `address` from the pool (`cuMemAllocFromPoolAsync`).
    PoolAlloc = 3,
    /// streampool gave the block of `bytes` at `address` back to the pool (`cuMemFreeAsync`).
    PoolFree = 4,
    /// The pool's reserved memory grew by `bytes`.
    PoolGrow = 5,
    /// A trim released `bytes` of the pool's reserved memory.
    PoolTrim = 6,
    /// A request for `bytes` failed: out of memory, or over the memory fraction. `address` holds
    /// the device's free bytes at the time (as PyTorch's `device_free`).
    Oom = 7,
    /// The virtual-memory backend mapped `bytes` of physical memory at `address`.
    Map = 8,
    /// The virtual-memory backend unmapped (and released) `bytes` at `address`.
    Unmap = 9,
}

/// One timeline entry, as copied out by `streampool_history`. The gauges are the device's values
/// right after the event: `allocated_bytes` as in the statistics, `held_bytes` taken from the pool
/// by streampool (live, cached and waiting blocks), `cached_bytes` in its cache, `reserved_bytes`
/// the pool's reserved memory when streampool last read it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolEvent {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// A `StreampoolEventKind`.
    pub kind: u32,
    pub device: i32,
    pub stream: u64,
    pub address: u64,
    pub bytes: u64,
    pub allocated_bytes: u64,
    pub held_bytes: u64,
    pub cached_bytes: u64,
    pub reserved_bytes: u64,
}

/// What a block held by streampool is used for (`StreampoolBlock::state`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreampoolBlockState {
    /// Allocated to a caller.
    Live = 1,
    /// Not in use: in the cache, or waiting for the pool to take it back.
    Inactive = 2,
    /// Freed, but other streams (record_stream) may still be using it.
    WaitingForStreams = 3,
}

/// One block that streampool holds from a device's pool, as listed by `streampool_blocks`.
/// `requested_bytes` is 0 for inactive blocks.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreampoolBlock {
    pub address: u64,
    pub block_bytes: u64,
    pub requested_bytes: u64,
    pub stream: u64,
    /// A `StreampoolBlockState`.
    pub state: u32,
    pub device: i32,
}

/// The device's gauges that every event carries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub allocated_bytes: u64,
    pub held_bytes: u64,
    pub cached_bytes: u64,
    pub reserved_bytes: u64,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<StreampoolEvent>,
    /// The stack context of each event, in step with `events`.
    contexts: VecDeque<u64>,
    /// (device, address) -> the context of the live block's allocation.
    live_contexts: HashMap<(i32, u64), u64>,
    max_entries: usize,
    dropped: u64,
}

/// The timeline of one allocator (all its devices).
#[derive(Debug, Default)]
pub struct History {
    enabled: AtomicBool,
    ring: Mutex<Ring>,
}

impl History {
    /// True while recording: read after the process-wide switch (`switches::SWITCHES`), so
    /// that while no timeline records an event costs the switches' line only.
    #[inline]
    pub fn enabled(&self) -> bool {
        SWITCHES.recording() && self.enabled.load(Ordering::Relaxed)
    }

    /// Starts recording into an empty ring of `max_entries` (> 0) events.
    pub fn start(&self, max_entries: usize) -> Result<()> {
        if max_entries == 0 {
            return Err(Error::InvalidArgument(
                "record_history needs max_entries > 0".into(),
            ));
        }
        let mut ring = self.ring.lock();
        *ring = Ring {
            max_entries,
            ..Ring::default()
        };
        if !self.enabled.swap(true, Ordering::Relaxed) {
            SWITCHES.recordings.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stops recording; what was recorded stays readable.
    pub fn stop(&self) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            SWITCHES.recordings.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Appends an event if recording is on (`gauges` is only evaluated then).
    #[inline]
    pub fn record(
        &self,
        kind: StreampoolEventKind,
        device: usize,
        stream: Stream,
        address: DevicePtr,
        bytes: u64,
        gauges: impl FnOnce() -> Gauges,
    ) {
        if self.enabled() {
            self.push(kind, device, stream, address, bytes, gauges());
        }
    }

    #[cold]
    fn push(
        &self,
        kind: StreampoolEventKind,
        device: usize,
        stream: Stream,
        address: DevicePtr,
        bytes: u64,
        g: Gauges,
    ) {
        let mut event = StreampoolEvent {
            time_ns: 0,
            kind: kind as u32,
            device: device as i32,
            stream: stream.0 as u64,
            address: address.0,
            bytes,
            allocated_bytes: g.allocated_bytes,
            held_bytes: g.held_bytes,
            cached_bytes: g.cached_bytes,
            reserved_bytes: g.reserved_bytes,
        };
        let context = contexts::current();
        let mut ring = self.ring.lock();
        if !self.enabled() {
            return; // stopped while this event was being made
        }
        event.time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let key = (event.device, event.address);
        // A free without a context of its own carries its block's allocation's (as PyTorch's
        // trace entries do).
        let context = match kind {
            StreampoolEventKind::Alloc if context != 0 => {
                ring.live_contexts.insert(key, context);
                context
            }
            StreampoolEventKind::Alloc => {
                ring.live_contexts.remove(&key);
                context
            }
            StreampoolEventKind::Free => match ring.live_contexts.remove(&key) {
                Some(allocated) if context == 0 => allocated,
                _ => context,
            },
            _ => context,
        };
        if ring.events.len() == ring.max_entries {
            ring.events.pop_front();
            ring.contexts.pop_front();
            ring.dropped += 1;
        }
        ring.events.push_back(event);
        ring.contexts.push_back(context);
    }

    /// As [`History::newest`], with each event's stack context (0: none).
    pub fn newest_with_contexts(&self, max_events: usize) -> (Vec<StreampoolEvent>, Vec<u64>, u64) {
        let ring = self.ring.lock();
        let skip = ring.events.len().saturating_sub(max_events);
        (
            ring.events.iter().skip(skip).copied().collect(),
            ring.contexts.iter().skip(skip).copied().collect(),
            ring.dropped,
        )
    }

    /// (address, context) of `device`'s live blocks allocated with a stack context while
    /// recording.
    pub fn live_contexts(&self, device: i32) -> Vec<(u64, u64)> {
        let ring = self.ring.lock();
        ring.live_contexts
            .iter()
            .filter(|((d, _), _)| *d == device)
            .map(|((_, address), context)| (*address, *context))
            .collect()
    }

    /// The newest `max_events` events, oldest first, and how many were dropped since the start.
    pub fn newest(&self, max_events: usize) -> (Vec<StreampoolEvent>, u64) {
        let ring = self.ring.lock();
        let skip = ring.events.len().saturating_sub(max_events);
        (
            ring.events.iter().skip(skip).copied().collect(),
            ring.dropped,
        )
    }

    pub fn len(&self) -> usize {
        self.ring.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for History {
    /// A timeline dropped while recording no longer counts as one.
    fn drop(&mut self) {
        self.stop();
    }
}

/// One device's view of the timeline: its events carry the device's gauges, with the reserved
/// bytes of its resources as last read, and growth and trims are noted as such.
///
/// Invariant: the gauges it remembers (for events of a resource, made outside the device lock)
/// are those of the device's last event; when the timeline is off nothing is read or written.
pub struct Recorder {
    device: usize,
    history: Arc<History>,
    reserved_bytes: AtomicU64,
    /// The device's allocated, held and cached bytes at its last event.
    last: [AtomicU64; 3],
}

impl Recorder {
    pub fn new(device: usize, history: Arc<History>) -> Recorder {
        Recorder {
            device,
            history,
            reserved_bytes: AtomicU64::new(0),
            last: Default::default(),
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.history.enabled()
    }

    /// Records an event with the device's `gauges` (evaluated only while recording).
    #[inline(always)]
    pub fn note(
        &self,
        kind: StreampoolEventKind,
        stream: Stream,
        address: DevicePtr,
        bytes: u64,
        gauges: impl FnOnce() -> Gauges,
    ) {
        if SWITCHES.recording() {
            self.push(kind, stream, address, bytes, gauges);
        }
    }

    /// [`Recorder::note`] once some timeline records (this one perhaps not): out of line, so that
    /// an event while none does reads nothing of the recorder.
    #[cold]
    #[inline(never)]
    fn push(
        &self,
        kind: StreampoolEventKind,
        stream: Stream,
        address: DevicePtr,
        bytes: u64,
        gauges: impl FnOnce() -> Gauges,
    ) {
        if !self.enabled() {
            return;
        }
        let g = Gauges {
            reserved_bytes: self.reserved_bytes.load(Ordering::Relaxed),
            ..gauges()
        };
        for (slot, value) in self
            .last
            .iter()
            .zip([g.allocated_bytes, g.held_bytes, g.cached_bytes])
        {
            slot.store(value, Ordering::Relaxed);
        }
        self.history
            .record(kind, self.device, stream, address, bytes, || g);
    }

    /// Records an event of a resource (a mapping), with the gauges of the device's last event.
    pub fn note_resource(
        &self,
        kind: StreampoolEventKind,
        address: DevicePtr,
        bytes: u64,
        reserved_bytes: u64,
    ) {
        if !self.enabled() {
            return;
        }
        self.reserved_bytes.store(reserved_bytes, Ordering::Relaxed);
        let [allocated_bytes, held_bytes, cached_bytes] =
            self.last.each_ref().map(|v| v.load(Ordering::Relaxed));
        let g = Gauges {
            allocated_bytes,
            held_bytes,
            cached_bytes,
            reserved_bytes,
        };
        self.history
            .record(kind, self.device, Stream(0), address, bytes, || g);
    }

    /// The device's gauges are `g` (when the timeline starts, before any event of the device).
    pub fn set_last(&self, g: Gauges) {
        for (slot, value) in self
            .last
            .iter()
            .zip([g.allocated_bytes, g.held_bytes, g.cached_bytes])
        {
            slot.store(value, Ordering::Relaxed);
        }
    }

    /// The reserved gauge starts at `reserved_bytes` (when the timeline starts).
    pub fn set_reserved(&self, reserved_bytes: u64) {
        self.reserved_bytes.store(reserved_bytes, Ordering::Relaxed);
    }

    /// Records growth of the reserved memory to `reserved_bytes`, if it grew.
    pub fn note_reserved(
        &self,
        reserved_bytes: u64,
        stream: Stream,
        gauges: impl FnOnce() -> Gauges,
    ) {
        let before = self.reserved_bytes.swap(reserved_bytes, Ordering::Relaxed);
        if reserved_bytes > before {
            self.note(
                StreampoolEventKind::PoolGrow,
                stream,
                DevicePtr::NULL,
                reserved_bytes - before,
                gauges,
            );
        }
    }

    /// Records a trim from `before_bytes` to `after_bytes` reserved, if it released anything.
    pub fn note_trim(
        &self,
        before_bytes: u64,
        after_bytes: u64,
        stream: Stream,
        gauges: impl FnOnce() -> Gauges,
    ) {
        self.reserved_bytes.store(after_bytes, Ordering::Relaxed);
        if before_bytes > after_bytes {
            self.note(
                StreampoolEventKind::PoolTrim,
                stream,
                DevicePtr::NULL,
                before_bytes - after_bytes,
                gauges,
            );
        }
    }
}

#[cfg(test)]
mod tests;

//! What a test does to the simulated GPU: stops and moves its clock, makes calls fail, completes,
//! captures and destroys streams, breaks a device or its pools, and runs "kernels" that touch
//! memory; and what it reads back (calls made, memory outstanding, high-water marks).
//!
//! Invariant: these change nothing a real driver call could not see change on a GPU (work
//! completing, a capture beginning, a stream destroyed, an error becoming sticky); none of them
//! is a driver call.

use super::{driver_error, SimDriver, SimFault, StreamClock, CUDA_ERROR_ILLEGAL_ADDRESS};
use crate::driver::{DevicePtr, EventHandle, Stream};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A call's name and what a test runs, on the calling thread with no lock of the simulator's
/// held, each time that call is made, before it does anything.
pub type CallHook = (&'static str, Arc<dyn Fn() + Send + Sync>);

impl SimDriver {
    /// Stops the clock (`now_ms`): from now on it moves only by [`SimDriver::advance_clock_ms`].
    pub fn stop_clock(&self) {
        let now_us = crate::driver::monotonic_us();
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

    /// Runs each hook each time its call is made, from now on (replacing those set before; an
    /// empty list: none).
    pub fn set_call_hooks(&self, hooks: Vec<CallHook>) {
        *self.hooks.lock() = hooks;
    }

    /// Makes misuse and leaks panic (for tests; see the module's invariants).
    pub fn strict(mut self) -> SimDriver {
        self.strict = true;
        self
    }

    /// Makes [`SimDriver::touch`] refuse memory that unfinished work of another stream still
    /// uses, unless the touching stream waited for that work on the GPU (a race: see `races.rs`).
    pub fn check_races(self) -> SimDriver {
        for d in &self.devices {
            d.lock().touches.enabled = true;
        }
        self
    }

    /// True if work `stream` submits from now on runs after the work `event` marks: the event
    /// was never recorded or has completed, or `stream` waited on the GPU for it (or for later
    /// work of its stream). False for an event the device does not know.
    pub fn event_precedes(&self, device: usize, event: EventHandle, stream: Stream) -> bool {
        let d = self.devices[device].lock();
        match d.events.get(&event.raw()) {
            None => false,
            Some(None) => true,
            Some(&Some(on)) => done_or_waited_for(&d.streams, &d.waits, on, stream),
        }
    }

    /// The next `count` calls of `fault` fail.
    pub fn inject_fault(&self, fault: SimFault, count: u32) {
        self.faults.lock().entry(fault).or_default().1 += count;
    }

    /// After the next `ok_calls` calls of `fault`, which succeed, `count` calls fail.
    pub fn inject_fault_after(&self, fault: SimFault, ok_calls: u32, count: u32) {
        let mut faults = self.faults.lock();
        let entry = faults.entry(fault).or_default();
        *entry = (ok_calls, entry.1 + count);
    }

    /// Takes one pending injection of `fault` without calling anything: true if there was one.
    pub fn take_injected(&self, fault: SimFault) -> bool {
        self.take_fault(fault, "probe").is_err()
    }

    /// How many times `call` (a driver function's name, e.g. `"cuMemSetAccess"`) was attempted,
    /// over all devices. Counted: the calls with a [`SimFault`], `cuEventQuery`, `cuStreamQuery`,
    /// `cuMemGetInfo`, and `"cuMemSetAccess handles"` (the mappings those calls covered, summed)
    /// and `"unsafe during capture"` (calls a global-mode capture forbids, made outside relaxed
    /// mode); others read 0 (among them capture queries, pool attribute queries and trims, event
    /// destruction and address frees).
    pub fn calls(&self, call: &str) -> u64 {
        self.calls.lock().get(call).copied().unwrap_or(0)
    }

    /// Every driver call [`SimDriver::calls`] has counted so far, all names together (its
    /// `"cuMemSetAccess handles"` and `"unsafe during capture"` are no calls of their own).
    pub fn calls_total(&self) -> u64 {
        let calls = self.calls.lock();
        let not_calls = ["cuMemSetAccess handles", "unsafe during capture"];
        (calls.iter())
            .filter(|(name, _)| !not_calls.contains(name))
            .map(|(_, n)| n)
            .sum()
    }

    /// All work submitted so far on `stream` completes (and the work it waited for).
    pub fn complete_stream(&self, device: usize, stream: Stream) {
        self.devices[device].lock().complete_stream(stream);
    }

    /// All work submitted so far on every stream of `device` but `except` completes (and the
    /// work it waited for, which may be some of `except`'s).
    pub fn complete_other_streams(&self, device: usize, except: Stream) {
        let mut d = self.devices[device].lock();
        let others: Vec<Stream> = d
            .streams
            .keys()
            .filter(|s| **s != except)
            .copied()
            .collect();
        for stream in others {
            d.complete_stream(stream);
        }
    }

    /// Whether some stream of `device` has work submitted and not completed.
    pub fn work_in_flight(&self, device: usize) -> bool {
        let d = self.devices[device].lock();
        d.streams.values().any(|c| c.completed < c.submitted)
    }

    /// Events of `device` created and not destroyed yet.
    pub fn events_alive(&self, device: usize) -> usize {
        self.devices[device].lock().events.len()
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

    /// `stream` begins capturing a CUDA graph: any stream but the legacy default one, which CUDA
    /// refuses to capture.
    pub fn begin_capture(&self, device: usize, stream: Stream) {
        assert!(
            stream.may_be_captured(),
            "the legacy default stream cannot be captured (CUDA refuses: \
             cudaErrorStreamCaptureUnsupported)"
        );
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

    /// Bytes still allocated (live or pending) across all pools, graph allocations and managed
    /// memory.
    pub fn outstanding_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| {
                let d = d.lock();
                d.pools.iter().map(|p| p.used_bytes).sum::<u64>()
                    + d.captured_live.values().sum::<u64>()
                    + d.captured_pending.iter().map(|f| f.bytes).sum::<u64>()
                    + d.managed.bytes()
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

    /// Models what the real driver does (seen on H100s): from now on `device`'s pools learn that
    /// a stream-ordered free completed only at a synchronisation (`cuCtxSynchronize`,
    /// `cuStreamSynchronize`), not when the work completes; until then a trim cannot release the
    /// freed memory and other streams cannot reuse it.
    pub fn pools_apply_frees_at_sync(&self, device: usize) {
        self.devices[device].lock().frees_applied_at_sync = true;
    }

    /// From now on, work submitted to `device`'s streams completes at once, as on a GPU that
    /// keeps up with the program (a loop that queues no kernels): an event recorded on an idle
    /// stream has completed by the next query.
    pub fn gpu_keeps_up(&self, device: usize) {
        self.devices[device].lock().keeps_up = true;
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
    /// not mapped, or `from` has no access to it, or (with [`SimDriver::check_races`]) unfinished
    /// work of another stream still uses it (a test asserts it is `Ok`).
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
            true => {
                let d = &mut *d;
                let (streams, waits) = (&d.streams, &d.waits);
                let completed = |work| done_or_waited_for(streams, waits, work, stream);
                d.vmm
                    .touch(ptr, bytes, from, device, (stream, seq), completed)
            }
            false => d.touch_pool_memory(ptr, bytes, from, device),
        };
        let outcome = outcome.and_then(|()| d.check_race(ptr, bytes, stream, seq));
        outcome.map_err(|why| {
            driver_error(
                "touch",
                CUDA_ERROR_ILLEGAL_ADDRESS,
                &format!("CUDA_ERROR_ILLEGAL_ADDRESS ({why})"),
            )
        })
    }
}

/// True if `work` (a stream's tick) has completed, or `stream`'s new work is ordered after it
/// (the stream waited for it on the GPU).
fn done_or_waited_for(
    streams: &HashMap<Stream, StreamClock>,
    waits: &[super::StreamWait],
    (s, seq): (Stream, u64),
    stream: Stream,
) -> bool {
    streams.get(&s).is_some_and(|c| c.completed >= seq)
        || super::device::ordered_after(waits, stream, (s, seq))
}

//! Stream waits of one device: freed blocks that other streams used (`record_stream`) wait for
//! events recorded on those streams; during a CUDA graph capture no event can be recorded, so
//! such blocks are deferred until the capture ends; and graph memory itself.
//!
//! Invariants: a waiting block is handed back (by [`Waits::collect`]) only once every event
//! recorded for it has completed, or after a device synchronisation outside any capture; while a
//! capture is known to be under way nothing is queried, recorded or synchronised for the waits.
//! Everything here runs under the device lock: the driver calls made here (event create, record
//! and query, capture status) return at once and take no lock of ours — none waits for the GPU.
//! The driver is an argument: this layer owns its fields and nothing else of the device.

use super::books::WaitingBlock;
use crate::driver::{DevicePtr, Driver, EventHandle, Stream};
use crate::error::Result;
use std::collections::VecDeque;

#[derive(Debug)]
struct Pending {
    waiting: WaitingBlock,
    events: Vec<EventHandle>,
    /// When it began to wait (see [`Waits::mark`]).
    seq: u64,
}

/// Freed while a capture was under way: its streams get events once the capture ends.
#[derive(Debug)]
struct Deferred {
    waiting: WaitingBlock,
    streams: Vec<Stream>,
    seq: u64,
}

#[derive(Debug, Default)]
pub(super) struct Waits {
    /// In the order they were freed.
    pending: VecDeque<Pending>,
    deferred: Vec<Deferred>,
    spare_events: Vec<EventHandle>,
    /// Streams seen capturing; while non-empty, no event queries and no synchronisation.
    capturing: Vec<Stream>,
    /// The sequence number of the next block to wait.
    next_seq: u64,
}

/// A block for which no event could be recorded, handed back by [`Waits::wait_for`].
#[derive(Debug)]
pub(super) struct WaitFailed {
    pub waiting: WaitingBlock,
    pub streams: Vec<Stream>,
    pub error: crate::Error,
}

impl Waits {
    /// Nothing waits and no capture is known: an allocation has nothing to look at here.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.deferred.is_empty() && self.capturing.is_empty()
    }

    pub fn capturing(&self) -> bool {
        !self.capturing.is_empty()
    }

    /// Notes that `stream` is capturing a graph; true if it was not known to be.
    pub fn note_capturing(&mut self, stream: Stream) -> bool {
        let new = !self.capturing.contains(&stream);
        if new {
            self.capturing.push(stream);
        }
        new
    }

    /// Marks now: [`Waits::take_all_after_sync`] takes only blocks that began to wait before.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// Forgets captures that ended (deferred blocks then get their events) and hands back the
    /// pending blocks whose events completed, oldest first, stopping at the first that has not
    /// (as PyTorch does), so an allocation costs O(1) queries when nothing finished.
    pub fn collect(&mut self, driver: &dyn Driver, device: usize) -> Vec<WaitingBlock> {
        let mut ready = Vec::new();
        if !self.capturing.is_empty() || !self.deferred.is_empty() {
            self.refresh(driver, device);
        }
        if self.pending.is_empty() || !self.capturing.is_empty() {
            return ready;
        }
        let done = |e: &EventHandle| driver.event_query(device, *e).unwrap_or(false);
        let done_count = self
            .pending
            .iter()
            .take_while(|p| p.events.iter().all(done))
            .count();
        for p in self.pending.drain(..done_count) {
            self.spare_events.extend(p.events);
            ready.push(p.waiting);
        }
        ready
    }

    /// Forgets streams whose capture has ended; once none is left, deferred blocks get events on
    /// their streams (a block for which that fails stays deferred until a later try or the next
    /// flush's synchronisation).
    fn refresh(&mut self, driver: &dyn Driver, device: usize) {
        self.capturing
            .retain(|s| driver.is_capturing(device, *s).unwrap_or(false));
        if !self.capturing.is_empty() {
            return;
        }
        for d in std::mem::take(&mut self.deferred) {
            match self.record_events(driver, device, &d.streams) {
                Ok(events) => self.pending.push_back(Pending {
                    waiting: d.waiting,
                    events,
                    seq: d.seq,
                }),
                Err(e) => {
                    log::warn!(
                        "device {device}: {e}; {:#x} waits for the next empty_cache",
                        d.waiting.block.ptr
                    );
                    self.deferred.push(d);
                }
            }
        }
    }

    /// `waiting` waits for `streams`: events are recorded on them now, or, during a capture, once
    /// it ends. If no event can be recorded, hands the block back with the error: the caller
    /// must synchronise before reusing it, or [`Waits::defer`] it.
    pub fn wait_for(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        waiting: WaitingBlock,
        streams: Vec<Stream>,
    ) -> std::result::Result<(), Box<WaitFailed>> {
        if !self.capturing.is_empty() {
            self.defer(waiting, streams);
            return Ok(());
        }
        match self.record_events(driver, device, &streams) {
            Ok(events) => {
                let seq = self.next();
                self.pending.push_back(Pending {
                    waiting,
                    events,
                    seq,
                });
                Ok(())
            }
            Err(error) => Err(Box::new(WaitFailed {
                waiting,
                streams,
                error,
            })),
        }
    }

    /// Keeps a block until events can be recorded for it or the device has been synchronised.
    pub fn defer(&mut self, waiting: WaitingBlock, streams: Vec<Stream>) {
        let seq = self.next();
        self.deferred.push(Deferred {
            waiting,
            streams,
            seq,
        });
    }

    fn next(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// After a device synchronisation outside any capture, made after [`Waits::mark`] returned
    /// `mark`: every block that began to wait before it is free (blocks freed since may still be
    /// in use by their streams and stay).
    pub fn take_all_after_sync(&mut self, mark: u64) -> Vec<WaitingBlock> {
        let mut free = Vec::new();
        let mut still = VecDeque::new();
        for p in self.pending.drain(..) {
            if p.seq < mark {
                self.spare_events.extend(p.events);
                free.push(p.waiting);
            } else {
                still.push_back(p);
            }
        }
        self.pending = still;
        let (before, after): (Vec<Deferred>, Vec<Deferred>) =
            self.deferred.drain(..).partition(|d| d.seq < mark);
        self.deferred = after;
        free.extend(before.into_iter().map(|d| d.waiting));
        free
    }

    /// Every waiting block, for snapshots.
    pub fn blocks(&self) -> impl Iterator<Item = &WaitingBlock> {
        let pending = self.pending.iter().map(|p| &p.waiting);
        pending.chain(self.deferred.iter().map(|d| &d.waiting))
    }

    /// Records one event on each of `streams` (reusing spare events); on failure every event
    /// taken goes back to the spares.
    fn record_events(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        streams: &[Stream],
    ) -> Result<Vec<EventHandle>> {
        let mut events = Vec::with_capacity(streams.len());
        for &s in streams {
            let event = match self.spare_events.pop() {
                Some(e) => e,
                None => match driver.event_create(device) {
                    Ok(e) => e,
                    Err(err) => {
                        self.spare_events.append(&mut events);
                        return Err(err);
                    }
                },
            };
            // An event whose record failed is still an event: keep it as a spare.
            if let Err(err) = driver.event_record(device, event, s) {
                self.spare_events.push(event);
                self.spare_events.append(&mut events);
                return Err(err);
            }
            events.push(event);
        }
        Ok(events)
    }

    /// Destroys the spare events (the device is going away).
    pub fn destroy_spares(&mut self, driver: &dyn Driver, device: usize) {
        for e in self.spare_events.drain(..) {
            driver.event_destroy(device, e);
        }
    }
}

/// Graph memory for a capturing stream: the allocation becomes a node of the graph.
pub(super) fn alloc_for_graph(
    driver: &dyn Driver,
    device: usize,
    block_bytes: u64,
    stream: Stream,
) -> Result<DevicePtr> {
    driver.alloc_captured(device, block_bytes, stream)
}

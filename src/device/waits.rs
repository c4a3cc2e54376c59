//! Stream waits of one device: freed blocks that other streams used (`record_stream`) wait for
//! events recorded on those streams; during a CUDA graph capture no event can be recorded, so
//! such blocks are deferred until the capture ends.
//!
//! Built on [`crate::stream_order`] (events, the capture watch, in-order completion).
//!
//! Invariants: a waiting block is handed back (by [`Waits::collect`]) only once every event
//! recorded for it has completed, or after a device synchronisation outside any capture; while a
//! capture is known to be under way nothing is queried, recorded or synchronised for the waits.
//! Everything here runs under the device lock: the driver calls made here (event create, record
//! and query, capture status) return at once and take no lock of ours — none waits for the GPU.
//! The driver is an argument: this layer owns its fields and nothing else of the device.

use super::freed::WaitingBlock;
use crate::driver::{Driver, Stream};
use crate::stream_order::{CaptureWatch, EventPool, InOrder, SyncMarks};

/// A waiting block, with when it began to wait (see [`Waits::mark`]).
#[derive(Debug)]
struct Pending {
    waiting: WaitingBlock,
    seq: u64,
}

/// Freed while a capture was under way: its streams get events once the capture ends.
#[derive(Debug)]
struct Deferred {
    waiting: WaitingBlock,
    streams: Vec<Stream>,
    seq: u64,
}

/// The three lists [`Waits::is_idle`] reads on every allocation come first, together.
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Waits {
    /// In the order they were freed.
    pending: InOrder<Pending>,
    deferred: Vec<Deferred>,
    /// Streams seen capturing; while one is known, no event queries and no synchronisation.
    captures: CaptureWatch,
    events: EventPool,
    /// The sequence number of the next block to wait.
    next_seq: u64,
    /// The marks threads took as their synchronisations of the device began
    /// ([`Waits::note_sync_begins`]).
    sync_marks: SyncMarks,
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
        self.pending.is_empty() && self.deferred.is_empty() && !self.captures.any_known()
    }

    pub fn capturing(&self) -> bool {
        self.captures.any_known()
    }

    /// Whether a capture is under way, the ended ones forgotten first (asks the driver only
    /// while one is known).
    pub fn capturing_now(&mut self, driver: &dyn Driver, device: usize) -> bool {
        if self.captures.any_known() {
            self.refresh(driver, device);
        }
        self.captures.any_known()
    }

    /// Notes that `stream` is capturing a graph; true if it was not known to be.
    pub fn note_capturing(&mut self, stream: Stream) -> bool {
        self.captures.note(stream)
    }

    /// Marks now: [`Waits::take_all_after_sync`] takes only blocks that began to wait before.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// The calling thread is about to synchronise the device: [`Waits::sync_ended`], on the same
    /// thread once that returned, takes every block that began to wait before now (none if a
    /// capture is known now or then).
    pub fn note_sync_begins(&mut self) {
        let mark = (!self.captures.any_known()).then(|| self.mark());
        self.sync_marks.note(mark);
    }

    /// The calling thread's synchronisation of the device, begun at its
    /// [`Waits::note_sync_begins`], has returned: the blocks that began to wait before it, none
    /// if this thread noted no beginning (or a capture is known: nothing is taken then). Such a
    /// block is free for every stream: its streams' work on it was queued before the
    /// synchronisation began.
    pub fn sync_ended(&mut self) -> Vec<WaitingBlock> {
        let Some(mark) = self.sync_marks.take() else {
            return Vec::new();
        };
        match self.captures.any_known() {
            true => Vec::new(),
            false => self.take_all_after_sync(mark),
        }
    }

    /// Forgets captures that ended (deferred blocks then get their events) and hands back the
    /// pending blocks whose events completed, oldest first, stopping at the first that has not
    /// (as PyTorch does), so an allocation costs O(1) queries when nothing finished.
    pub fn collect(&mut self, driver: &dyn Driver, device: usize) -> Vec<WaitingBlock> {
        let mut ready = Vec::new();
        if self.captures.any_known() || !self.deferred.is_empty() {
            self.refresh(driver, device);
        }
        if self.pending.is_empty() || self.captures.any_known() {
            return ready;
        }
        self.pending
            .pop_completed(driver, device, &mut self.events, |p| ready.push(p.waiting));
        ready
    }

    /// Forgets streams whose capture has ended; once none is left, deferred blocks get events on
    /// their streams (a block for which that fails stays deferred until a later try or the next
    /// flush's synchronisation).
    fn refresh(&mut self, driver: &dyn Driver, device: usize) {
        if self.captures.refresh(driver, device) {
            return;
        }
        for d in std::mem::take(&mut self.deferred) {
            match self.events.record_each(driver, device, &d.streams) {
                Ok(events) => self.pending.push(
                    Pending {
                        waiting: d.waiting,
                        seq: d.seq,
                    },
                    events,
                ),
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
    /// must synchronise before reusing it, or [`Waits::defer`] it. `routed`: PyTorch routes the
    /// device's allocations to a graph pool, as it does from before it begins a capture.
    pub fn wait_for(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        waiting: WaitingBlock,
        streams: &[Stream],
        routed: bool,
    ) -> std::result::Result<(), Box<WaitFailed>> {
        // While routed, a stream that captures, though the device has not seen it allocate yet
        // (PyTorch begins a capture before it allocates in it), becomes known here: an event
        // recorded on it would be a node of the graph, not a mark of the work the block waits
        // for. (Asked only then: a driver call on each such free otherwise.)
        if routed {
            for &stream in streams {
                if driver.is_capturing(device, stream) == Ok(true) {
                    self.captures.note(stream);
                }
            }
        }
        if self.captures.any_known() {
            self.defer(waiting, streams.to_vec());
            return Ok(());
        }
        match self.events.record_each(driver, device, streams) {
            Ok(events) => {
                let seq = self.next();
                self.pending.push(Pending { waiting, seq }, events);
                Ok(())
            }
            Err(error) => Err(Box::new(WaitFailed {
                waiting,
                streams: streams.to_vec(),
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
        let mut free: Vec<WaitingBlock> = self
            .pending
            .take_where(|p| p.seq < mark, &mut self.events)
            .into_iter()
            .map(|p| p.waiting)
            .collect();
        if self.deferred.is_empty() {
            return free;
        }
        let (before, after): (Vec<Deferred>, Vec<Deferred>) =
            self.deferred.drain(..).partition(|d| d.seq < mark);
        self.deferred = after;
        free.extend(before.into_iter().map(|d| d.waiting));
        free
    }

    /// Every waiting block, for snapshots.
    pub fn blocks(&self) -> impl Iterator<Item = &WaitingBlock> {
        let pending = self.pending.iter().map(|(p, _)| &p.waiting);
        pending.chain(self.deferred.iter().map(|d| &d.waiting))
    }

    /// Destroys the spare events (the device is going away).
    pub fn destroy_spares(&mut self, driver: &dyn Driver, device: usize) {
        self.events.destroy(driver, device);
    }
}

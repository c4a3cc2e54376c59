//! Fences of freed memory: events recorded on a stream after memory was freed on it, so that
//! other streams may reuse that memory — at once after a GPU-side wait on the event, or without
//! one once it has completed.
//!
//! Fences are recorded lazily: a free only takes the sequence number of its stream's next fence
//! (no driver call on the freeing thread); the fence is recorded when someone needs it — the
//! owner's next look (an allocation that found nothing, the background thread), another stream
//! that wants the memory, a trim. Recorded later than the free, it covers the free and more:
//! never less.
//!
//! Invariants: a stream's fences complete in the order they were recorded (stream order), so
//! each stream keeps an [`InOrder`] queue and only its front is queried; sequence numbers grow
//! across all streams, a stream's pending number is greater than any it recorded, and its
//! completed fence number only grows; events are reused once completed ([`EventPool`]), or once a
//! synchronisation of the device that began after their record has returned. A poll
//! queries every stream's front ([`Fences::poll`]), or a bounded number of them in turn from a
//! cursor ([`Fences::poll_some`]) that stays on the same stream when slots before it go.

use super::{EventPool, InOrder};
use crate::driver::{Driver, EventHandle, Stream};
use crate::error::Result;

/// How many streams' slots are kept after their fences have all completed (see
/// [`Fences::forget_streams_without_fences`]).
const KEPT_IDLE_STREAMS: usize = 64;

/// The most streams whose oldest fences one [`Fences::poll_some`] queries: a program with
/// thousands of streams (one per request) would otherwise pay a query per stream with work in
/// flight at every allocation that looks. Such polls take the streams in turn, so every stream's
/// fences are seen within (streams with fences) / 64 of them.
pub(super) const POLLED_STREAMS_MAX: usize = 64;

struct StreamFences {
    stream: Stream,
    /// Recorded fences (their numbers) not known to have completed, oldest first.
    recorded: InOrder<u64>,
    /// The number of the fence that will cover the frees made since the last record.
    pending: Option<u64>,
    /// When its last fence was recorded (the driver's clock); `None`: never.
    recorded_at_us: Option<u64>,
}

#[derive(Default)]
pub(crate) struct Fences {
    streams: Vec<StreamFences>,
    last_seq: u64,
    events: EventPool,
    /// Where the next bounded poll starts among `streams`: the first stream with fences that the
    /// last one did not reach.
    poll_from: usize,
    /// Frees and records so far ([`Fences::mark`]).
    changes: u64,
}

impl Fences {
    #[inline]
    fn slot(&mut self, stream: Stream) -> &mut StreamFences {
        match self.streams.iter().position(|s| s.stream == stream) {
            Some(i) => &mut self.streams[i],
            None => self.new_slot(stream),
        }
    }

    /// [`Fences::slot`] for a stream it has none for yet.
    #[cold]
    fn new_slot(&mut self, stream: Stream) -> &mut StreamFences {
        self.streams.push(StreamFences {
            stream,
            recorded: InOrder::default(),
            pending: None,
            recorded_at_us: None,
        });
        self.streams.last_mut().expect("just pushed")
    }

    /// A free on `stream` at `now_us` (no driver call): the number of the fence that will cover
    /// it, and whether that fence is due to be recorded — the stream's last record is
    /// `interval_us` old or more (or it has none): a stream that frees all the time records one
    /// fence per interval, and no free waits longer than that for a fence that can complete.
    #[inline]
    pub fn free_on(&mut self, stream: Stream, now_us: u64, interval_us: u64) -> (u64, bool) {
        self.changes = self.changes.wrapping_add(1);
        let next = self.last_seq + 1;
        let slot = self.slot(stream);
        let due = slot
            .recorded_at_us
            .is_none_or(|at_us| now_us.saturating_sub(at_us) >= interval_us);
        let seq = match slot.pending {
            Some(seq) => seq,
            None => {
                slot.pending = Some(next);
                self.last_seq = next;
                next
            }
        };
        (seq, due)
    }

    /// Records `stream`'s pending fence, if it has one.
    pub fn record_pending(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        stream: Stream,
    ) -> Result<()> {
        let Some(i) = self.streams.iter().position(|s| s.stream == stream) else {
            return Ok(());
        };
        let Some(seq) = self.streams[i].pending else {
            return Ok(());
        };
        let event = self.events.record(driver, device, stream)?;
        self.changes = self.changes.wrapping_add(1);
        let slot = &mut self.streams[i];
        slot.pending = None;
        slot.recorded.push(seq, vec![event]);
        slot.recorded_at_us = Some(driver.now_us());
        Ok(())
    }

    /// Records every stream's pending fence except on streams that capture ([`super::may_record`]);
    /// a record that fails stays pending for the next try. True if any was recorded.
    pub fn record_all_pending(&mut self, driver: &dyn Driver, device: usize) -> bool {
        let pending: Vec<Stream> = self
            .streams
            .iter()
            .filter(|s| s.pending.is_some())
            .map(|s| s.stream)
            .collect();
        let mut recorded = false;
        for stream in pending {
            if !super::may_record(driver, device, stream) {
                continue;
            }
            match self.record_pending(driver, device, stream) {
                Ok(()) => recorded = true,
                Err(e) => log::debug!("device {device}: fence on {stream:#x}: {e}; later"),
            }
        }
        recorded
    }

    /// For a caller that records nothing on the program's streams (a background thread: a stream
    /// may begin a capture at any moment, and a record would join the graph): the pending fences
    /// of streams that have finished all their work are complete without being recorded. The
    /// streams and fence numbers so completed.
    pub fn complete_pending_of_idle_streams(
        &mut self,
        driver: &dyn Driver,
        device: usize,
    ) -> Vec<(Stream, u64)> {
        // Recorded fences of the stream are older: queried first (poll), so only a stream whose
        // queue is empty can be asked as a whole; and not a stream that captures (a query of it
        // would end the capture), which the caller may not know of yet.
        self.complete_pending_where(|slot, _| {
            slot.recorded.is_empty() && super::finished(driver, device, slot.stream)
        })
    }

    /// For a caller that may record (a thread of the program, at a miss): the pending fence of
    /// each stream that has finished all its work completes without a record (one
    /// `cuStreamQuery`, which the record would have cost); the others are recorded, for the next
    /// look or another stream's wait. Capturing streams (neither a query nor a record is allowed
    /// on them: [`super::may_record`]) are left as they are. The streams and fence numbers so
    /// completed.
    pub fn settle_pending(&mut self, driver: &dyn Driver, device: usize) -> Vec<(Stream, u64)> {
        let pending: Vec<(Stream, bool)> = self
            .streams
            .iter()
            .filter(|s| s.pending.is_some())
            .map(|s| (s.stream, s.recorded.is_empty()))
            .collect();
        let mut idle = Vec::new();
        for (stream, nothing_recorded) in pending {
            if !super::may_record(driver, device, stream) {
                continue;
            }
            // With fences of its own still recorded, the stream is taken as busy (it was polled
            // just before, or a bounded poll did not reach it): its fence is recorded.
            if nothing_recorded && driver.stream_query(device, stream).unwrap_or(false) {
                idle.push(stream);
            } else if let Err(e) = self.record_pending(driver, device, stream) {
                log::debug!("device {device}: fence on {stream:#x}: {e}; later");
            }
        }
        match idle.is_empty() {
            true => Vec::new(),
            false => self.complete_pending_where(|slot, _| idle.contains(&slot.stream)),
        }
    }

    /// A mark for [`Fences::complete_all_unchanged_since`], taken as a synchronisation of the
    /// device begins: the count of frees and records so far.
    pub fn mark(&self) -> u64 {
        self.changes
    }

    /// After a synchronisation of the device that began at `mark` ([`Fences::mark`]) and
    /// returned: if nothing was freed or recorded since, every fence covers only work queued
    /// before it began, so all of them — recorded and pending — have completed, without a query
    /// (their events go back to the spares). `None` if something was (a free after the mark may
    /// have joined a pending fence, whose work may still run: the caller asks the driver). The
    /// streams and their newest fence numbers so completed.
    pub fn complete_all_unchanged_since(&mut self, mark: u64) -> Option<Vec<(Stream, u64)>> {
        if self.changes != mark {
            return None;
        }
        let mut out = Vec::new();
        for slot in &mut self.streams {
            // A stream's pending number is greater than any it recorded.
            let newest = slot.pending.take().or(slot.recorded.last().copied());
            self.events.give_back(slot.recorded.drain_events());
            out.extend(newest.map(|seq| (slot.stream, seq)));
        }
        self.forget_streams_without_fences();
        Some(out)
    }

    /// The pending fences of streams the driver no longer knows (destroyed: no fence can be
    /// recorded on them any more). They complete once the device has synchronised after this
    /// call: [`Fences::complete_pending`].
    pub fn pending_of_gone_streams(
        &self,
        driver: &dyn Driver,
        device: usize,
    ) -> Vec<(Stream, u64)> {
        // Only streams with a pending fence are asked (slots outlive their fences).
        let pending = |s: &StreamFences| s.pending.map(|seq| (s.stream, seq));
        let gone = |(stream, _): &(Stream, u64)| driver.is_capturing(device, *stream).is_err();
        self.streams
            .iter()
            .filter_map(pending)
            .filter(gone)
            .collect()
    }

    /// The pending fences `done` (stream, fence number) are complete, those still pending; the
    /// streams and fence numbers so completed.
    pub fn complete_pending(&mut self, done: &[(Stream, u64)]) -> Vec<(Stream, u64)> {
        self.complete_pending_where(|slot, seq| done.contains(&(slot.stream, seq)))
    }

    /// The pending fences of the streams `done` says have finished are complete; streams left
    /// without fences are forgotten. The streams and fence numbers so completed.
    fn complete_pending_where(
        &mut self,
        done: impl Fn(&StreamFences, u64) -> bool,
    ) -> Vec<(Stream, u64)> {
        let mut out = Vec::new();
        for slot in &mut self.streams {
            let Some(seq) = slot.pending else { continue };
            if done(slot, seq) {
                slot.pending = None;
                out.push((slot.stream, seq));
            }
        }
        self.forget_streams_without_fences();
        out
    }

    /// Streams left without fences are forgotten only once there are many: a stream's slot keeps
    /// the time of its last record, and a stream whose fences complete at once (a GPU that keeps
    /// up) would otherwise find its fence due, and record one, at every free.
    fn forget_streams_without_fences(&mut self) {
        if self.streams.len() > KEPT_IDLE_STREAMS {
            let idle = |s: &StreamFences| s.recorded.is_empty() && s.pending.is_none();
            // The next poll starts at the same stream: the slots forgotten before it move it.
            let start = self.poll_from.min(self.streams.len());
            self.poll_from = start - self.streams[..start].iter().filter(|s| idle(s)).count();
            self.streams.retain(|s| !idle(s));
        }
    }

    /// True if any fence is pending or recorded and not yet seen complete.
    pub fn any_outstanding(&self) -> bool {
        (self.streams.iter()).any(|s| s.pending.is_some() || !s.recorded.is_empty())
    }

    /// True while fence `seq` of `stream` (a number a free took) may not have completed: it is
    /// still pending, or recorded and not seen complete. Fences complete in order and leave once
    /// seen complete, so any other number a free took has completed.
    pub fn outstanding(&self, stream: Stream, seq: u64) -> bool {
        self.streams
            .iter()
            .find(|s| s.stream == stream)
            .is_some_and(|slot| {
                slot.pending == Some(seq) || slot.recorded.events_of_sorted(seq, |&s| s).is_some()
            })
    }

    /// The event of `stream`'s recorded fence `seq`, if it has not been seen to complete (then it
    /// is still queued, and waiting on it orders work after the frees it covers).
    pub fn event_of(&self, stream: Stream, seq: u64) -> Option<EventHandle> {
        let slot = self.streams.iter().find(|s| s.stream == stream)?;
        let events = slot.recorded.events_of_sorted(seq, |&s| s)?;
        events.first().copied()
    }

    /// The streams whose recorded fences completed since the last poll, with their newest
    /// completed fence. A query that fails counts as not completed (tried again at the next poll).
    pub fn poll(&mut self, driver: &dyn Driver, device: usize) -> Vec<(Stream, u64)> {
        self.poll_up_to(driver, device, usize::MAX)
    }

    /// [`Fences::poll`] of at most [`POLLED_STREAMS_MAX`] streams with fences recorded, taken in
    /// turn from where the last such poll stopped: for an allocation's look, which needs some
    /// memory, not all.
    pub fn poll_some(&mut self, driver: &dyn Driver, device: usize) -> Vec<(Stream, u64)> {
        self.poll_up_to(driver, device, POLLED_STREAMS_MAX)
    }

    fn poll_up_to(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        max_streams: usize,
    ) -> Vec<(Stream, u64)> {
        let mut out = Vec::new();
        let count = self.streams.len();
        let (events, mut queried) = (&mut self.events, 0);
        for i in (0..count).map(|k| (self.poll_from + k) % count) {
            let slot = &mut self.streams[i];
            if slot.recorded.is_empty() {
                continue;
            }
            if queried == max_streams {
                self.poll_from = i;
                break;
            }
            queried += 1;
            let mut completed = None;
            slot.recorded
                .pop_completed(driver, device, events, |seq| completed = Some(seq));
            out.extend(completed.map(|seq| (slot.stream, seq)));
        }
        self.forget_streams_without_fences();
        out
    }

    /// Destroys every event (the owner is going away).
    pub fn destroy(&mut self, driver: &dyn Driver, device: usize) {
        let recorded: Vec<EventHandle> = self
            .streams
            .drain(..)
            .flat_map(|mut s| s.recorded.drain_events())
            .collect();
        self.events.give_back(recorded);
        self.events.destroy(driver, device);
    }
}

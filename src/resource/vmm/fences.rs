//! Fences of the virtual-memory resource: an event recorded on a stream when a block is freed on
//! it, so that other streams may reuse the block once the event has completed.
//!
//! Invariants: fences of one stream complete in the order they were recorded (stream order), so
//! each stream keeps a queue and only its front is queried; sequence numbers grow across all
//! streams, and a stream's completed fence number only grows; events are reused once completed.
//! The calls made here (event create, record, query) return at once.

use crate::driver::{Driver, EventHandle, Stream};
use crate::error::Result;
use std::collections::VecDeque;

#[derive(Default)]
pub(super) struct Fences {
    /// Per stream, its fences not known to have completed, oldest first.
    streams: Vec<(Stream, VecDeque<(u64, EventHandle)>)>,
    last_seq: u64,
    spare: Vec<EventHandle>,
}

impl Fences {
    /// Records a fence on `stream` now; its sequence number.
    pub fn record(&mut self, driver: &dyn Driver, device: usize, stream: Stream) -> Result<u64> {
        let event = match self.spare.pop() {
            Some(event) => event,
            None => driver.event_create(device)?,
        };
        if let Err(e) = driver.event_record(device, event, stream) {
            self.spare.push(event);
            return Err(e);
        }
        self.last_seq += 1;
        let queue = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                self.streams.push((stream, VecDeque::new()));
                &mut self.streams.last_mut().expect("just pushed").1
            }
        };
        queue.push_back((self.last_seq, event));
        Ok(self.last_seq)
    }

    /// The event of `stream`'s fence `seq`, if it has not been seen to complete (then it is still
    /// queued, and waiting on it orders work after the free it fenced).
    pub fn event_of(&self, stream: Stream, seq: u64) -> Option<EventHandle> {
        let (_, queue) = self.streams.iter().find(|(s, _)| *s == stream)?;
        let i = queue.binary_search_by_key(&seq, |&(s, _)| s).ok()?;
        Some(queue[i].1)
    }

    /// The streams whose fences completed since the last poll, with their newest completed
    /// fence. A query that fails counts as not completed (tried again at the next poll).
    pub fn poll(&mut self, driver: &dyn Driver, device: usize) -> Vec<(Stream, u64)> {
        let mut out = Vec::new();
        for (stream, queue) in &mut self.streams {
            let mut completed = None;
            while let Some(&(seq, event)) = queue.front() {
                if !driver.event_query(device, event).unwrap_or(false) {
                    break;
                }
                queue.pop_front();
                self.spare.push(event);
                completed = Some(seq);
            }
            out.extend(completed.map(|seq| (*stream, seq)));
        }
        self.streams.retain(|(_, queue)| !queue.is_empty());
        out
    }

    /// Destroys every event (the resource is going away).
    pub fn destroy(&mut self, driver: &dyn Driver, device: usize) {
        let pending = self
            .streams
            .drain(..)
            .flat_map(|(_, q)| q.into_iter().map(|(_, e)| e));
        for event in pending.chain(self.spare.drain(..)).collect::<Vec<_>>() {
            driver.event_destroy(device, event);
        }
    }
}

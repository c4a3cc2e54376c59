//! Spare events: an event whose record has completed (or whose record failed) is kept for the
//! next record instead of being destroyed, so a steady program creates none.
//!
//! Invariants: a spare is an event of this pool's device that no item waits for; the last one
//! given back is the first reused; every spare is destroyed when its owner goes away
//! ([`EventPool::destroy`]).

use crate::driver::{Driver, EventHandle, Stream};
use crate::error::Result;

#[derive(Debug, Default)]
pub(crate) struct EventPool {
    spare: Vec<EventHandle>,
}

impl EventPool {
    /// An event recorded on `stream` now: a spare, or a new one. An event whose record failed
    /// stays a spare.
    pub fn record(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        stream: Stream,
    ) -> Result<EventHandle> {
        let event = match self.spare.pop() {
            Some(event) => event,
            None => driver.event_create(device)?,
        };
        if let Err(e) = driver.event_record(device, event, stream) {
            self.spare.push(event);
            return Err(e);
        }
        Ok(event)
    }

    /// One event recorded on each of `streams`, in order; if one fails, every event taken goes
    /// back to the spares and the error is returned.
    pub fn record_each(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        streams: &[Stream],
    ) -> Result<Vec<EventHandle>> {
        let mut events = Vec::with_capacity(streams.len());
        for &stream in streams {
            match self.record(driver, device, stream) {
                Ok(event) => events.push(event),
                Err(e) => {
                    self.spare.append(&mut events);
                    return Err(e);
                }
            }
        }
        Ok(events)
    }

    /// Events no one waits for any more (completed, or the device synchronised since).
    pub fn give_back(&mut self, events: impl IntoIterator<Item = EventHandle>) {
        self.spare.extend(events);
    }

    /// Destroys the spares (their owner is going away).
    pub fn destroy(&mut self, driver: &dyn Driver, device: usize) {
        for event in self.spare.drain(..) {
            driver.event_destroy(device, event);
        }
    }
}

//! Items guarded by events, completed in the order they were queued: work on the GPU completes
//! in stream order, so only the oldest item needs a query, and a poll costs one query when
//! nothing has completed.
//!
//! Invariants: items leave in the order they were pushed, unless their owner takes them after a
//! synchronisation ([`InOrder::take_where`]); an item leaves only once every one of its events
//! has been seen complete (a query that fails counts as not complete, to be asked again), or when
//! its owner says the GPU is past it; the events of an item that left go back to the pool given.

use super::EventPool;
use crate::driver::{Driver, EventHandle};
use std::collections::VecDeque;

#[derive(Debug)]
struct Guarded<T> {
    item: T,
    events: Vec<EventHandle>,
}

#[derive(Debug)]
pub(crate) struct InOrder<T> {
    queue: VecDeque<Guarded<T>>,
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        InOrder {
            queue: VecDeque::new(),
        }
    }
}

impl<T> InOrder<T> {
    /// Queues `item`, complete once all of `events` have completed.
    pub fn push(&mut self, item: T, events: Vec<EventHandle>) {
        self.queue.push_back(Guarded { item, events });
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The newest item.
    pub fn last(&self) -> Option<&T> {
        self.queue.back().map(|g| &g.item)
    }

    /// The queued items, oldest first, with their events.
    pub fn iter(&self) -> impl Iterator<Item = (&T, &[EventHandle])> {
        self.queue.iter().map(|g| (&g.item, g.events.as_slice()))
    }

    /// Hands `each` the items whose events have all completed, oldest first, stopping at the
    /// first that has not (its events are queried in order, up to the first not complete); their
    /// events go back to `spare`.
    pub fn pop_completed(
        &mut self,
        driver: &dyn Driver,
        device: usize,
        spare: &mut EventPool,
        mut each: impl FnMut(T),
    ) {
        let done = |e: &EventHandle| driver.event_query(device, *e).unwrap_or(false);
        while let Some(front) = self.queue.front() {
            if !front.events.iter().all(done) {
                break;
            }
            let g = self.queue.pop_front().expect("a front");
            spare.give_back(g.events);
            each(g.item);
        }
    }

    /// The events of the item whose key is `key`, in a queue whose items ascend by `key_of`.
    pub fn events_of_sorted<K: Ord>(
        &self,
        key: K,
        key_of: impl Fn(&T) -> K,
    ) -> Option<&[EventHandle]> {
        let i = self
            .queue
            .binary_search_by(|g| key_of(&g.item).cmp(&key))
            .ok()?;
        Some(&self.queue[i].events)
    }

    /// Takes the items `past` says the GPU is past (the device synchronised after they were
    /// queued), whatever their events, in queue order; their events go back to `spare`.
    pub fn take_where(&mut self, past: impl Fn(&T) -> bool, spare: &mut EventPool) -> Vec<T> {
        let mut taken = Vec::with_capacity(self.queue.len());
        // The items the GPU is past are usually the oldest, a run at the front: taken off it
        // without rebuilding the queue (a synchronisation after every step did, every step).
        while let Some(front) = self.queue.front() {
            if !past(&front.item) {
                break;
            }
            let g = self.queue.pop_front().expect("a front");
            spare.give_back(g.events);
            taken.push(g.item);
        }
        if !self.queue.iter().any(|g| past(&g.item)) {
            return taken;
        }
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for g in self.queue.drain(..) {
            match past(&g.item) {
                true => {
                    spare.give_back(g.events);
                    taken.push(g.item);
                }
                false => kept.push_back(g),
            }
        }
        self.queue = kept;
        taken
    }

    /// Every queued item leaves; their events are returned for their owner to destroy or reuse.
    pub fn drain_events(&mut self) -> Vec<EventHandle> {
        self.queue.drain(..).flat_map(|g| g.events).collect()
    }
}

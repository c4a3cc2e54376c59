//! The routes PyTorch opens to its memory pools (`beginAllocateToPool` … `endAllocateToPool`)
//! on one device, and which pool, if any, claims an allocation.
//!
//! Invariants: filters run under the routes' read lock, so ending a route (the write lock) waits
//! for the filters running and none of its filter runs once `end` has returned — PyTorch's own
//! allocator holds its mutex while its filters run, and a capture's filter reads the graph it
//! belongs to; the newest route is asked first, as in PyTorch; a removed route's filter (a copy
//! of PyTorch's `std::function`) is dropped outside the lock; with no route open, asking costs
//! one atomic load.

use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::resource::graph_pool::PoolId;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Decides whether an allocation on a stream goes to a pool (PyTorch's capture filter: "is this
/// stream capturing into my graph", or "is this my thread").
pub trait StreamFilter: Send + Sync {
    fn claims(&self, stream: Stream) -> bool;
}

/// A pool and the filter that routes allocations to it.
pub type Route = (PoolId, Arc<dyn StreamFilter>);

#[derive(Default)]
pub(crate) struct Routes {
    /// Routes begun and not ended, oldest first.
    list: RwLock<Vec<Route>>,
    open: AtomicUsize,
}

impl Routes {
    /// Allocations `filter` claims go to pool `id` from now on.
    pub fn begin(&self, id: PoolId, filter: Arc<dyn StreamFilter>) {
        self.list.write().push((id, filter));
        self.open.fetch_add(1, Ordering::Release);
    }

    /// The newest route to pool `id` ends (waiting for its filter if it runs); its filter, to
    /// be dropped by the caller outside any lock.
    pub fn end(&self, id: PoolId, device: usize) -> Result<Arc<dyn StreamFilter>> {
        let mut list = self.list.write();
        let Some(at) = list.iter().rposition(|(route, _)| *route == id) else {
            return Err(Error::InvalidArgument(format!(
                "device {device}: allocations are not being routed to memory pool {id:?} \
                 (endAllocateToPool without beginAllocateToPool)"
            )));
        };
        let (_, filter) = list.remove(at);
        self.open.fetch_sub(1, Ordering::Release);
        Ok(filter)
    }

    /// True while a route is open: PyTorch opens one before it begins a graph capture.
    pub fn any_open(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    /// The pool that claims an allocation on `stream`, if any; the filters run here.
    #[inline]
    pub fn claim(&self, stream: Stream) -> Option<PoolId> {
        if self.open.load(Ordering::Acquire) == 0 {
            return None;
        }
        let list = self.list.read();
        list.iter()
            .rev()
            .find(|(_, filter)| filter.claims(stream))
            .map(|(id, _)| *id)
    }
}

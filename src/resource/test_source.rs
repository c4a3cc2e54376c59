//! A source for the tests of the layers that keep sources (the table, the device): it hands out
//! addresses of its own and records the blocks that come back.
//!
//! Invariant: it calls no driver; every block it hands out is at a new address.

use super::{Resource, Traits, Usage};
use crate::driver::{DevicePtr, Stream};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) struct TestSource {
    label: &'static str,
    cacheable: bool,
    fast_path: bool,
    next: AtomicU64,
    /// The blocks given back, in order.
    pub returned: parking_lot::Mutex<Vec<DevicePtr>>,
}

impl TestSource {
    pub fn new(label: &'static str, cacheable: bool) -> Arc<TestSource> {
        Self::with_fast_path(label, cacheable, false)
    }

    /// One whose traits say it has a fast path (its `try_` calls serve nothing).
    pub fn with_fast_path(
        label: &'static str,
        cacheable: bool,
        fast_path: bool,
    ) -> Arc<TestSource> {
        Arc::new(TestSource {
            label,
            cacheable,
            fast_path,
            next: AtomicU64::new(0),
            returned: parking_lot::Mutex::new(Vec::new()),
        })
    }
}

impl Resource for TestSource {
    fn allocate(&self, bytes: u64, _stream: Stream) -> Result<DevicePtr> {
        Ok(DevicePtr(
            0xa000_0000 + self.next.fetch_add(bytes, Ordering::Relaxed),
        ))
    }

    fn deallocate(&self, ptr: DevicePtr, _bytes: u64, _stream: Stream) -> Result<()> {
        self.returned.lock().push(ptr);
        Ok(())
    }

    fn usage(&self) -> Result<Usage> {
        Ok(Usage::default())
    }

    fn trim(&self, _keep_bytes: u64) -> Result<()> {
        Ok(())
    }

    fn traits(&self) -> Traits {
        Traits {
            label: self.label,
            cacheable: self.cacheable,
            held: true,
            shareable: false,
            returns_before_growth: false,
            fast_path: self.fast_path,
            reuses_across_streams: true,
            trims: true,
            checks_free_size: false,
            growth_granule_bytes: 1,
            frees_applied_at_sync: false,
            takes_idle_blocks: false,
            keeps_under_limit: false,
        }
    }
}

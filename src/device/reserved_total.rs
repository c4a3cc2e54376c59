//! What the device holds from CUDA in all, as PyTorch's `memory_reserved()` means it: the figure
//! that the segments of a snapshot add up to (`torch.cuda.memory_snapshot()` under install()).
//!
//! Invariant: every byte a snapshot lists is counted once — a block held from one of the
//! device's own resources or the shareable pool is inside that resource's reserved bytes; a
//! block of a PyTorch memory pool is inside one of the pool's segments, which are inside the
//! device's own resource or, where they came from elsewhere (a `MemPool`'s own allocator),
//! counted as segments; a block of any other source (graph memory: a source that reports no
//! reserved bytes) is counted as held. Read under the device lock and the pools'
//! lock in turn, so the figure is exact whenever no allocation runs meanwhile.

use super::DeviceAllocator;
use crate::error::Result;
use crate::resource::{usage_with_peaks, Resource, SourceId};
use std::collections::HashSet;
use std::sync::Arc;

/// The address of a resource, to tell whether two table entries are the same resource.
fn address(resource: &Arc<dyn Resource>) -> *const () {
    Arc::as_ptr(resource) as *const ()
}

impl DeviceAllocator {
    /// (current, peak) bytes the device holds from CUDA in all: its own resources' reserved
    /// bytes, the shareable pool's (where it is a pool of its own), segments of PyTorch's memory
    /// pools that are not inside an own resource, and blocks held from sources that report no
    /// reserved bytes. The peak is the sum of the resources' peaks and the rest's current bytes.
    pub fn reserved_total(&self) -> Result<(u64, u64)> {
        let Some(setup) = self.setup.get() else {
            return Ok((0, 0));
        };
        let mut current = 0u64;
        let mut peak = 0u64;
        let mut counted: HashSet<*const ()> = HashSet::new();
        for own in &setup.own {
            let usage = usage_with_peaks(own.as_ref())?;
            current = current.saturating_add(usage.reserved_bytes);
            peak = peak.saturating_add(usage.reserved_bytes_high);
            counted.insert(address(own));
        }
        let pool_sources: HashSet<SourceId> = self.graph_pools.source_ids().into_iter().collect();
        let held_elsewhere = {
            let st = self.state.lock();
            let sources = st.ledger.sources();
            let held = st.ledger.held_bytes_by_source(st.waits.blocks());
            held.into_iter()
                .filter(|(id, _)| !pool_sources.contains(id))
                .filter_map(|(id, bytes)| sources.get(id).ok().map(|s| (s.resource, bytes)))
                .collect::<Vec<(Arc<dyn Resource>, u64)>>()
        };
        if let Some(pool) = self.shareable_apart(setup) {
            let usage = usage_with_peaks(pool.as_ref())?;
            current = current.saturating_add(usage.reserved_bytes);
            peak = peak.saturating_add(usage.reserved_bytes_high);
            counted.insert(address(&pool));
        }
        for (resource, bytes) in held_elsewhere {
            if !counted.contains(&address(&resource)) {
                current = current.saturating_add(bytes);
                peak = peak.saturating_add(bytes);
            }
        }
        let outside = self.pool_segment_bytes_outside_own(&counted);
        current = current.saturating_add(outside);
        peak = peak.saturating_add(outside);
        Ok((current, peak.max(current)))
    }

    /// Bytes of PyTorch memory pools' segments that did not come from a resource counted already
    /// (`counted`): all of a pool whose segments come from an allocator of its own
    /// (`torch.cuda.MemPool(allocator)`).
    fn pool_segment_bytes_outside_own(&self, counted: &HashSet<*const ()>) -> u64 {
        let pools = self.graph_pools.entries();
        pools
            .iter()
            .map(|(_, pool)| {
                if counted.contains(&address(pool.parent())) {
                    return 0;
                }
                pool.with(|p| {
                    p.segments()
                        .fold(0u64, |sum, s| sum.saturating_add(s.bytes))
                })
            })
            .fold(0u64, u64::saturating_add)
    }
}

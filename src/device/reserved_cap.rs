//! The memory limit on what the device *reserves*, for resources that grow by themselves (CUDA
//! pools, [`crate::resource::Traits::returns_before_growth`]): as in PyTorch, `set_per_process_memory_fraction`
//! caps the memory the process holds from the device, not only its live and cached blocks, and
//! is checked where memory would be added (a pool that serves from its free memory is not
//! refused because a lowered limit left it above). The shareable pool of `streampool.shareable()`
//! and graph-capture memory are not counted here (the bytes of their blocks are, as held bytes).
//!
//! Invariants: under a limit, the resources of such a device grow one allocation at a time (a
//! device mutex held across the check, the allocation and the check after it), so two threads
//! never pass the check together; a growth the check cannot foresee (the pool's free memory was
//! fragmented, or freed on another stream and still pending, which serves only that stream, or
//! it grows in larger steps) is undone before the call returns — the block goes
//! back, the device is synchronised and its resources trimmed — and the request is tried once
//! more, then out of memory; without a limit nothing here runs.

use super::{limit, DeviceAllocator, DeviceSetup, Request};
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::resource::Source;

impl DeviceAllocator {
    /// Step 5: the block's source serves it; under a memory limit, a source that grows by itself
    /// only while the device's reserved memory stays within the limit.
    pub(super) fn allocate_within_reserved_cap(
        &self,
        source: &Source,
        request: Request,
    ) -> Result<DevicePtr> {
        let allocate = || self.source_allocate(source, request);
        let limit_bytes = self.limit.bytes();
        if limit_bytes == u64::MAX || !source.traits().returns_before_growth {
            return limit::allocate_or_retry(self, request, allocate);
        }
        let setup = self.setup()?;
        let block_bytes = request.block_bytes;
        let _growing = self.growing.lock();
        // A second attempt after a growth past the limit was undone: the flush may have made room.
        for _ in 0..2 {
            if !self.room_within_limit(setup, source, block_bytes, limit_bytes)? {
                break;
            }
            let before_bytes = setup.reserved_bytes()?;
            let ptr = limit::allocate_or_retry(self, request, allocate)?;
            let reserved_bytes = match setup.reserved_bytes() {
                Ok(bytes) => bytes,
                Err(e) => {
                    // The block is served; not knowing the growth only costs the check.
                    log::warn!("device {}: reading reserved memory: {e}", self.device);
                    return Ok(ptr);
                }
            };
            // Only a growth is undone: memory reserved before (a limit lowered since) is not
            // this allocation's.
            if reserved_bytes <= limit_bytes || reserved_bytes <= before_bytes {
                return Ok(ptr);
            }
            log::info!(
                "device {}: the {} grew to {reserved_bytes} B reserved for {block_bytes} B, past \
                 the memory limit of {limit_bytes} B; giving the block back",
                self.device,
                source.traits().label
            );
            if let Err(e) = source.deallocate(ptr, block_bytes, request.stream) {
                // It cannot go back: it stays the caller's, over the limit, rather than lost.
                log::warn!(
                    "device {}: returning a block past the limit: {e}",
                    self.device
                );
                return Ok(ptr);
            }
            self.flush_for_cap();
        }
        Err(self.out_of_memory(request.requested_bytes, request.stream, Some(limit_bytes)))
    }

    /// The source serves the request (step 5). While a route to a graph pool is open a capture
    /// may be under way that the device has not seen allocate (PyTorch opens the route first),
    /// in global mode on another thread: the source's calls that such a capture forbids (a
    /// mapping, a read of free memory) are then made in relaxed mode, as PyTorch makes its
    /// cudaMalloc during a capture.
    #[inline(always)]
    fn source_allocate(&self, source: &Source, request: Request) -> Result<DevicePtr> {
        if self.graph_pools.any_route_open() {
            return self.source_allocate_relaxed(source, request);
        }
        source.allocate(request.block_bytes, request.stream)
    }

    #[cold]
    #[inline(never)]
    fn source_allocate_relaxed(&self, source: &Source, request: Request) -> Result<DevicePtr> {
        crate::driver::in_relaxed_mode(self.driver.as_ref(), || {
            source.allocate(request.block_bytes, request.stream)
        })
    }

    /// True once `block_bytes` can be served from `source` within `limit_bytes` of reserved
    /// memory: at once; or after the device synchronised (frees still pending on streams are then
    /// free room of their pool); or after the resources released their unused memory; or after
    /// the cache went back too.
    fn room_within_limit(
        &self,
        setup: &DeviceSetup,
        source: &Source,
        block_bytes: u64,
        limit_bytes: u64,
    ) -> Result<bool> {
        let fits = || growth_fits(setup, source, block_bytes, limit_bytes);
        if fits()? {
            return Ok(true);
        }
        if !self.capture_possible(&self.state.lock()) {
            self.state.lock().ledger.counters_mut().num_growth_syncs += 1;
            match self.driver.synchronize(self.device) {
                Ok(()) if fits()? => return Ok(true),
                // Unused reserved memory goes before the cache does.
                Ok(()) => match setup.for_each_own(|r| r.trim(0)) {
                    Ok(()) if fits()? => return Ok(true),
                    Ok(()) => {}
                    Err(e) => log::warn!("device {}: trimming for the limit: {e}", self.device),
                },
                Err(e) => log::warn!("device {}: synchronising for the limit: {e}", self.device),
            }
        }
        self.flush_for_cap();
        fits()
    }

    /// Cached blocks back, the device synchronised, the resources trimmed: only saves memory, so
    /// a failure is logged (the check after it decides).
    fn flush_for_cap(&self) {
        if let Err(e) = self.flush(0) {
            log::warn!("device {}: freeing memory for the limit: {e}", self.device);
        }
    }
}

/// True if serving `block_bytes` from `source` needs no growth by its numbers, or keeps the
/// device's reserved bytes within `limit_bytes` were it to grow by what it lacks (rounded up to
/// its [`crate::resource::Traits::growth_granule_bytes`]).
fn growth_fits(
    setup: &DeviceSetup,
    source: &Source,
    block_bytes: u64,
    limit_bytes: u64,
) -> Result<bool> {
    let room_bytes = source.usage()?.room_bytes();
    let growth_bytes = match block_bytes.checked_sub(room_bytes) {
        None | Some(0) => return Ok(true), // no growth: nothing to check, as in PyTorch
        Some(missing) => {
            let granule_bytes = source.traits().growth_granule_bytes.max(1);
            missing
                .checked_next_multiple_of(granule_bytes)
                .unwrap_or(u64::MAX)
        }
    };
    let after_bytes = setup.reserved_bytes()?.saturating_add(growth_bytes);
    Ok(after_bytes <= limit_bytes)
}

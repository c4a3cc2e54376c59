//! A graph pool as a source of blocks: [`GraphPool`]'s books, with segments taken from the
//! device's resource on streampool's own stream.
//!
//! Invariants: a segment is added to the pool only once its allocation has completed (the
//! stream it was allocated on was synchronised), so it serves any stream at once; segments go
//! out only through [`GraphPoolResource::take_free_segments_if_unused`], while nobody uses the
//! pool, and back to their resource through [`GraphPoolResource::give_back_segments`], after a
//! device synchronisation; the pool's lock is never held across a
//! driver call.

use super::{GraphPool, PoolBlock, Segment};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::resource::{Resource, Traits, Usage};
use crate::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A PyTorch memory pool id (`c10::MempoolId_t`).
pub type PoolId = (u64, u64);

pub struct GraphPoolResource {
    device: usize,
    driver: Arc<dyn Driver>,
    /// The device's resource its segments come from.
    parent: Arc<dyn Resource>,
    /// streampool's own stream of the device: segments are allocated and returned on it.
    own_stream: Stream,
    /// Where the parent is the device's own resource and does not keep itself under the
    /// device's memory limit: the limit, which a new segment must fit under beside what the
    /// device's own resources reserve.
    limit: Option<SegmentLimit>,
    pool: Mutex<GraphPool>,
}

/// The device's memory limit as a pool's new segments meet it.
pub struct SegmentLimit {
    /// The limit (`u64::MAX`: none), shared with the device.
    pub limit_bytes: Arc<AtomicU64>,
    /// The device's own resources: what they reserve in all is measured against it.
    pub own: Vec<Arc<dyn Resource>>,
}

impl GraphPoolResource {
    /// A pool taking its segments from `parent`; `limit`: the device's, where `parent` is the
    /// device's own resource (checked only if the parent does not keep itself under it:
    /// [`Traits::keeps_under_limit`]).
    pub fn new(
        device: usize,
        driver: Arc<dyn Driver>,
        parent: Arc<dyn Resource>,
        own_stream: Stream,
        limit: Option<SegmentLimit>,
    ) -> GraphPoolResource {
        let limit = limit.filter(|_| !parent.traits().keeps_under_limit);
        GraphPoolResource {
            device,
            driver,
            parent,
            own_stream,
            limit,
            pool: Mutex::new(GraphPool::default()),
        }
    }

    /// The resource its segments come from (the device's own, or a `MemPool`'s allocator).
    pub fn parent(&self) -> &Arc<dyn Resource> {
        &self.parent
    }

    /// Runs `f` on the pool's books.
    pub fn with<T>(&self, f: impl FnOnce(&mut GraphPool) -> T) -> T {
        f(&mut self.pool.lock())
    }

    /// A block of `bytes` (a multiple of 512) for `stream`: from the pool's free ranges, else
    /// from a new segment.
    pub fn allocate_block(&self, bytes: u64, stream: Stream) -> Result<PoolBlock> {
        if let Some(block) = self.pool.lock().take(bytes, stream) {
            return Ok(block);
        }
        let segment = self.new_segment(GraphPool::segment_bytes_for(bytes)?)?;
        let mut pool = self.pool.lock();
        pool.add_segment(segment);
        pool.take(bytes, stream).ok_or_else(|| {
            Error::Internal(format!(
                "a new segment of {} B did not fit {bytes} B",
                segment.bytes
            ))
        })
    }

    /// A segment of `bytes` from the device's resource (in relaxed capture mode: a capture may
    /// be under way), allocated on streampool's stream and waited for.
    fn new_segment(&self, bytes: u64) -> Result<Segment> {
        self.check_limit(bytes)?;
        let (device, stream) = (self.device, self.own_stream);
        let mut segment = None;
        self.driver.relaxed_capture(&mut || {
            let ptr = self.parent.allocate(bytes, stream)?;
            let made = Segment { ptr, bytes };
            if let Err(e) = self.driver.stream_synchronize(device, stream) {
                let _ = self.give_back(&made);
                return Err(e);
            }
            segment = Some(made);
            Ok(())
        })?;
        segment.ok_or_else(|| Error::Internal("no segment was made".into()))
    }

    /// Out of memory if a segment of `bytes` could take what the device's own resources
    /// reserve past the device's limit (whether the parent would serve it from memory it holds
    /// free is its own to know: the device's retry after a flush makes the room, if any).
    fn check_limit(&self, bytes: u64) -> Result<()> {
        let Some(limit) = &self.limit else {
            return Ok(());
        };
        let limit_bytes = limit.limit_bytes.load(Ordering::Relaxed);
        if limit_bytes == u64::MAX {
            return Ok(());
        }
        let reserved_bytes = crate::resource::reserved_bytes_of(&limit.own)?;
        match reserved_bytes.checked_add(bytes) {
            Some(total) if total <= limit_bytes => Ok(()),
            _ => Err(Error::Driver {
                call: "cuMemAllocFromPoolAsync",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: format!(
                    "CUDA_ERROR_OUT_OF_MEMORY (a memory pool's segment of {bytes} B beside the \
                     {reserved_bytes} B reserved: more than the memory fraction allows, \
                     {limit_bytes} B)"
                ),
            }),
        }
    }

    fn give_back(&self, segment: &Segment) -> Result<()> {
        self.parent
            .deallocate(segment.ptr, segment.bytes, self.own_stream)
    }

    /// The pool's wholly free segments, taken out of it, if nobody uses the pool (no capture,
    /// no `MemPool`, no graph that may replay); none otherwise.
    pub fn take_free_segments_if_unused(&self) -> Vec<Segment> {
        let mut pool = self.pool.lock();
        match pool.is_idle() {
            true => pool.take_free_segments(),
            false => Vec::new(),
        }
    }

    /// Gives `segments` (taken out of the pool) back to where they came from; the bytes given
    /// back. Call only after a device synchronisation that began once they were taken. A
    /// segment that cannot be given back stays the pool's, for a later try.
    pub fn give_back_segments(&self, segments: Vec<Segment>) -> Result<u64> {
        let mut first_error = Ok(());
        let mut released_bytes = 0;
        for s in segments {
            match self.give_back(&s) {
                Ok(()) => released_bytes += s.bytes,
                Err(e) => {
                    self.pool.lock().add_segment(s);
                    first_error = first_error.and(Err(e));
                }
            }
        }
        first_error.map(|()| released_bytes)
    }
}

impl Resource for GraphPoolResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        self.allocate_block(bytes, stream).map(|b| b.ptr)
    }

    /// The block goes back into the pool, for the pool's later allocations only.
    fn deallocate(&self, ptr: DevicePtr, bytes: u64, _stream: Stream) -> Result<()> {
        self.pool.lock().give(ptr, bytes).map(|_| ())
    }

    fn usage(&self) -> Result<Usage> {
        let pool = self.pool.lock();
        Ok(Usage {
            reserved_bytes: pool.reserved_bytes(),
            used_bytes: pool.live_bytes(),
        })
    }

    /// Nothing: a pool gives memory back only once nobody uses it
    /// ([`GraphPoolResource::take_free_segments_if_unused`]).
    fn trim(&self, _keep_bytes: u64) -> Result<()> {
        Ok(())
    }

    fn traits(&self) -> Traits {
        Traits {
            label: "PyTorch memory pool",
            // Only the pool may reuse its blocks.
            cacheable: false,
            // Its blocks wait for the other streams that used them, and count against the limit.
            held: true,
            shareable: false,
            returns_before_growth: false,
            fast_path: false,
            // As PyTorch's private pools: a freed range serves the stream that freed it.
            reuses_across_streams: false,
            // Its segments go back once nobody uses the pool (graphs may replay them).
            trims: false,
            checks_free_size: true,
            growth_granule_bytes: 1,
            frees_applied_at_sync: false,
            takes_idle_blocks: false,
            keeps_under_limit: false,
        }
    }
}

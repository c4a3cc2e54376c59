//! The process allocator's entries for PyTorch's memory pools and the answers PyTorch's C++ side
//! asks for (`cacheInfo`): device checks here, the work in `device/graph_pools.rs`.
//!
//! Invariant: as in [`crate::allocator`], every entry checks its device before anything changes.

use crate::allocator::{disabling_on_error, Allocator, MAX_ALLOCATION_BYTES};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::resource::foreign::{ForeignFree, ForeignMalloc, ForeignResource};
use crate::resource::graph_pool::PoolId;

impl Allocator {
    /// Allocates `bytes` on `device` like [`Allocator::malloc`], into PyTorch memory pool `pool`
    /// if one claimed the allocation.
    pub fn malloc_into(
        &self,
        bytes: u64,
        device: i64,
        stream: Stream,
        pool: Option<PoolId>,
    ) -> Result<DevicePtr> {
        let d = self.device(device)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if bytes > MAX_ALLOCATION_BYTES {
            return Err(d.out_of_memory_above(bytes, stream, MAX_ALLOCATION_BYTES));
        }
        let Some(id) = pool else {
            return match self.malloc(bytes, device, stream) {
                Err(Error::OutOfMemory(report)) => d
                    .allocate_from_oom_pools(bytes, stream)
                    .ok_or(Error::OutOfMemory(report)),
                other => other,
            };
        };
        disabling_on_error(d, d.allocate_in_graph_pool(id, bytes, stream))
    }

    /// The PyTorch memory pool that claims an allocation on `stream` of `device`, if any: the
    /// filters PyTorch passed run here (outside any lock of the device but the routes' own).
    #[inline]
    pub fn graph_pool_claiming(&self, device: i64, stream: Stream) -> Option<PoolId> {
        self.device(device).ok()?.graph_pool_claiming(stream)
    }

    /// The ids of `device`'s memory pools.
    pub fn graph_pool_ids(&self, device: i64) -> Result<Vec<PoolId>> {
        Ok(self.device(device)?.graph_pool_ids())
    }

    pub fn begin_allocate_to_pool(
        &self,
        device: i64,
        id: PoolId,
        filter: std::sync::Arc<dyn crate::device::StreamFilter>,
    ) -> Result<()> {
        self.device(device)?.begin_allocate_to_pool(id, filter)
    }

    pub fn end_allocate_to_pool(&self, device: i64, id: PoolId) -> Result<()> {
        self.device(device)?.end_allocate_to_pool(id)
    }

    pub fn release_pool(&self, device: i64, id: PoolId) -> Result<()> {
        self.device(device)?.release_pool(id)
    }

    pub fn graph_pool_create_or_incref(&self, device: i64, id: PoolId) -> Result<()> {
        self.device(device)?.graph_pool_create_or_incref(id)
    }

    /// `createOrIncrefPool` for a `torch.cuda.MemPool(allocator)`: pool `id`'s segments come from
    /// the allocator's `malloc` and go back through its `free`.
    ///
    /// # Safety
    /// As `ForeignResource::new`: a matching pair, callable from any thread while the pool
    /// may hold memory of it, that does not unwind.
    pub unsafe fn graph_pool_create_or_incref_with_allocator(
        &self,
        device: i64,
        id: PoolId,
        malloc: ForeignMalloc,
        free: ForeignFree,
    ) -> Result<()> {
        let d = self.device(device)?;
        let index = usize::try_from(device)
            .map_err(|_| Error::InvalidArgument(format!("device {device} does not exist")))?;
        // SAFETY: as the caller promises.
        let parent = unsafe { ForeignResource::new(index, malloc, free) };
        d.graph_pool_create_or_incref_from(id, std::sync::Arc::new(parent))
    }

    pub fn graph_pool_use_count(&self, device: i64, id: PoolId) -> Result<u32> {
        Ok(self.device(device)?.graph_pool_use_count(id))
    }

    pub fn graph_pool_set_no_split(&self, device: i64, id: PoolId) -> Result<()> {
        self.device(device)?.graph_pool_set_no_split(id)
    }

    pub fn graph_pool_set_use_on_oom(&self, device: i64, id: PoolId, on: bool) -> Result<()> {
        self.device(device)?.graph_pool_set_use_on_oom(id, on)
    }

    /// The live blocks of pool `id`: (address, requested bytes, block bytes, stream).
    pub fn graph_pool_live_blocks(
        &self,
        device: i64,
        id: PoolId,
    ) -> Result<Vec<(DevicePtr, u64, u64, Stream)>> {
        self.device(device)?.graph_pool_live_blocks(id)
    }

    /// The segments of pool `id`: (address, bytes).
    pub fn graph_pool_segments(&self, device: i64, id: PoolId) -> Result<Vec<(DevicePtr, u64)>> {
        self.device(device)?.graph_pool_segments(id)
    }

    /// Makes a checkpointed block of pool `id` live again at `ptr`.
    pub fn restore_in_graph_pool(
        &self,
        device: i64,
        id: PoolId,
        ptr: DevicePtr,
        requested_bytes: u64,
        block_bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let d = self.device(device)?;
        d.restore_in_graph_pool(id, ptr, requested_bytes, block_bytes, stream)
    }

    /// `cacheInfo`: the largest block `device` could serve now — its free memory plus what
    /// streampool holds there unused (cached, or reserved by its resources and not handed out).
    pub fn cache_info_bytes(&self, device: i64) -> Result<u64> {
        let stats = self.stats(device)?;
        let free = self.driver_mem_info(device)?.free_bytes;
        let unused = stats
            .reserved_bytes
            .saturating_sub(stats.pool_used_bytes)
            .saturating_add(stats.cached_bytes);
        Ok(free.saturating_add(unused))
    }

    /// (total, free) bytes of `device`.
    pub fn device_memory(&self, device: i64) -> Result<(u64, u64)> {
        let mem = self.driver_mem_info(device)?;
        Ok((mem.total_bytes, mem.free_bytes))
    }

    /// An error naming `device` unless it exists.
    pub fn check_device(&self, device: i64) -> Result<()> {
        self.device(device).map(|_| ())
    }

    /// True while the memory timeline records.
    pub fn history_enabled(&self) -> bool {
        self.history_recording()
    }
}

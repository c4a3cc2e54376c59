//! The CUDA edge: everything streampool asks of the GPU goes through the [`Driver`] trait.
//!
//! Invariant: implementations hold no allocation policy. `cuda` forwards to the CUDA driver API;
//! `sim` reproduces its stream-ordered semantics on the host so every layer above runs in CI.

pub mod cuda;
pub mod sim;

use crate::error::Result;

/// A raw `CUstream` / `cudaStream_t` value; 0 is the legacy default stream.
pub type Stream = usize;
/// A device address.
pub type DevicePtr = u64;
/// Opaque bytes CUDA hands out for another process (`CUmemPoolPtrExportData`, `CUipcEventHandle`).
pub type IpcBytes = [u8; 64];

/// Opaque handle of a memory pool created by a driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolHandle(pub usize);

/// Opaque handle of an event created by a driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(pub usize);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The pool's own accounting (`CU_MEMPOOL_ATTR_*_MEM_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    pub reserved_bytes: u64,
    pub reserved_bytes_high: u64,
    pub used_bytes: u64,
    pub used_bytes_high: u64,
}

/// Settable pool attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAttr {
    ReleaseThresholdBytes(u64),
    ReuseFollowEventDependencies(bool),
    ReuseAllowOpportunistic(bool),
    ReuseAllowInternalDependencies(bool),
}

/// The operations streampool needs from CUDA. Every method that touches a device takes its index
/// so the implementation can make the right context current on the calling thread.
pub trait Driver: IpcDriver + Send + Sync {
    fn name(&self) -> &'static str;
    fn device_count(&self) -> Result<usize>;
    fn mem_info(&self, device: usize) -> Result<MemInfo>;
    /// True if `device` supports stream-ordered memory pools.
    fn pools_supported(&self, device: usize) -> Result<bool>;

    /// Creates an explicit pool on `device`; `max_size_bytes == u64::MAX` means unlimited. A
    /// `shareable` pool can be exported to other processes as a POSIX file descriptor.
    fn pool_create(
        &self,
        device: usize,
        max_size_bytes: u64,
        shareable: bool,
    ) -> Result<PoolHandle>;
    fn pool_set_attr(&self, device: usize, pool: PoolHandle, attr: PoolAttr) -> Result<()>;
    fn pool_usage(&self, device: usize, pool: PoolHandle) -> Result<PoolUsage>;
    /// (reserved, used) bytes only: two attribute reads on the allocation path instead of four.
    fn pool_reserved_used(&self, device: usize, pool: PoolHandle) -> Result<(u64, u64)>;
    /// Resets the reserved and used high-water marks to the current values.
    fn pool_reset_peaks(&self, device: usize, pool: PoolHandle) -> Result<()>;
    fn pool_trim(&self, device: usize, pool: PoolHandle, keep_bytes: u64) -> Result<()>;

    /// `cuMemAllocFromPoolAsync`. Out of memory is `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn alloc_async(
        &self,
        device: usize,
        pool: PoolHandle,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr>;
    /// Allocation on a capturing stream: becomes a graph allocation node (`cuMemAllocAsync`).
    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr>;
    /// `cuMemFreeAsync`: the memory returns to its pool once `stream` reaches this point.
    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()>;
    /// Waits for all work on the device.
    fn synchronize(&self, device: usize) -> Result<()>;
    /// Waits for all work submitted to `stream` so far.
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()>;

    fn event_create(&self, device: usize) -> Result<EventHandle>;
    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()>;
    /// True once all work captured by the event's last record has completed.
    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool>;
    fn event_destroy(&self, device: usize, event: EventHandle);

    /// True while `stream` is being captured into a CUDA graph.
    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool>;

    /// True if `peer` can access memory resident on `device` (`cuDeviceCanAccessPeer`).
    fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool>;
    /// Lets `peer` read and write every allocation, present and future, of `device`'s `pool`
    /// (`cuMemPoolSetAccess`; pool memory ignores `cuCtxEnablePeerAccess`).
    fn pool_grant_access(&self, device: usize, pool: PoolHandle, peer: usize) -> Result<()>;
}

/// The part of [`Driver`] that shares pool memory with other processes
/// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`); implemented next to each driver in `ipc.rs`.
pub trait IpcDriver {
    /// True if `device`'s pools can be shared through POSIX file descriptors.
    fn ipc_supported(&self, device: usize) -> Result<bool>;
    /// A new file descriptor for a shareable `pool` (`cuMemPoolExportToShareableHandle`); the
    /// caller owns it.
    fn pool_export_fd(&self, device: usize, pool: PoolHandle) -> Result<i32>;
    /// Imports another process's pool from `fd` (`cuMemPoolImportFromShareableHandle`); the fd
    /// stays the caller's.
    fn pool_import_fd(&self, device: usize, fd: i32) -> Result<PoolHandle>;
    /// What another process needs to import `ptr` (`cuMemPoolExportPointer`).
    fn pointer_export(&self, device: usize, ptr: DevicePtr) -> Result<IpcBytes>;
    /// Maps an exported allocation of an imported pool (`cuMemPoolImportPointer`); it is released
    /// with `free_async`, which the importer must do before the exporter frees it.
    fn pointer_import(&self, device: usize, pool: PoolHandle, data: &IpcBytes)
        -> Result<DevicePtr>;
    /// Records a new interprocess event on `stream`: the event (destroy it with
    /// `event_destroy`) and the handle another process opens.
    fn ipc_event_record(&self, device: usize, stream: Stream) -> Result<(EventHandle, IpcBytes)>;
    /// Makes `stream` wait for another process's event.
    fn ipc_event_wait(&self, device: usize, stream: Stream, handle: &IpcBytes) -> Result<()>;
}

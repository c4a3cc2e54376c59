//! The CUDA edge: everything streampool asks of the GPU goes through the [`Driver`] trait, made
//! of one sub-trait per role — the device itself, stream-ordered pools, streams and events, peer
//! access, sharing with other processes, virtual memory, managed memory.
//!
//! Invariant: implementations hold no allocation policy. `cuda` forwards to the CUDA driver API;
//! `sim` (cargo feature `sim`) reproduces its semantics on the host so every layer above runs in
//! CI. Handles are opaque: only the driver that made one can look inside it.

pub mod cuda;
#[cfg(feature = "sim")]
pub mod sim;

use crate::error::Result;
use std::fmt;

/// A raw `CUstream` / `cudaStream_t` value; 0 is the legacy default stream.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Stream(pub usize);

impl Stream {
    /// The legacy default stream: its work waits for the work queued before it on every
    /// blocking stream (PyTorch's default stream is this one), and theirs for its.
    pub const LEGACY: Stream = Stream(0);

    /// False for the legacy default stream, which CUDA refuses to capture into a graph, so that
    /// asking the driver whether it captures is pointless (and fails while a blocking stream
    /// captures); true for every other stream. (`cudaStreamLegacy`'s own handle, 1, is not
    /// told apart: PyTorch passes 0 for its default stream.)
    #[inline]
    pub fn may_be_captured(self) -> bool {
        self != Stream::LEGACY
    }
}

/// A device address; 0 is NULL.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on (addresses are below 2^64 by construction).
    #[inline]
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

impl fmt::LowerHex for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::LowerHex for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// Opaque bytes CUDA hands out for another process (`CUmemPoolPtrExportData`, `CUipcEventHandle`).
pub type IpcBytes = [u8; 64];

/// Declares an opaque handle type: only drivers (in this crate) make one from a raw value.
macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(usize);

        impl $name {
            pub(crate) fn from_raw(raw: usize) -> $name {
                $name(raw)
            }

            /// The driver's own value (a pointer for CUDA, an index for the simulator).
            pub fn raw(self) -> usize {
                self.0
            }
        }
    };
}

handle!(
    /// A memory pool created or imported by a driver.
    PoolHandle
);
handle!(
    /// An event created by a driver.
    EventHandle
);
handle!(
    /// A physical memory allocation (`CUmemGenericAllocationHandle`), mapped with `mem_map`.
    MemHandle
);
handle!(
    /// Page-locked host memory (registered, or `cuMemAllocHost`), where a sleeping device's
    /// memory waits.
    HostBuffer
);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// A pool's own accounting (`CU_MEMPOOL_ATTR_*_MEM_*`), or a resource's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    pub reserved_bytes: u64,
    pub reserved_bytes_high: u64,
    pub used_bytes: u64,
    pub used_bytes_high: u64,
}

impl PoolUsage {
    /// Both usages added (high-water marks too: an upper bound of the sum's).
    pub fn plus(self, other: PoolUsage) -> PoolUsage {
        PoolUsage {
            reserved_bytes: self.reserved_bytes + other.reserved_bytes,
            reserved_bytes_high: self.reserved_bytes_high + other.reserved_bytes_high,
            used_bytes: self.used_bytes + other.used_bytes,
            used_bytes_high: self.used_bytes_high + other.used_bytes_high,
        }
    }
}

/// Settable pool attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAttr {
    ReleaseThresholdBytes(u64),
    ReuseFollowEventDependencies(bool),
    ReuseAllowOpportunistic(bool),
    ReuseAllowInternalDependencies(bool),
}

/// Everything streampool needs from CUDA. Every method that touches a device takes its index so
/// the implementation can make the right context current on the calling thread.
pub trait Driver:
    DeviceDriver
    + PoolDriver
    + StreamDriver
    + PeerDriver
    + IpcDriver
    + VmmDriver
    + ManagedDriver
    + Send
    + Sync
{
}

impl<T> Driver for T where
    T: DeviceDriver
        + PoolDriver
        + StreamDriver
        + PeerDriver
        + IpcDriver
        + VmmDriver
        + ManagedDriver
        + Send
        + Sync
{
}

/// The devices themselves.
pub trait DeviceDriver {
    fn name(&self) -> &'static str;
    fn device_count(&self) -> Result<usize>;
    fn mem_info(&self, device: usize) -> Result<MemInfo>;
    /// Waits for all work on the device.
    fn synchronize(&self, device: usize) -> Result<()>;
    /// Microseconds on a monotonic clock (how long memory has stayed unused, how long a device
    /// has been idle, how old a fence is); the simulator's can be stopped and moved by tests.
    fn now_us(&self) -> u64;
    /// The same clock in milliseconds.
    fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }
}

/// Microseconds since the first call in this process, on the monotonic clock.
pub fn monotonic_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// `f`'s value, `f` run in this thread's relaxed capture mode ([`StreamDriver::relaxed_capture`]);
/// the error of entering that mode, if it could not be entered.
pub fn in_relaxed_mode<T>(
    driver: &(impl StreamDriver + ?Sized),
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let (mut f, mut value) = (Some(f), None);
    let entered = driver.relaxed_capture(&mut || {
        value = f.take().map(|f| f());
        Ok(())
    });
    entered?;
    value.unwrap_or_else(|| {
        Err(crate::error::Error::Internal(
            "relaxed_capture did not run its function".into(),
        ))
    })
}

/// Stream-ordered memory pools (`cuMemPool*`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`).
pub trait PoolDriver {
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
    /// Destroys a pool this driver created; memory still allocated from it is released once
    /// freed (as `cuMemPoolDestroy`).
    fn pool_destroy(&self, device: usize, pool: PoolHandle) -> Result<()>;
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
    /// `cuMemFreeAsync`: the memory returns to its pool once `stream` reaches this point.
    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()>;
}

/// Streams, events and graph capture.
pub trait StreamDriver {
    /// Waits for all work submitted to `stream` so far.
    fn stream_synchronize(&self, device: usize, stream: Stream) -> Result<()>;
    fn event_create(&self, device: usize) -> Result<EventHandle>;
    fn event_record(&self, device: usize, event: EventHandle, stream: Stream) -> Result<()>;
    /// True once all work captured by the event's last record has completed.
    fn event_query(&self, device: usize, event: EventHandle) -> Result<bool>;
    /// Waits until all work captured by the event's last record has completed
    /// (`cuEventSynchronize`).
    fn event_synchronize(&self, device: usize, event: EventHandle) -> Result<()>;
    fn event_destroy(&self, device: usize, event: EventHandle);
    /// True once all work submitted to `stream` so far has completed (`cuStreamQuery`); a stream
    /// that is capturing a graph cannot be queried (an error).
    fn stream_query(&self, device: usize, stream: Stream) -> Result<bool>;
    /// Work submitted to `stream` from now on waits until the event's last record has completed
    /// (`cuStreamWaitEvent`); returns at once.
    fn stream_wait_event(&self, device: usize, stream: Stream, event: EventHandle) -> Result<()>;
    /// True while `stream` is being captured into a CUDA graph.
    fn is_capturing(&self, device: usize, stream: Stream) -> Result<bool>;
    /// Allocation on a capturing stream: becomes a graph allocation node (`cuMemAllocAsync` from
    /// the device's default pool); freed with `free_async`.
    fn alloc_captured(&self, device: usize, bytes: u64, stream: Stream) -> Result<DevicePtr>;
    /// A new stream of `device` for streampool's own work, which does not synchronise with the
    /// legacy default stream (`CU_STREAM_NON_BLOCKING`); it lives as long as the process.
    fn stream_create(&self, device: usize) -> Result<Stream>;
    /// Runs `f` with this thread's stream-capture mode relaxed, so that the calls it makes for
    /// streampool's own bookkeeping (allocating on and waiting for streampool's own stream) are
    /// allowed while a graph is being captured, and do not invalidate that capture.
    fn relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()>;
}

/// Access to one device's memory from another.
pub trait PeerDriver {
    /// True if `peer` can access memory resident on `device` (`cuDeviceCanAccessPeer`).
    fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool>;
    /// Lets `peer` read and write every allocation, present and future, of `device`'s `pool`
    /// (`cuMemPoolSetAccess`; pool memory ignores `cuCtxEnablePeerAccess`).
    fn pool_grant_access(&self, device: usize, pool: PoolHandle, peer: usize) -> Result<()>;
}

/// Sharing pool memory with other processes (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`);
/// implemented next to each driver in `ipc.rs`.
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

/// Managed (unified) memory (`cuMemAllocManaged`, `cuMemFree`); implemented next to each driver
/// in `managed.rs`. Neither call is stream-ordered, and `cuMemFree` first waits for all work on
/// the device (an implicit synchronisation): a caller frees only memory no queued work uses, and
/// never while a stream of the device captures a graph.
pub trait ManagedDriver {
    /// True if `device` supports managed memory (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`).
    fn managed_supported(&self, device: usize) -> Result<bool>;
    /// `bytes` of managed memory, usable from the host and from every device and stream
    /// (`CU_MEM_ATTACH_GLOBAL`). Out of memory is `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn mem_alloc_managed(&self, device: usize, bytes: u64) -> Result<DevicePtr>;
    /// Frees memory `mem_alloc_managed` returned (`cuMemFree`).
    fn mem_free(&self, device: usize, ptr: DevicePtr) -> Result<()>;
}

/// Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, ...); implemented
/// next to each driver in `vmm.rs`. None of these calls is stream-ordered: `mem_unmap` must wait
/// until no work on any stream still uses the range, and `mem_unmap` / `mem_set_access` behave
/// synchronously.
pub trait VmmDriver {
    /// True if `device` supports virtual memory management.
    fn vmm_supported(&self, device: usize) -> Result<bool>;
    /// The recommended granularity of physical allocations and mappings on `device`, in bytes.
    fn vmm_granularity_bytes(&self, device: usize) -> Result<u64>;
    /// Reserves `bytes` (a multiple of the granularity) of virtual addresses, unbacked.
    fn address_reserve(&self, device: usize, bytes: u64) -> Result<DevicePtr>;
    /// Frees a reservation made by `address_reserve`; nothing may be mapped in it.
    fn address_free(&self, device: usize, base: DevicePtr, bytes: u64) -> Result<()>;
    /// Allocates `bytes` (a multiple of the granularity) of physical memory on `device`. Out of
    /// memory is `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn mem_create(&self, device: usize, bytes: u64) -> Result<MemHandle>;
    /// Releases a physical allocation that is no longer mapped.
    fn mem_release(&self, device: usize, handle: MemHandle) -> Result<()>;
    /// Maps all of `handle` (`bytes` long) at `at`, inside a reservation, where nothing is mapped.
    fn mem_map(&self, device: usize, at: DevicePtr, bytes: u64, handle: MemHandle) -> Result<()>;
    /// Unmaps `[at, at + bytes)`, which must be whole mappings.
    fn mem_unmap(&self, device: usize, at: DevicePtr, bytes: u64) -> Result<()>;
    /// Gives each of `devices` read/write access to the mapped range `[at, at + bytes)`.
    fn mem_set_access(
        &self,
        device: usize,
        at: DevicePtr,
        bytes: u64,
        devices: &[usize],
    ) -> Result<()>;
    /// True if physical memory of `device` can be created exportable to a POSIX file descriptor
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`).
    fn mem_export_supported(&self, device: usize) -> Result<bool>;
    /// [`VmmDriver::mem_create`] for memory that other processes can map: exportable to a POSIX
    /// file descriptor ([`VmmDriver::mem_export_fd`]).
    fn mem_create_exportable(&self, device: usize, bytes: u64) -> Result<MemHandle>;
    /// A new file descriptor for an exportable `handle` (`cuMemExportToShareableHandle`); the
    /// caller owns it.
    fn mem_export_fd(&self, device: usize, handle: MemHandle) -> Result<i32>;
    /// A handle to the physical memory another process exported as `fd`
    /// (`cuMemImportFromShareableHandle`; the fd stays the caller's); released with
    /// [`VmmDriver::mem_release`] once unmapped.
    fn mem_import_fd(&self, device: usize, fd: i32) -> Result<MemHandle>;
    /// `bytes` of page-locked host memory (registered, or `cuMemAllocHost`), with `device`'s
    /// context current.
    /// Out of memory is `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn host_alloc(&self, device: usize, bytes: u64) -> Result<HostBuffer>;
    /// Frees page-locked host memory from [`VmmDriver::host_alloc`].
    fn host_free(&self, device: usize, buffer: HostBuffer);
    /// Copies `bytes` of mapped device memory at `src` into `dst` at `dst_offset` on `stream`
    /// (`cuMemcpyDtoHAsync`): done once the stream's work up to here completes
    /// ([`StreamDriver::stream_synchronize`]); until then neither range may change or go away.
    fn copy_to_host(
        &self,
        device: usize,
        dst: HostBuffer,
        dst_offset: u64,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> Result<()>;
    /// Copies `bytes` of `src` from `src_offset` into mapped device memory at `dst` on `stream`
    /// (`cuMemcpyHtoDAsync`), done as [`VmmDriver::copy_to_host`] is.
    fn copy_to_device(
        &self,
        device: usize,
        dst: DevicePtr,
        src: HostBuffer,
        src_offset: u64,
        bytes: u64,
        stream: Stream,
    ) -> Result<()>;
}

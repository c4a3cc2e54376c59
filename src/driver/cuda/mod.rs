//! The real CUDA edge: the driver API through `cudarc`'s dynamically loaded bindings.
//!
//! Invariants: libcuda is looked up once, and its absence is an error, never a panic; every call
//! that needs a context first makes the device's primary context current on this thread
//! (autograd's backward thread has none) and restores the thread's previous context afterwards.

#[cfg(feature = "call-counts")]
pub(crate) mod call_counts;
mod host;
mod ipc;
mod managed;
mod streams;
mod vmm;

use super::{
    DeviceDriver, DevicePtr, EventHandle, MemInfo, PeerDriver, PoolAttr, PoolDriver, PoolHandle,
    PoolUsage, Stream,
};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CStr;
use std::sync::OnceLock;

/// A device's retained primary context, shared by PyTorch and streampool.
#[derive(Clone, Copy)]
struct PrimaryContext(sys::CUcontext);
// SAFETY: a CUcontext is a process-wide handle; the driver API is thread-safe.
unsafe impl Send for PrimaryContext {}
// SAFETY: as for Send: the handle is only passed to the driver, which is thread-safe.
unsafe impl Sync for PrimaryContext {}

pub struct CudaDriver {
    devices: Vec<sys::CUdevice>,
    contexts: Vec<OnceLock<PrimaryContext>>,
}

/// A size the driver's `size_t` cannot hold (only on targets where `usize` is narrower than 64 bits).
fn too_large(bytes: u64) -> Error {
    Error::InvalidArgument(format!("{bytes} bytes does not fit the driver's size_t"))
}

fn check(call: &'static str, result: sys::CUresult) -> Result<()> {
    #[cfg(feature = "call-counts")]
    call_counts::count(call);
    if result == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it NULL.
    unsafe { sys::cuGetErrorName(result, &mut name_ptr) };
    let name = if name_ptr.is_null() {
        format!("{result:?}")
    } else {
        // SAFETY: non-NULL pointers from cuGetErrorName are static NUL-terminated strings.
        unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned()
    };
    Err(Error::Driver {
        call,
        code: result as i32,
        name,
    })
}

/// The result of the driver call `f` makes; a diagnostic build (`--features call-counts`) adds
/// the call's wall time to its name's total.
#[inline(always)]
fn time(call: &'static str, f: impl FnOnce() -> sys::CUresult) -> sys::CUresult {
    #[cfg(feature = "call-counts")]
    let start = std::time::Instant::now();
    let result = f();
    #[cfg(feature = "call-counts")]
    call_counts::add_time(call, start.elapsed());
    #[cfg(not(feature = "call-counts"))]
    let _ = call;
    result
}

/// The driver call `f` makes, timed ([`time`]) and checked as [`check`] does.
#[inline(always)]
fn timed(call: &'static str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    check(call, time(call, f))
}

/// The query `f` makes (`cuEventQuery`, `cuStreamQuery`), timed ([`time`]): true if the work is
/// done, false if not yet ("not ready" counted too in a diagnostic build).
#[inline(always)]
fn timed_query(call: &'static str, f: impl FnOnce() -> sys::CUresult) -> Result<bool> {
    match time(call, f) {
        sys::CUresult::CUDA_ERROR_NOT_READY => {
            #[cfg(feature = "call-counts")]
            call_counts::count(call);
            Ok(false)
        }
        other => check(call, other).map(|()| true),
    }
}

fn stream_ptr(stream: Stream) -> sys::CUstream {
    stream.0 as sys::CUstream
}

fn pool_ptr(pool: PoolHandle) -> sys::CUmemoryPool {
    pool.raw() as sys::CUmemoryPool
}

fn event_ptr(event: EventHandle) -> sys::CUevent {
    event.raw() as sys::CUevent
}

/// Runs `f` with this thread's stream-capture mode relaxed. A graph that another thread (or this
/// one, in global mode) is capturing would otherwise make the "potentially unsafe" calls
/// streampool makes for its own bookkeeping — waiting for a stream or a device, querying or
/// recording an event on a stream that is not capturing, mapping and unmapping memory — fail and
/// invalidate that capture. (Calls that conflict with a capture, such as querying an event recorded inside it,
/// still fail; streampool does not make them.)
pub(super) fn relaxed<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: valid in/out pointer; the previous mode is restored below.
    check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    })?;
    let outcome = f();
    // SAFETY: puts back the mode the thread had.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    outcome
}

/// Restores the thread's previous context when dropped.
struct ContextScope(Option<sys::CUcontext>);

impl Drop for ContextScope {
    fn drop(&mut self) {
        if let Some(previous) = self.0 {
            // SAFETY: `previous` was current on this thread a moment ago and is still alive.
            unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

impl CudaDriver {
    /// Loads libcuda, initialises it and enumerates devices.
    pub fn new() -> Result<CudaDriver> {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::DriverUnavailable(
                "libcuda.so.1 was not found: streampool's cuda driver needs the NVIDIA driver installed \
                 (set STREAMPOOL_DRIVER=sim to use the simulated driver on a machine without a GPU)"
                    .into(),
            ));
        }
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            check("cuInit", sys::cuInit(0))?;
            let mut count = 0;
            check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
            let mut devices = Vec::with_capacity(count as usize);
            for i in 0..count {
                let mut dev = 0;
                check("cuDeviceGet", sys::cuDeviceGet(&mut dev, i))?;
                devices.push(dev);
            }
            let contexts = devices.iter().map(|_| OnceLock::new()).collect();
            Ok(CudaDriver { devices, contexts })
        }
    }

    fn primary_context(&self, device: usize) -> Result<sys::CUcontext> {
        if let Some(ctx) = self.contexts[device].get() {
            return Ok(ctx.0);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: retaining a primary context is idempotent apart from its reference count; a
        // racing thread retains once more, which only keeps the context alive longer.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, self.devices[device])
        })?;
        Ok(self.contexts[device].get_or_init(|| PrimaryContext(ctx)).0)
    }

    /// Makes `device`'s primary context current until the returned scope ends.
    fn enter(&self, device: usize) -> Result<ContextScope> {
        let wanted = self.primary_context(device)?;
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current == wanted {
            return Ok(ContextScope(None));
        }
        // SAFETY: `wanted` is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(wanted) })?;
        // A thread that had no context keeps ours: the next call on it needs no switch.
        Ok(ContextScope((!current.is_null()).then_some(current)))
    }

    fn get_attr(&self, pool: PoolHandle, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let mut value: u64 = 0;
        // SAFETY: the usage attributes are cuuint64_t, matching `value`.
        check("cuMemPoolGetAttribute", unsafe {
            sys::cuMemPoolGetAttribute(pool_ptr(pool), attr, &mut value as *mut u64 as *mut _)
        })?;
        Ok(value)
    }

    fn device_attr(&self, device: usize, attr: sys::CUdevice_attribute) -> Result<i32> {
        let mut value = 0;
        // SAFETY: valid out-pointer and device handle.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut value, attr, self.devices[device])
        })?;
        Ok(value)
    }
}

impl DeviceDriver for CudaDriver {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn now_us(&self) -> u64 {
        super::monotonic_us()
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo> {
        let _scope = self.enter(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the device's context is current.
        timed("cuMemGetInfo", || unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free_bytes: free as u64,
            total_bytes: total as u64,
        })
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        let _scope = self.enter(device)?;
        // Relaxed: a capture in global mode on another device (or thread) is left alone.
        relaxed(|| {
            // SAFETY: the device's context is current.
            timed("cuCtxSynchronize", || unsafe { sys::cuCtxSynchronize() })
        })
    }
}

impl PoolDriver for CudaDriver {
    fn pools_supported(&self, device: usize) -> Result<bool> {
        let supported = self.device_attr(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )?;
        Ok(supported != 0)
    }

    fn pool_create(
        &self,
        device: usize,
        max_size_bytes: u64,
        shareable: bool,
    ) -> Result<PoolHandle> {
        if !self.pools_supported(device)? {
            return Err(Error::DriverUnavailable(format!(
                "device {device} does not support CUDA memory pools (cuMemAllocFromPoolAsync); streampool needs CUDA 11.2+ and a supported GPU"
            )));
        }
        let _scope = self.enter(device)?;
        // SAFETY: CUmemPoolProps is plain data; all-zero is a valid starting value.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = if shareable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        };
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device as i32;
        props.maxSize = if max_size_bytes == u64::MAX {
            0
        } else {
            max_size_bytes as usize
        };
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: props is fully initialised; pool is a valid out-pointer.
        check("cuMemPoolCreate", unsafe {
            sys::cuMemPoolCreate(&mut pool, &props)
        })?;
        Ok(PoolHandle::from_raw(pool as usize))
    }

    fn pool_destroy(&self, device: usize, pool: PoolHandle) -> Result<()> {
        let _scope = self.enter(device)?;
        // SAFETY: a pool this driver created, not used by streampool after this call.
        check("cuMemPoolDestroy", unsafe {
            sys::cuMemPoolDestroy(pool_ptr(pool))
        })
    }

    fn pool_set_attr(&self, _device: usize, pool: PoolHandle, attr: PoolAttr) -> Result<()> {
        use sys::CUmemPool_attribute::*;
        let pool = pool_ptr(pool);
        // SAFETY: the release threshold is a cuuint64_t and the reuse flags are ints, as passed.
        unsafe {
            match attr {
                PoolAttr::ReleaseThresholdBytes(mut bytes) => check(
                    "cuMemPoolSetAttribute(RELEASE_THRESHOLD)",
                    sys::cuMemPoolSetAttribute(
                        pool,
                        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                        &mut bytes as *mut u64 as *mut _,
                    ),
                ),
                PoolAttr::ReuseFollowEventDependencies(on)
                | PoolAttr::ReuseAllowOpportunistic(on)
                | PoolAttr::ReuseAllowInternalDependencies(on) => {
                    let which = match attr {
                        PoolAttr::ReuseFollowEventDependencies(_) => {
                            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                        }
                        PoolAttr::ReuseAllowOpportunistic(_) => {
                            CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
                        }
                        _ => CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                    };
                    let mut flag: i32 = on.into();
                    check(
                        "cuMemPoolSetAttribute(REUSE_*)",
                        sys::cuMemPoolSetAttribute(pool, which, &mut flag as *mut i32 as *mut _),
                    )
                }
            }
        }
    }

    fn pool_usage(&self, _device: usize, pool: PoolHandle) -> Result<PoolUsage> {
        use sys::CUmemPool_attribute::*;
        Ok(PoolUsage {
            reserved_bytes: self.get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_bytes_high: self.get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_bytes: self.get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_bytes_high: self.get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    fn pool_reserved_used(&self, _device: usize, pool: PoolHandle) -> Result<(u64, u64)> {
        use sys::CUmemPool_attribute::*;
        Ok((
            self.get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            self.get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        ))
    }

    fn pool_reset_peaks(&self, _device: usize, pool: PoolHandle) -> Result<()> {
        use sys::CUmemPool_attribute::*;
        for attr in [
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: the high-water attributes are cuuint64_t and may only be set to 0.
            check("cuMemPoolSetAttribute(*_MEM_HIGH)", unsafe {
                sys::cuMemPoolSetAttribute(pool_ptr(pool), attr, &mut zero as *mut u64 as *mut _)
            })?;
        }
        Ok(())
    }

    fn pool_trim(&self, device: usize, pool: PoolHandle, keep_bytes: u64) -> Result<()> {
        let _scope = self.enter(device)?;
        // SAFETY: a valid pool handle.
        timed("cuMemPoolTrimTo", || unsafe {
            sys::cuMemPoolTrimTo(pool_ptr(pool), keep_bytes.min(usize::MAX as u64) as usize)
        })
    }

    fn alloc_async(
        &self,
        device: usize,
        pool: PoolHandle,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let _scope = self.enter(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        let bytes = usize::try_from(bytes).map_err(|_| too_large(bytes))?;
        // SAFETY: valid out-pointer, pool and stream handles from the caller.
        timed("cuMemAllocFromPoolAsync", || unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool_ptr(pool), stream_ptr(stream))
        })?;
        Ok(DevicePtr(ptr))
    }

    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()> {
        let freed = self.enter(device).and_then(|_scope| {
            // SAFETY: `ptr` came from this driver's allocation on `device` and is freed once.
            timed("cuMemFreeAsync", || unsafe {
                sys::cuMemFreeAsync(ptr.0, stream_ptr(stream))
            })
        });
        match freed {
            // At process exit the driver can shut down before the last tensors are freed (Python
            // frees module globals late): the memory went with it and nothing is left to do.
            Err(Error::Driver { code, .. })
                if code == sys::CUresult::CUDA_ERROR_DEINITIALIZED as i32 =>
            {
                Ok(())
            }
            other => other,
        }
    }
}

impl PeerDriver for CudaDriver {
    fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool> {
        let mut can_access = 0;
        // SAFETY: valid out-pointer and device handles.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can_access, self.devices[peer], self.devices[device])
        })?;
        Ok(can_access != 0)
    }

    fn pool_grant_access(&self, device: usize, pool: PoolHandle, peer: usize) -> Result<()> {
        let _scope = self.enter(device)?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: peer as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one fully initialised descriptor; the pool was created by this driver.
        check("cuMemPoolSetAccess", unsafe {
            sys::cuMemPoolSetAccess(pool_ptr(pool), &desc, 1)
        })
    }
}

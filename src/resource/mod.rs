//! Where a device's blocks come from: the [`Resource`] interface above the driver (RMM's
//! `device_memory_resource` shape: allocate, deallocate, usage, trim, and what it is), the
//! optional [`Capabilities`] a resource may add (a run-time release threshold, peaks, background
//! release, peer access, capture notice, export), its implementations — [`cuda_pool`] (a CUDA
//! stream-ordered pool) and [`vmm`] (streampool's own virtual-memory pool) — and [`Resources`],
//! the pair of resources of one device chosen by block size.
//!
//! Invariants: every resource serves one device and is safe to call from any thread; allocation
//! and deallocation are stream-ordered — a block deallocated on stream S may be handed out again
//! on S at once, on another stream only after the work S had queued at the deallocation is done;
//! which resource serves a block is a function of its size alone ([`Resources::class_of`]), so a
//! free needs no record of it.

pub mod cuda_pool;
pub mod vmm;

use crate::config::{Backend, Config};
use crate::driver::{DevicePtr, Driver, PoolHandle, PoolUsage, Stream};
use crate::error::Result;
use crate::history::Recorder;
use cuda_pool::CudaPoolResource;
use std::ops::RangeInclusive;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
pub use vmm::DriverCounts;
use vmm::{VmmResource, VmmSettings};

/// Memory that other devices can be given access to (a resource, or a pool imported from
/// another process).
pub trait Accessible: Send + Sync {
    /// What it is, for messages ("pool", "small-block pool", "virtual memory", ...).
    fn label(&self) -> &'static str;
    /// Lets device `peer` read and write all of its memory, present and future.
    fn grant_access(&self, peer: usize) -> Result<()>;
}

/// Reserved and used bytes of a resource now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// What it holds from the device.
    pub reserved_bytes: u64,
    /// What of that is handed out (or freed on a stream that has not caught up yet).
    pub used_bytes: u64,
}

impl Usage {
    /// Reserved bytes not handed out.
    pub fn room_bytes(self) -> u64 {
        self.reserved_bytes.saturating_sub(self.used_bytes)
    }
}

/// What a resource is, for the device's policy; fixed for the resource's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traits {
    /// What it is, for messages ("pool", "small-block pool", "virtual memory resource", ...).
    pub label: &'static str,
    /// It can reuse freed memory only once it was given back (a CUDA pool coalesces only what is
    /// returned to it): the device then returns cached blocks, and trims, before it grows. A
    /// resource that manages its own holes says false.
    pub returns_before_growth: bool,
}

/// A source of device memory.
pub trait Resource: Send + Sync {
    /// A block of `bytes` (a multiple of 512), ordered on `stream`. Out of memory is
    /// `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr>;
    /// Gives back a block `allocate` returned, of the same `bytes`, ordered on `stream` (its
    /// allocation stream). An error means the block is still the caller's, to give back later.
    fn deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()>;
    /// Reserved and used bytes now (cheap: read on the allocation path).
    fn usage(&self) -> Result<Usage>;
    /// Gives the device back what it holds unused, keeping `keep_bytes` reserved. Called after
    /// the device synchronised, so every deallocation has completed.
    fn trim(&self, keep_bytes: u64) -> Result<()>;
    /// What it is.
    fn traits(&self) -> Traits;
    /// What more it can do; nothing unless it says so.
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
    }
}

/// The optional capabilities of a resource, each a small trait of its own.
#[derive(Clone, Copy, Default)]
pub struct Capabilities<'a> {
    /// Reserved memory above a threshold set at run time goes back to the device once unused.
    pub release_threshold: Option<&'a dyn ReleaseThreshold>,
    /// High-water marks, and the driver calls it made.
    pub statistics: Option<&'a dyn Statistics>,
    /// It applies its release threshold itself, and releases idle memory without a
    /// synchronisation, when the device's background thread asks.
    pub tending: Option<&'a dyn Tending>,
    /// Other devices can be given access to its memory.
    pub peer_access: Option<&'a dyn Accessible>,
    /// It must know when a stream of the device begins to capture a CUDA graph.
    pub capture_notice: Option<&'a dyn CaptureNotice>,
    /// Its blocks can be exported to other processes.
    pub export: Option<&'a dyn Export>,
}

/// See [`Capabilities::release_threshold`].
pub trait ReleaseThreshold {
    /// Reserved memory above `bytes` is given back to the device once unused.
    fn set_release_threshold(&self, bytes: u64) -> Result<()>;
}

/// See [`Capabilities::statistics`].
pub trait Statistics {
    /// Reserved and used bytes with their high-water marks.
    fn usage_with_peaks(&self) -> Result<PoolUsage>;
    /// Resets the high-water marks to the current values.
    fn reset_peaks(&self) -> Result<()>;
    /// The driver calls it made that cost time on the allocating thread.
    fn driver_counts(&self) -> DriverCounts {
        DriverCounts::default()
    }
}

/// See [`Capabilities::tending`].
pub trait Tending {
    /// Called regularly while the device is in use: memory above the release threshold that has
    /// stayed unused goes back. True while it holds memory above it.
    fn release_above_threshold(&self) -> bool;
    /// The device has been idle: give back all memory not in use, without synchronising. True if
    /// some may become releasable later (its streams have not caught up): call again.
    fn release_idle(&self) -> Result<bool>;
}

/// See [`Capabilities::capture_notice`].
pub trait CaptureNotice {
    /// `stream` of the device is capturing a CUDA graph: a resource that maps memory must not
    /// map, unmap or query events until the capture ends (it asks the driver when that is).
    fn capture_started(&self, stream: Stream);
}

/// See [`Capabilities::export`].
pub trait Export {
    /// The CUDA pool behind it, which other processes import.
    fn pool_handle(&self) -> PoolHandle;
}

/// Lets `resource`'s memory be granted to other devices, if it can be.
pub fn peer_target(resource: &Arc<dyn Resource>) -> Option<Arc<dyn Accessible>> {
    resource.capabilities().peer_access?;
    Some(Arc::new(PeerTarget(Arc::clone(resource))))
}

/// A resource with the peer-access capability, as peers see it.
struct PeerTarget(Arc<dyn Resource>);

impl Accessible for PeerTarget {
    fn label(&self) -> &'static str {
        self.0.traits().label
    }

    fn grant_access(&self, peer: usize) -> Result<()> {
        match self.0.capabilities().peer_access {
            Some(access) => access.grant_access(peer),
            None => Ok(()),
        }
    }
}

/// Gives back idle memory of `resource` without synchronising: its own idle release, or a trim.
/// True if more may become releasable later.
pub fn release_idle(resource: &dyn Resource) -> Result<bool> {
    match resource.capabilities().tending {
        Some(tending) => tending.release_idle(),
        None => resource.trim(0).map(|()| false),
    }
}

/// `resource`'s usage with high-water marks (the current values where it keeps none).
pub fn usage_with_peaks(resource: &dyn Resource) -> Result<PoolUsage> {
    if let Some(statistics) = resource.capabilities().statistics {
        return statistics.usage_with_peaks();
    }
    let now = resource.usage()?;
    Ok(PoolUsage {
        reserved_bytes: now.reserved_bytes,
        reserved_bytes_high: now.reserved_bytes,
        used_bytes: now.used_bytes,
        used_bytes_high: now.used_bytes,
    })
}

/// Which of a device's resources serves a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeClass {
    /// Up to `STREAMPOOL_SMALL_POOL_MAX`, when there is a small-block resource.
    Small,
    Large,
}

/// The resources of one device: one for large blocks and, unless disabled, one for small ones.
pub struct Resources {
    /// The backend serving the device (the pool where `vmm` was asked for and is unsupported).
    backend: Backend,
    large: Arc<dyn Resource>,
    small: Option<Arc<dyn Resource>>,
    small_max_bytes: u64,
}

impl Resources {
    /// The resources `config` asks for on `device` (of `total_bytes` memory). With
    /// `STREAMPOOL_IPC`, one shareable pool serves every size. A small-block pool that cannot be
    /// created is logged and left out (the large resource serves every size).
    pub fn create(
        driver: &Arc<dyn Driver>,
        device: usize,
        config: &Config,
        total_bytes: u64,
        limit_bytes: &Arc<AtomicU64>,
        recorder: &Arc<Recorder>,
    ) -> Result<Resources> {
        let small_max_bytes = config.small_pool_max.resolve_bytes(total_bytes);
        if config.ipc {
            let pool = CudaPoolResource::create(driver, device, config, total_bytes, true, "pool")?;
            return Ok(Resources::single(Arc::new(pool)));
        }
        let vmm = config.backend == Backend::Vmm;
        if vmm && !driver.vmm_supported(device)? {
            log::warn!(
                "device {device} does not support CUDA virtual memory management \
                 (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): it uses the pool \
                 backend instead of STREAMPOOL_BACKEND=vmm"
            );
        } else if vmm {
            // One resource for every size: small blocks are carved out of its own pages.
            let settings = VmmSettings::resolve(config, driver.as_ref(), device, total_bytes)?;
            let vmm = VmmResource::create(
                driver,
                device,
                &settings,
                total_bytes,
                Arc::clone(limit_bytes),
                Arc::clone(recorder),
            )?;
            return Ok(Resources {
                backend: Backend::Vmm,
                ..Resources::single(vmm)
            });
        }
        let large = Arc::new(CudaPoolResource::create(
            driver,
            device,
            config,
            total_bytes,
            false,
            "pool",
        )?);
        // A pool size cap applies to one pool: no split then.
        let split = small_max_bytes > 0 && config.max_pool_size.is_max();
        let small = match split {
            false => None,
            true => {
                let label = "small-block pool";
                match CudaPoolResource::create(driver, device, config, total_bytes, false, label) {
                    Ok(pool) => Some(Arc::new(pool) as Arc<dyn Resource>),
                    Err(e) => {
                        log::warn!(
                            "device {device}: no small-block pool, one resource serves all: {e}"
                        );
                        None
                    }
                }
            }
        };
        Ok(Resources {
            backend: Backend::Pool,
            large,
            small,
            small_max_bytes,
        })
    }

    /// One resource for every size.
    pub fn single(resource: Arc<dyn Resource>) -> Resources {
        Resources {
            backend: Backend::Pool,
            large: resource,
            small: None,
            small_max_bytes: 0,
        }
    }

    /// The backend serving the device.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The class of a block of `block_bytes`.
    #[inline]
    pub fn class_of(&self, block_bytes: u64) -> SizeClass {
        match self.small.is_some() && block_bytes <= self.small_max_bytes {
            true => SizeClass::Small,
            false => SizeClass::Large,
        }
    }

    #[inline]
    pub fn get(&self, class: SizeClass) -> &dyn Resource {
        match (class, &self.small) {
            (SizeClass::Small, Some(small)) => small.as_ref(),
            _ => self.large.as_ref(),
        }
    }

    /// The block sizes `class` serves.
    pub fn sizes_served(&self, class: SizeClass) -> RangeInclusive<u64> {
        match (class, &self.small) {
            (SizeClass::Small, _) => 0..=self.small_max_bytes,
            (SizeClass::Large, Some(_)) => self.small_max_bytes.saturating_add(1)..=u64::MAX,
            (SizeClass::Large, None) => 0..=u64::MAX,
        }
    }

    /// Every resource, the large one first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Resource>> {
        std::iter::once(&self.large).chain(&self.small)
    }

    /// The resources' usage with high-water marks, summed.
    pub fn usage_with_peaks(&self) -> Result<PoolUsage> {
        self.all().try_fold(PoolUsage::default(), |sum, r| {
            Ok(sum.plus(usage_with_peaks(r.as_ref())?))
        })
    }

    /// The driver calls the resources made, summed.
    pub fn driver_counts(&self) -> DriverCounts {
        self.all()
            .filter_map(|r| r.capabilities().statistics.map(|s| s.driver_counts()))
            .fold(DriverCounts::default(), DriverCounts::plus)
    }

    /// The resources' reserved bytes, summed.
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.all().try_fold(0u64, |sum, r| {
            Ok(sum.saturating_add(r.usage()?.reserved_bytes))
        })
    }

    /// Runs `f` on every resource; every one is tried, the first error is returned.
    pub fn for_each(&self, mut f: impl FnMut(&dyn Resource) -> Result<()>) -> Result<()> {
        self.all().map(|r| f(r.as_ref())).fold(Ok(()), Result::and)
    }
}

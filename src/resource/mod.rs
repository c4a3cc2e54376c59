//! Where a device's blocks come from: the [`Resource`] interface above the driver (RMM's
//! `device_memory_resource` shape: allocate, deallocate, usage, trim, and what it is), the
//! optional [`Capabilities`] a resource may add (a run-time release threshold, peaks, background
//! release, peer access, capture notice, export), its implementations — [`cuda_pool`] (a CUDA
//! stream-ordered pool), [`vmm`] (streampool's own virtual-memory pool), [`managed`] (managed
//! memory) and the driver's own pool (graph memory) — and [`Sources`], the table of one device's
//! sources by id ([`provision`] makes the first ones, one row of its table per backend).
//!
//! Invariants: every resource serves one device and is safe to call from any thread; allocation
//! and deallocation are stream-ordered — a block deallocated on stream S may be handed out again
//! on S at once, on another stream only after the work S had queued at the deallocation is done;
//! a block goes back to the resource that served it, named by the id its record carries (which
//! of a device's own resources serves a new block is a function of its size alone,
//! [`Sources::for_size`]).

#[cfg(all(test, feature = "sim"))]
mod contract;
pub mod cuda_pool;
mod driver_pool;
pub mod foreign;
pub mod graph_pool;
pub mod managed;
mod sharing;
mod sources;
#[cfg(test)]
pub(crate) mod test_source;
mod traits;
pub mod vmm;

use crate::config::{Backend, PoolSettings, SourceSettings};
use crate::driver::{DevicePtr, Driver, PoolUsage, Stream};
use crate::error::{Error, Result};
use crate::history::Recorder;
use crate::tag::TagId;
use cuda_pool::{CudaPoolResource, PoolRole};
use driver_pool::DriverPoolResource;
pub use sharing::{Export, ExportMark, ExportedPages, PageExport};
pub use sources::{Source, SourceId, Sources};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
pub use traits::Traits;
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

/// A source of device memory.
pub trait Resource: Send + Sync {
    /// A block of `bytes` (a multiple of 512), ordered on `stream`. Out of memory is
    /// `Error::Driver` with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr>;
    /// Gives back a block `allocate` returned, of the same `bytes`, ordered on `stream` (its
    /// allocation stream). An error means the block is still the caller's, to give back later.
    fn deallocate(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()>;
    /// [`Resource::deallocate`] for a block whose work on every stream, `stream` included, has
    /// completed (the caller asked the driver), handed back at the program's synchronisation: a
    /// resource that can use that (the vmm resource, unless it knows of a capture) makes the
    /// block ready for every stream at once, with no fence; otherwise a plain free.
    fn deallocate_idle(&self, ptr: DevicePtr, bytes: u64, stream: Stream) -> Result<()> {
        self.deallocate(ptr, bytes, stream)
    }
    /// [`Resource::allocate`] if a block is at hand: nothing mapped, created or waited for, no
    /// lock waited for, only driver calls that return at once — a capture query, an event
    /// record or query (the device calls it under its own lock, when [`Traits::fast_path`] says
    /// so). `None`: ask `allocate`.
    #[inline]
    fn try_allocate(&self, _bytes: u64, _stream: Stream) -> Option<DevicePtr> {
        None
    }
    /// [`Resource::deallocate`] if it can be done now under the same rules as
    /// [`Resource::try_allocate`]; `None`: call `deallocate`.
    #[inline]
    fn try_deallocate(&self, _ptr: DevicePtr, _bytes: u64, _stream: Stream) -> Option<Result<()>> {
        None
    }
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
    /// Its blocks' physical pages can be exported to other processes, page by page.
    pub page_export: Option<&'a dyn PageExport>,
    /// It can give all its physical memory back and take it again at the same addresses.
    pub sleep: Option<&'a dyn Sleep>,
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
    /// The calling thread is about to synchronise the device (`torch.cuda.synchronize()`): at
    /// its [`Tending::synchronized`], what was freed before now is past the GPU.
    fn synchronizing(&self) {}
    /// The program synchronised the device (`torch.cuda.synchronize()`): what was freed before
    /// it is ready for every stream now, and memory above the release threshold goes back, as a
    /// CUDA pool's does at a synchronisation.
    fn synchronized(&self) -> Result<()> {
        Ok(())
    }
}

/// See [`Capabilities::capture_notice`].
pub trait CaptureNotice {
    /// `stream` of the device is capturing a CUDA graph: a resource that maps memory must not
    /// map, unmap or query events until the capture ends (it asks the driver when that is).
    fn capture_started(&self, stream: Stream);
}

/// See [`Capabilities::sleep`]: the memory of a resource that keeps its addresses.
pub trait Sleep {
    /// Gives every physical page back to the device, keeping the addresses; at `level` 1 the
    /// contents of pages under live blocks wait in page-locked host memory first (level 2:
    /// discarded), but for blocks allocated under a tag in `discard` ([`crate::tag`]), whose
    /// contents are discarded (unless they share a page with a block that is kept). Called
    /// after the device synchronised (no work in flight). The bytes given back. An error
    /// (already asleep, a capture, host memory that cannot be pinned) changes nothing.
    fn sleep(&self, level: u32, discard: &[TagId]) -> Result<u64>;
    /// An error if a sleep now would be refused (asleep already, a capture under way, a live
    /// block exported), asked before the device hands back the blocks that wait for streams: a
    /// refused sleep changes nothing. Blocks starting at `freed` (the program freed them; they
    /// wait for other streams, and the sleep hands them back first) count as freed.
    /// ([`Sleep::sleep`] asks again under its lock.)
    fn may_sleep_now(&self, freed: &[DevicePtr]) -> Result<()>;
    /// Whether the resource sleeps now; an error if it is disabled.
    fn asleep(&self) -> Result<bool>;
    /// The error of an allocation made elsewhere on the device (the shareable pool) while this
    /// resource sleeps; None when awake.
    fn asleep_error(&self) -> Option<Error>;
    /// Maps fresh pages under live blocks at the same addresses (and restores what level 1
    /// saved); the bytes restored. Out of memory part way: what was restored stays (correct), the rest sleeps on,
    /// and a later wake goes on. An error if it is not asleep.
    fn wake(&self) -> Result<u64>;
    /// Bytes asleep now, the pages under live blocks (0 when awake).
    fn sleeping_bytes(&self) -> u64;
    /// Bytes of contents waiting in page-locked host memory while asleep (0 when awake).
    fn saved_bytes(&self) -> u64;
    /// Bytes of page-locked host memory held for sleeping: the buffer of the saved contents
    /// while asleep, and the one kept from the last level-1 sleep for the next (a sleep that
    /// saved nothing leaves it kept).
    fn host_buffer_bytes(&self) -> u64;
    /// Frees the host buffer kept for the next sleep; the bytes freed (0 if none). An error
    /// while the buffer holds a sleep's contents.
    fn release_host_buffer(&self) -> Result<u64>;
    /// Page-locks the host buffer of the next level-1 sleep now, the first sleep's slowest step
    /// (pinning costs more than the copies): `bytes` of it, or with 0 what the pages under live
    /// blocks need now; a kept buffer at least that large stays as it is. The bytes of the
    /// buffer kept. Other threads' allocations go on while it pins. An error while asleep, or if
    /// the memory cannot be page-locked (a buffer kept before stays then).
    fn reserve_host_buffer(&self, bytes: u64) -> Result<u64>;
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

/// True if `resource` gives its idle memory back only when trimmed ([`release_idle`] trims it):
/// it has no background release of its own.
pub fn trimmed_at_idle(resource: &dyn Resource) -> bool {
    resource.capabilities().tending.is_none()
}

/// True if the device synchronises before the idle release trims `resource`: it is trimmed
/// there ([`trimmed_at_idle`]) and applies its frees only at a synchronisation
/// ([`Traits::frees_applied_at_sync`]).
pub fn synchronised_before_idle_trim(resource: &dyn Resource) -> bool {
    trimmed_at_idle(resource) && resource.traits().frees_applied_at_sync
}

/// Gives back idle memory of `resource` without synchronising: its own idle release, or a trim
/// (see [`trimmed_at_idle`]). True if more may become releasable later.
pub fn release_idle(resource: &dyn Resource) -> Result<bool> {
    match resource.capabilities().tending {
        Some(tending) => tending.release_idle(),
        None => resource.trim(0).map(|()| false),
    }
}

/// What `resources` reserve from the device in all (saturating).
pub fn reserved_bytes_of(resources: &[Arc<dyn Resource>]) -> Result<u64> {
    resources.iter().try_fold(0u64, |sum, r| {
        Ok(sum.saturating_add(r.usage()?.reserved_bytes))
    })
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

/// The sources a device starts with ([`provision`]).
pub struct Provision {
    pub sources: Sources,
    /// The backend serving the device (the pool where the one asked for is unsupported).
    pub backend: Backend,
}

/// What a backend makes a device's own resources from.
pub struct Provisioning<'a> {
    pub driver: &'a Arc<dyn Driver>,
    pub device: usize,
    pub settings: &'a SourceSettings,
    /// The device's memory.
    pub total_bytes: u64,
    /// The device's memory limit (`set_per_process_memory_fraction`), shared with the device.
    pub limit_bytes: &'a Arc<AtomicU64>,
    pub recorder: &'a Arc<Recorder>,
}

/// A device's own resources.
pub enum Own {
    /// One for large blocks (every block without the other) and maybe one for blocks up to a
    /// size.
    Split {
        large: Arc<dyn Resource>,
        small: Option<(Arc<dyn Resource>, u64)>,
    },
    /// The virtual-memory resource for every size, by its own type: the device calls its fast
    /// path ([`Traits::fast_path`]) without a dynamic call ([`Sources::fast_own`]).
    Vmm(Arc<VmmResource>),
}

/// How a backend makes a device's own resources; `None` where the device cannot run it (it is
/// logged, and the pool backend serves the device instead).
pub type MakeOwn = fn(&Provisioning<'_>) -> Result<Option<Own>>;

/// A backend's row: how it makes a device's own resources, and whether they can sleep and wake
/// ([`Capabilities::sleep`]; the sleep entry points refuse the other backends before a device is
/// set up, so that a refusal creates nothing).
#[derive(Clone, Copy)]
struct BackendRow {
    backend: Backend,
    make: MakeOwn,
    sleeps: bool,
}

/// One row per backend (`STREAMPOOL_BACKEND`): adding a backend is a row here, its resource in a
/// file or folder of its own, and the docs (docs/layout.md, "Adding a backend").
const BACKENDS: [BackendRow; 3] = [
    BackendRow {
        backend: Backend::Pool,
        make: pool_own,
        sleeps: false,
    },
    BackendRow {
        backend: Backend::Vmm,
        make: vmm_own,
        sleeps: true,
    },
    BackendRow {
        backend: Backend::Managed,
        make: managed::own,
        sleeps: false,
    },
];

/// True if `backend`'s resources can sleep and wake (its row says so; a test checks the row
/// against the resources the backend makes).
pub fn backend_sleeps(backend: Backend) -> bool {
    BACKENDS
        .iter()
        .any(|row| row.backend == backend && row.sleeps)
}

/// The `pool` backend: a CUDA pool for large blocks and, unless disabled, one for small ones (a
/// small-block pool that cannot be created is logged and left out: the large one serves all).
fn pool_own(at: &Provisioning<'_>) -> Result<Option<Own>> {
    let (driver, device, settings) = (at.driver, at.device, at.settings);
    let pool = |role| CudaPoolResource::create(driver, device, &settings.pool, role);
    let large = Arc::new(pool(PoolRole::OWN)?);
    let small = match settings.small_pool {
        false => None,
        true => match pool(PoolRole::OWN_SMALL) {
            Ok(pool) => Some((
                Arc::new(pool) as Arc<dyn Resource>,
                settings.small_max_bytes,
            )),
            Err(e) => {
                log::warn!("device {device}: no small-block pool, one resource serves all: {e}");
                None
            }
        },
    };
    Ok(Some(Own::Split { large, small }))
}

/// The `vmm` backend: one virtual-memory resource for every size (small blocks are carved out of
/// its own pages).
fn vmm_own(at: &Provisioning<'_>) -> Result<Option<Own>> {
    let (driver, device) = (at.driver, at.device);
    if !driver.vmm_supported(device)? {
        log::warn!(
            "device {device} does not support CUDA virtual memory management \
             (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): it uses the pool \
             backend instead of vmm"
        );
        return Ok(None);
    }
    let settings = VmmSettings::resolve(&at.settings.vmm, driver.as_ref(), device, at.total_bytes)?;
    let vmm = VmmResource::create(
        driver,
        device,
        &settings,
        at.total_bytes,
        Arc::clone(at.limit_bytes),
        Arc::clone(at.recorder),
    )?;
    Ok(Some(Own::Vmm(vmm)))
}

/// The sources `settings` ask for on `device` (of `total_bytes` memory): its own resources, made
/// by the row of [`BACKENDS`] for the backend asked for (the pool backend's where the device
/// cannot run it), and graph memory. With `STREAMPOOL_IPC`, one shareable pool serves every size
/// and is the shareable pool.
pub fn provision(
    driver: &Arc<dyn Driver>,
    device: usize,
    settings: &SourceSettings,
    total_bytes: u64,
    limit_bytes: &Arc<AtomicU64>,
    recorder: &Arc<Recorder>,
) -> Result<Provision> {
    let with = |own: Own| {
        let graph = Arc::new(DriverPoolResource::graph_memory(driver, device));
        Sources::of(own, graph)
    };
    if settings.one_shareable_pool {
        let pool = CudaPoolResource::create(driver, device, &settings.pool, PoolRole::SHARED_OWN)?;
        let mut sources = with(Own::Split {
            large: Arc::new(pool),
            small: None,
        });
        sources.set_shareable(sources.for_size(0));
        let backend = Backend::Pool;
        return Ok(Provision { sources, backend });
    }
    let at = Provisioning {
        driver,
        device,
        settings,
        total_bytes,
        limit_bytes,
        recorder,
    };
    let row = (BACKENDS.iter().copied())
        .find(|row| row.backend == settings.backend)
        .ok_or_else(|| Error::Internal(format!("no row for {:?}", settings.backend)))?;
    let (backend, own) = match (row.make)(&at)? {
        Some(own) => (row.backend, own),
        None => {
            let own = pool_own(&at)?;
            let own = own.ok_or_else(|| Error::Internal("no pool backend".into()))?;
            (Backend::Pool, own)
        }
    };
    Ok(Provision {
        sources: with(own),
        backend,
    })
}

/// The pool of `streampool.shareable()` on `device`: shareable, never cached.
pub fn shareable_pool(
    driver: &Arc<dyn Driver>,
    device: usize,
    settings: &PoolSettings,
) -> Result<Arc<dyn Resource>> {
    let pool = CudaPoolResource::create(driver, device, settings, PoolRole::SHAREABLE)?;
    Ok(Arc::new(pool))
}

#[cfg(test)]
mod tests;

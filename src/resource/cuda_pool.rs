//! A CUDA stream-ordered memory pool (`cuMemPoolCreate`, `cuMemAllocFromPoolAsync`,
//! `cuMemFreeAsync`) as a [`Resource`].
//!
//! Invariants: the pool is created in the device's primary context with the configured release
//! threshold, maximum size and reuse policies applied before any allocation is made from it; if
//! applying them fails, the pool is destroyed again and the error returned; a shareable pool is
//! created only where the device supports it; the pool is destroyed when the resource is dropped
//! (CUDA releases memory still allocated from it once that is freed).

use super::{
    Accessible, Capabilities, Export, ReleaseThreshold, Resource, Statistics, Traits, Usage,
};
use crate::config::PoolSettings;
use crate::driver::{DevicePtr, Driver, PoolAttr, PoolHandle, PoolUsage, Stream};
use crate::error::{Error, Result};
use crate::units::format_limit;
use std::sync::Arc;

/// The smallest step a CUDA pool grows by.
pub(crate) const POOL_GRANULE_BYTES: u64 = 2 << 20;

pub struct CudaPoolResource {
    driver: Arc<dyn Driver>,
    device: usize,
    handle: PoolHandle,
    role: PoolRole,
}

/// What a pool is for on its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolRole {
    pub label: &'static str,
    /// Exportable to other processes.
    pub shareable: bool,
    /// Its freed blocks may wait in the device's cache.
    pub cacheable: bool,
}

impl PoolRole {
    /// The device's pool for large blocks (every block without a small-block pool).
    pub(crate) const OWN: PoolRole = PoolRole {
        label: "pool",
        shareable: false,
        cacheable: true,
    };
    /// The device's pool for small blocks.
    pub(crate) const OWN_SMALL: PoolRole = PoolRole {
        label: "small-block pool",
        ..PoolRole::OWN
    };
    /// The device's one pool with `STREAMPOOL_IPC`: every block shareable.
    pub(crate) const SHARED_OWN: PoolRole = PoolRole {
        shareable: true,
        ..PoolRole::OWN
    };
    /// The pool of `streampool.shareable()`: its blocks go straight back.
    pub(crate) const SHAREABLE: PoolRole = PoolRole {
        label: "shareable pool",
        shareable: true,
        cacheable: false,
    };
}

impl CudaPoolResource {
    /// A new pool on `device` for `role`, with `settings`.
    pub fn create(
        driver: &Arc<dyn Driver>,
        device: usize,
        settings: &PoolSettings,
        role: PoolRole,
    ) -> Result<CudaPoolResource> {
        let (shareable, label) = (role.shareable, role.label);
        if shareable && !driver.ipc_supported(device)? {
            return Err(Error::DriverUnavailable(format!(
                "device {device} cannot share pool memory with other processes: its driver reports \
                 no POSIX file descriptor handles for memory pools \
                 (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES); unset STREAMPOOL_IPC and \
                 allocate outside streampool.shareable()"
            )));
        }
        let max_size_bytes = settings.max_size_bytes;
        let handle = driver.pool_create(device, max_size_bytes, shareable)?;
        // From here the pool is ours: dropping `pool` destroys it, also on the error paths below.
        let pool = CudaPoolResource {
            driver: Arc::clone(driver),
            device,
            handle,
            role,
        };
        let threshold_bytes = settings.release_threshold_bytes;
        let reuse = settings.reuse;
        let attrs = [
            Some(PoolAttr::ReleaseThresholdBytes(threshold_bytes)),
            reuse
                .follow_event_dependencies
                .map(PoolAttr::ReuseFollowEventDependencies),
            reuse
                .allow_opportunistic
                .map(PoolAttr::ReuseAllowOpportunistic),
            reuse
                .allow_internal_dependencies
                .map(PoolAttr::ReuseAllowInternalDependencies),
        ];
        for attr in attrs.into_iter().flatten() {
            pool.driver.pool_set_attr(device, handle, attr)?;
        }
        log::info!(
            "device {device}: created the {label}{} (release threshold {}, max size {})",
            if shareable { ", shareable" } else { "" },
            format_limit(threshold_bytes),
            format_limit(max_size_bytes),
        );
        Ok(pool)
    }
}

impl Drop for CudaPoolResource {
    fn drop(&mut self) {
        if let Err(e) = self.driver.pool_destroy(self.device, self.handle) {
            log::debug!(
                "device {}: destroying the {}: {e}",
                self.device,
                self.role.label
            );
        }
    }
}

impl Accessible for CudaPoolResource {
    fn label(&self) -> &'static str {
        self.role.label
    }

    fn grant_access(&self, peer: usize) -> Result<()> {
        self.driver
            .pool_grant_access(self.device, self.handle, peer)
    }
}

impl Resource for CudaPoolResource {
    #[inline]
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        self.driver
            .alloc_async(self.device, self.handle, bytes, stream)
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, _bytes: u64, stream: Stream) -> Result<()> {
        self.driver.free_async(self.device, ptr, stream)
    }

    fn usage(&self) -> Result<Usage> {
        let (reserved_bytes, used_bytes) =
            self.driver.pool_reserved_used(self.device, self.handle)?;
        Ok(Usage {
            reserved_bytes,
            used_bytes,
        })
    }

    fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.driver.pool_trim(self.device, self.handle, keep_bytes)
    }

    fn traits(&self) -> Traits {
        Traits {
            label: self.role.label,
            cacheable: self.role.cacheable,
            held: true,
            shareable: self.role.shareable,
            returns_before_growth: true,
            fast_path: false,
            reuses_across_streams: true,
            trims: true,
            // cuMemFreeAsync takes no size: a table of sizes would cost every allocation.
            checks_free_size: false,
            growth_granule_bytes: POOL_GRANULE_BYTES,
            // cuMemPoolTrimTo gives back only what was freed before a synchronisation.
            frees_applied_at_sync: true,
            takes_idle_blocks: false,
            keeps_under_limit: false,
        }
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            release_threshold: Some(self),
            statistics: Some(self),
            peer_access: Some(self),
            export: Some(self),
            ..Capabilities::default()
        }
    }
}

impl ReleaseThreshold for CudaPoolResource {
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let attr = PoolAttr::ReleaseThresholdBytes(bytes);
        self.driver.pool_set_attr(self.device, self.handle, attr)
    }
}

impl Statistics for CudaPoolResource {
    fn usage_with_peaks(&self) -> Result<PoolUsage> {
        self.driver.pool_usage(self.device, self.handle)
    }

    fn reset_peaks(&self) -> Result<()> {
        self.driver.pool_reset_peaks(self.device, self.handle)
    }
}

impl Export for CudaPoolResource {
    fn pool_handle(&self) -> PoolHandle {
        self.handle
    }
}

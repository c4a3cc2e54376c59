//! One explicit stream-ordered memory pool per device, configured from [`Config`].
//!
//! Invariant: a pool is created once, on first use, in the device's primary context, with the
//! release threshold, maximum size and reuse policies of the configuration applied before any
//! allocation is made from it. A shareable pool is created only where the device supports it.

use crate::config::Config;
use crate::driver::{Driver, PoolAttr, PoolHandle};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy)]
pub struct Pool {
    pub handle: PoolHandle,
    pub device_total_bytes: u64,
    pub cache_limit_bytes: u64,
    pub cache_max_block_bytes: u64,
}

impl Pool {
    /// The device's pool; shareable with other processes if `shareable`.
    pub fn create(
        driver: &dyn Driver,
        device: usize,
        config: &Config,
        shareable: bool,
    ) -> Result<Pool> {
        if shareable && !driver.ipc_supported(device)? {
            return Err(Error::DriverUnavailable(format!(
                "device {device} cannot share pool memory with other processes: its driver reports \
                 no POSIX file descriptor handles for memory pools \
                 (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES); unset STREAMPOOL_IPC and \
                 allocate outside streampool.shareable()"
            )));
        }
        let total = driver.mem_info(device)?.total_bytes;
        let max_size_bytes = config.max_pool_size.resolve_bytes(total);
        let handle = driver.pool_create(device, max_size_bytes, shareable)?;
        let threshold_bytes = config.release_threshold.resolve_bytes(total);
        driver.pool_set_attr(
            device,
            handle,
            PoolAttr::ReleaseThresholdBytes(threshold_bytes),
        )?;
        let reuse = config.reuse;
        let policies = [
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
        for attr in policies.into_iter().flatten() {
            driver.pool_set_attr(device, handle, attr)?;
        }
        log::info!(
            "device {device}: created pool (total {total} B, release threshold {threshold_bytes} B, max size {max_size_bytes} B)"
        );
        Ok(Pool {
            handle,
            device_total_bytes: total,
            cache_limit_bytes: config.cache_limit.resolve_bytes(total),
            cache_max_block_bytes: config.cache_max_block.resolve_bytes(total),
        })
    }
}

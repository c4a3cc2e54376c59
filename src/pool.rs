//! The stream-ordered memory pools of one device, configured from [`Config`]: a main pool and,
//! with `STREAMPOOL_SMALL_POOL_MAX`, a second one for small blocks.
//!
//! Invariants: the pools are created once, on first use, in the device's primary context, with
//! the release threshold, maximum size and reuse policies of the configuration applied before
//! any allocation is made from them; a block's pool is a function of its size alone
//! ([`Pool::serving`]), so freeing needs no record of it; a shareable pool is created only where
//! the device supports it, and a shareable main pool has no small pool beside it.

use crate::config::Config;
use crate::driver::{Driver, PoolAttr, PoolHandle, PoolUsage};
use crate::error::{Error, Result};
use std::ops::RangeInclusive;

#[derive(Debug, Clone, Copy)]
pub struct Pool {
    /// The main pool: every block when there is no small pool, else those above `small_max_bytes`.
    pub handle: PoolHandle,
    /// Blocks of at most `small_max_bytes`, kept apart so that small blocks (cached or live)
    /// never split the ranges the main pool needs for large ones.
    pub small: Option<PoolHandle>,
    pub small_max_bytes: u64,
    pub device_total_bytes: u64,
    pub cache_limit_bytes: u64,
    pub cache_max_block_bytes: u64,
}

/// Which of a device's pools: the index into per-pool state such as the reserved bytes last seen.
pub(crate) const MAIN: usize = 0;
pub(crate) const SMALL: usize = 1;

impl Pool {
    /// The device's pools; the main one shareable with other processes if `shareable`.
    pub fn create(
        driver: &dyn Driver,
        device: usize,
        config: &Config,
        shareable: bool,
    ) -> Result<Pool> {
        let total = driver.mem_info(device)?.total_bytes;
        let handle = create_one(driver, device, config, total, shareable)?;
        let small_max_bytes = config.small_pool_max.resolve_bytes(total);
        // A pool size cap or shareable memory applies to one pool: no split then.
        let split = small_max_bytes > 0 && !shareable && config.max_pool_size.is_max();
        let small = match split {
            true => match create_one(driver, device, config, total, false) {
                Ok(small) => Some(small),
                Err(e) => {
                    // The main pool serves every size; the device stays usable.
                    log::warn!("device {device}: no small-block pool, one pool serves all: {e}");
                    None
                }
            },
            false => None,
        };
        Ok(Pool {
            handle,
            small,
            small_max_bytes,
            device_total_bytes: total,
            cache_limit_bytes: config.cache_limit.resolve_bytes(total),
            cache_max_block_bytes: config.cache_max_block.resolve_bytes(total),
        })
    }

    /// The pool that serves blocks of `block_bytes`, with its index (`MAIN` or `SMALL`).
    #[inline]
    pub fn serving(&self, block_bytes: u64) -> (usize, PoolHandle) {
        match self.small {
            Some(small) if block_bytes <= self.small_max_bytes => (SMALL, small),
            _ => (MAIN, self.handle),
        }
    }

    /// The block sizes pool `which` serves.
    pub fn sizes_served(&self, which: usize) -> RangeInclusive<u64> {
        match (which, self.small) {
            (SMALL, _) => 0..=self.small_max_bytes,
            (_, Some(_)) => self.small_max_bytes + 1..=u64::MAX,
            (_, None) => 0..=u64::MAX,
        }
    }

    /// Every pool of the device, the main one first.
    pub fn handles(&self) -> impl Iterator<Item = PoolHandle> {
        std::iter::once(self.handle).chain(self.small)
    }

    /// The pools' usage, summed.
    pub fn usage(&self, driver: &dyn Driver, device: usize) -> Result<PoolUsage> {
        self.handles().try_fold(PoolUsage::default(), |sum, pool| {
            let u = driver.pool_usage(device, pool)?;
            Ok(PoolUsage {
                reserved_bytes: sum.reserved_bytes + u.reserved_bytes,
                reserved_bytes_high: sum.reserved_bytes_high + u.reserved_bytes_high,
                used_bytes: sum.used_bytes + u.used_bytes,
                used_bytes_high: sum.used_bytes_high + u.used_bytes_high,
            })
        })
    }

    /// Runs `f` on every pool; every pool is tried, the first error is returned.
    pub fn for_each(&self, mut f: impl FnMut(PoolHandle) -> Result<()>) -> Result<()> {
        self.handles().map(&mut f).fold(Ok(()), Result::and)
    }
}

fn create_one(
    driver: &dyn Driver,
    device: usize,
    config: &Config,
    total: u64,
    shareable: bool,
) -> Result<PoolHandle> {
    if shareable && !driver.ipc_supported(device)? {
        return Err(Error::DriverUnavailable(format!(
            "device {device} cannot share pool memory with other processes: its driver reports \
             no POSIX file descriptor handles for memory pools \
             (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES); unset STREAMPOOL_IPC and \
             allocate outside streampool.shareable()"
        )));
    }
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
    Ok(handle)
}

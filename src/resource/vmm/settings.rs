//! The resolved settings of a virtual-memory resource: the device's settings
//! ([`VmmSpec`]) with the layout its granularity gives, checked once at the resource's creation.
//!
//! Invariant: a `VmmSettings` holds a page size that is a multiple of the device's granularity
//! and an address reservation that fits the address space ([`VmmSpec::layout`]).

use crate::config::VmmSpec;
use crate::driver::Driver;
use crate::error::Result;

/// The address space reserved up front, as a multiple of the device's memory: live blocks take
/// at most 1x, so half of it is always free for new windows, however fragmented. More is reserved
/// only if no window fits.
pub(super) const ADDRESS_SPACE_PER_DEVICE_MEMORY: u64 = 2;

/// The resolved settings of a virtual-memory resource.
#[derive(Debug, Clone)]
pub struct VmmSettings {
    /// The physical handle size: `STREAMPOOL_VMM_PAGE_SIZE` rounded up to the device's
    /// granularity.
    pub page_bytes: u64,
    /// The first address reservation for large blocks, in whole pages.
    pub extent_bytes: u64,
    /// Blocks up to this size are carved out of carrier pages (0: none; at most half a page).
    pub small_max_bytes: u64,
    /// `STREAMPOOL_MAX_POOL_SIZE`: physical memory never exceeds it.
    pub max_physical_bytes: u64,
    pub release_threshold_bytes: u64,
    /// A page unused this long is cold: moved first to back new blocks, released above the
    /// release threshold.
    pub cold_after_ms: u64,
    /// Beyond this many percent of the bytes in use, idle pages, cold or not, are moved to back
    /// a new block before the device grows (`None`: only cold ones).
    pub growth_slack_percent: Option<u64>,
    /// Device memory the resource leaves free when it grows: new handles are created only while
    /// this much stays free (`STREAMPOOL_VMM_HEADROOM`).
    pub headroom_bytes: u64,
}

impl VmmSettings {
    /// The settings `spec` gives on `device` (of `total_bytes` memory); the page size and the
    /// address reservation are checked ([`VmmSpec::layout`]).
    pub fn resolve(
        spec: &VmmSpec,
        driver: &dyn Driver,
        device: usize,
        total_bytes: u64,
    ) -> Result<VmmSettings> {
        let layout = spec.layout(
            device,
            driver.name(),
            driver.vmm_granularity_bytes(device)?,
            total_bytes,
            ADDRESS_SPACE_PER_DEVICE_MEMORY,
        )?;
        Ok(VmmSettings {
            page_bytes: layout.page_bytes,
            extent_bytes: layout.extent_bytes,
            small_max_bytes: spec.small_max_bytes,
            max_physical_bytes: spec.max_physical_bytes,
            release_threshold_bytes: spec.release_threshold_bytes,
            cold_after_ms: spec.cold_after_ms,
            growth_slack_percent: spec.growth_slack_percent,
            headroom_bytes: spec.headroom_bytes,
        })
    }
}

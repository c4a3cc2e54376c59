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

/// The resolved settings of a virtual-memory resource: the device's settings for it and the
/// layout its granularity gives — each value once.
#[derive(Debug, Clone)]
pub struct VmmSettings {
    /// The physical handle size: `STREAMPOOL_VMM_PAGE_SIZE` rounded up to the device's
    /// granularity.
    pub page_bytes: u64,
    /// The first address reservation for large blocks, in whole pages.
    pub extent_bytes: u64,
    /// Everything else, as the device resolved it; `small_max_bytes` at most half a page.
    pub spec: VmmSpec,
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
        // A carrier page holds at least two small blocks.
        let small_max_bytes = spec.small_max_bytes.min(layout.page_bytes / 2);
        Ok(VmmSettings {
            page_bytes: layout.page_bytes,
            extent_bytes: layout.extent_bytes,
            spec: VmmSpec {
                small_max_bytes,
                ..*spec
            },
        })
    }
}

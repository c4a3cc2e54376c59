//! The address layout of the virtual-memory backend on one device: the page size the variable
//! asks for, rounded up to the device's granularity, and the first address reservation.
//!
//! Invariant: a layout holds a page that is a whole number of granules and no larger than the
//! device, and a reservation that fits 64 bits in whole pages, on a device whose headroom leaves
//! memory to allocate; anything else is a configuration error naming the variable to change.

use super::settings::VmmSpec;
use super::{config_error, HEADROOM_ACCEPTED, VMM_PAGE_SIZE_ACCEPTED};
use crate::error::{Error, Result};
use crate::units::format_bytes;

/// The address layout of the virtual-memory backend on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmLayout {
    /// `STREAMPOOL_VMM_PAGE_SIZE` rounded up to the device's granularity.
    pub page_bytes: u64,
    /// The first address reservation: `addresses_per_memory` times the device's memory, in
    /// whole pages.
    pub extent_bytes: u64,
}

/// `bytes` as a user writes a size: in the largest binary unit that divides it (`4MiB`), else
/// in bytes.
fn written_bytes(bytes: u64) -> String {
    let units = [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    match units
        .iter()
        .find(|(unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
    {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => bytes.to_string(),
    }
}

impl VmmSpec {
    /// The vmm backend's layout on `device` (`driver` is its name), of `total_bytes` memory and
    /// `granularity_bytes` mapping granularity, reserving `addresses_per_memory` times its memory
    /// in addresses. Checked arithmetic: a page larger than the device, or a reservation that
    /// does not fit 64 bits, is an error naming the variable to change.
    pub fn layout(
        &self,
        device: usize,
        driver: &str,
        granularity_bytes: u64,
        total_bytes: u64,
        addresses_per_memory: u64,
    ) -> Result<VmmLayout> {
        if self.headroom_bytes >= total_bytes {
            return Err(config_error(
                "STREAMPOOL_VMM_HEADROOM",
                &written_bytes(self.headroom_bytes),
                &format!(
                    "device {device}'s memory is {}: it would all stay free, and nothing could \
                     be allocated",
                    format_bytes(total_bytes)
                ),
                HEADROOM_ACCEPTED,
            ));
        }
        let granularity_bytes = granularity_bytes.max(1);
        let wanted_bytes = self.page_size.resolve_bytes(total_bytes);
        let page_bytes = wanted_bytes
            .div_ceil(granularity_bytes)
            .max(1)
            .checked_mul(granularity_bytes)
            .filter(|&page| page <= total_bytes)
            .ok_or_else(|| {
                // The simulated device's memory is a setting too: name it beside the page's.
                let memory = match driver {
                    "sim" => " (STREAMPOOL_SIM_MEMORY)",
                    _ => "",
                };
                config_error(
                    "STREAMPOOL_VMM_PAGE_SIZE",
                    &written_bytes(wanted_bytes),
                    &format!(
                        "pages of {} (rounded up to the granularity of {}; the default is \
                         2MiB) are larger than device {device}'s memory{memory} of {}",
                        format_bytes(wanted_bytes),
                        format_bytes(granularity_bytes),
                        format_bytes(total_bytes)
                    ),
                    VMM_PAGE_SIZE_ACCEPTED,
                )
            })?;
        let extent_bytes = total_bytes
            .checked_mul(addresses_per_memory)
            .and_then(|bytes| bytes.checked_next_multiple_of(page_bytes))
            .ok_or_else(|| {
                let reason = format!(
                    "the virtual-memory backend reserves {addresses_per_memory} times device \
                     {device}'s memory of {} in addresses, more than 64 bits can address",
                    format_bytes(total_bytes)
                );
                match driver {
                    "sim" => config_error(
                        "STREAMPOOL_SIM_MEMORY",
                        &total_bytes.to_string(),
                        &reason,
                        "with STREAMPOOL_BACKEND=vmm, a byte count below 8192PiB (twice it, in whole pages, \
                         must fit in 64 bits)",
                    ),
                    _ => Error::DriverUnavailable(format!(
                        "{reason}: set STREAMPOOL_BACKEND=pool"
                    )),
                }
            })?;
        Ok(VmmLayout {
            page_bytes,
            extent_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::written_bytes;

    #[test]
    fn a_size_reads_as_a_user_writes_it() {
        for (bytes, text) in [
            (4 << 20, "4MiB"),
            (3 << 29, "1536MiB"),
            (1 << 40, "1TiB"),
            (2048, "2KiB"),
            (1536, "1536"),
            (0, "0"),
        ] {
            assert_eq!(written_bytes(bytes), text);
        }
    }
}

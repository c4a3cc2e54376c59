//! Resolved settings: what each layer below the allocator needs from a [`Config`], made in this
//! one place. The allocator turns its `Config` into [`Settings`] once; a device resolves them on
//! its first use, once its memory is known ([`Settings::for_device`]: sizes may be a share of it,
//! `80%`), into [`DeviceSettings`] — the device's own, its sources' ([`SourceSettings`]), a CUDA
//! pool's ([`PoolSettings`]) and the virtual-memory resource's ([`VmmSpec`], whose page size
//! waits for the device's granularity: [`VmmSpec::layout`]).
//!
//! Invariant: nothing below the allocator reads a `Config`: a [`Settings`] holds one but shows
//! only its backend; a setting read below it is a field of the structs here, resolved here and
//! only here, and nowhere copied field by field.

use super::{Backend, Config, ReusePolicy};
use crate::units::SizeSpec;

/// A `Config` as the layers below the allocator need it, before a device's memory is known: the
/// parsed configuration itself, whose fields only [`Settings::for_device`] reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Settings(Config);

impl From<&Config> for Settings {
    fn from(c: &Config) -> Settings {
        Settings(c.clone())
    }
}

/// One device's settings, resolved against its memory.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSettings {
    /// The cache's budget (`STREAMPOOL_CACHE_LIMIT`).
    pub cache_limit_bytes: u64,
    /// Blocks larger than this are not cached (`STREAMPOOL_CACHE_MAX_BLOCK`).
    pub cache_max_block_bytes: u64,
    /// Before a pool grows, wait for the allocating stream and release its unused memory.
    pub trim_on_growth: bool,
    /// After this long without an allocation or a free, give back all memory not in use.
    pub idle_release_ms: Option<u64>,
    /// A background thread tends the device (idle release, the vmm release threshold).
    pub background: bool,
    /// Every block is shareable (`STREAMPOOL_IPC`): the shareable scope changes nothing.
    pub every_block_shareable: bool,
    pub sources: SourceSettings,
}

/// What the device's own sources are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSettings {
    pub backend: Backend,
    /// One shareable pool serves every size (`STREAMPOOL_IPC`).
    pub one_shareable_pool: bool,
    /// Blocks up to this size are small (`STREAMPOOL_SMALL_POOL_MAX`; 0: none).
    pub small_max_bytes: u64,
    /// The pool backend gives small blocks a pool of their own (not under a pool size cap,
    /// which applies to one pool).
    pub small_pool: bool,
    pub pool: PoolSettings,
    pub vmm: VmmSpec,
}

/// A CUDA pool's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// `u64::MAX`: unlimited.
    pub max_size_bytes: u64,
    pub release_threshold_bytes: u64,
    pub reuse: ReusePolicy,
}

/// The virtual-memory resource's settings, but for its layout ([`VmmSpec::layout`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmmSpec {
    /// `STREAMPOOL_VMM_PAGE_SIZE`, before rounding to the device's granularity.
    pub page_size: SizeSpec,
    /// The most memory one new handle backs (`STREAMPOOL_VMM_SPAN_SIZE`; `None`: auto).
    pub span_max_bytes: Option<u64>,
    /// Blocks up to this size are carved out of carrier pages (0: none).
    pub small_max_bytes: u64,
    /// `STREAMPOOL_MAX_POOL_SIZE`: physical memory never exceeds it.
    pub max_physical_bytes: u64,
    pub release_threshold_bytes: u64,
    /// A page unused this long is cold: moved first to back new blocks (`u64::MAX`: never).
    pub cold_after_ms: u64,
    /// Beyond this many percent of the bytes in use, idle pages, cold or not, are moved to back
    /// a new block before the device grows (`None`: only cold ones).
    pub growth_slack_percent: Option<u64>,
    /// Device memory left free when the resource grows (`STREAMPOOL_VMM_HEADROOM`).
    pub headroom_bytes: u64,
}

impl Settings {
    /// The settings the variables `pairs` give, the others at their defaults: a test states a
    /// setting as a user writes it. Panics on a malformed value.
    #[cfg(test)]
    pub fn with_variables(pairs: &[(&str, &str)]) -> Settings {
        let names = pairs.iter().map(|(name, _)| name.into());
        super::names::check_names(names).expect("test settings name variables streampool reads");
        let value = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        };
        Settings(Config::from_lookup(value).expect("test settings parse"))
    }

    /// These settings with no background thread (a test that tends the device itself).
    #[cfg(test)]
    pub fn without_background(mut self) -> Settings {
        self.0.background = false;
        self
    }

    /// The backend every device's own sources come from (known before a device's memory).
    pub fn backend(&self) -> Backend {
        self.0.backend
    }

    /// The settings of a device of `total_bytes` memory.
    pub fn for_device(&self, total_bytes: u64) -> DeviceSettings {
        let resolve = |spec: SizeSpec| spec.resolve_bytes(total_bytes);
        let c = &self.0;
        let small_max_bytes = resolve(c.small_pool_max);
        let max_size_bytes = resolve(c.max_pool_size);
        let release_threshold_bytes = resolve(c.release_threshold);
        DeviceSettings {
            cache_limit_bytes: resolve(c.cache_limit),
            cache_max_block_bytes: resolve(c.cache_max_block),
            trim_on_growth: c.trim_on_growth,
            idle_release_ms: c.idle_release_ms,
            background: c.background,
            every_block_shareable: c.ipc,
            sources: SourceSettings {
                backend: c.backend,
                one_shareable_pool: c.ipc,
                small_max_bytes,
                small_pool: small_max_bytes > 0 && c.max_pool_size.is_max(),
                pool: PoolSettings {
                    max_size_bytes,
                    release_threshold_bytes,
                    reuse: c.reuse,
                },
                vmm: VmmSpec {
                    page_size: c.vmm_page_size,
                    span_max_bytes: c.vmm_span_bytes,
                    small_max_bytes,
                    max_physical_bytes: max_size_bytes,
                    release_threshold_bytes,
                    cold_after_ms: c.vmm_cold_after_ms,
                    growth_slack_percent: c.vmm_growth_slack_percent,
                    headroom_bytes: resolve(c.vmm_headroom),
                },
            },
        }
    }
}

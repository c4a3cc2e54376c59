//! `STREAMPOOL_*` environment variables, parsed once into a [`Config`], their defaults
//! ([`DEFAULTS`]), the logger's filter ([`log_filter`]), and the settings each layer below the
//! allocator gets from it ([`Settings`]). No other module reads the environment.
//!
//! Invariant: a malformed value — one that is not UTF-8 text included — is an error naming the
//! variable, the value and what is accepted, in that order, then why (`values`); it is never
//! ignored or replaced by a default. A `STREAMPOOL_*` variable that streampool does not read is
//! refused the same way ([`names`]).

mod defaults;
mod logger;
mod settings;
mod values;
mod vmm_layout;

pub use defaults::{VariableDefault, DEFAULTS, LOG_DEFAULT};
pub use logger::log_filter;
pub use settings::{DeviceSettings, PoolSettings, Settings, SourceSettings, VmmSpec};
pub use vmm_layout::VmmLayout;

pub(crate) use values::{config_error, utf8_value, validate_log_filter, VMM_PAGE_SIZE_ACCEPTED};
use values::{
    parse_bool, parse_duration_ms, parse_percent, HEADROOM_ACCEPTED, PEER_ACCESS_ACCEPTED,
    SIM_DEVICES, SIM_DEVICES_ACCEPTED, SIM_MEMORY_ACCEPTED, VMM_SPAN_SIZE_ACCEPTED,
};

use crate::error::{Error, Result};
use crate::units::{parse_size, SizeSpec, SIZE_ACCEPTED};
use std::ffi::OsString;

pub mod names;

/// Above the release threshold, the virtual-memory backend releases memory unused this long (a
/// training step or a request takes less: what a loop uses every step stays mapped).
pub const VMM_RELEASE_AFTER_MS: u64 = 1000;

/// The most memory a simulated device may have (`STREAMPOOL_SIM_MEMORY`): its addresses must
/// stay apart from the next device's.
pub(crate) const SIM_MAX_MEMORY_BYTES: u64 = 1 << 40;

/// Which implementation of the CUDA edge to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    Cuda,
    Sim,
}

impl DriverKind {
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Cuda => "cuda",
            DriverKind::Sim => "sim",
        }
    }
}

/// What serves a device's blocks (`STREAMPOOL_BACKEND`); `resource::provision` has a row for
/// each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A CUDA stream-ordered memory pool.
    Pool,
    /// streampool's own virtual-memory pool (`cuMemCreate` + `cuMemMap`), one address range per
    /// device shared by all streams.
    Vmm,
    /// Managed (unified) memory (`cuMemAllocManaged`), one allocation per block.
    Managed,
}

impl Backend {
    /// Every backend, in the order the docs list them.
    ///
    /// cbindgen:ignore
    pub const ALL: [Backend; 3] = [Backend::Pool, Backend::Vmm, Backend::Managed];

    /// Its value of `STREAMPOOL_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Pool => "pool",
            Backend::Vmm => "vmm",
            Backend::Managed => "managed",
        }
    }
}

/// The values `STREAMPOOL_BACKEND` accepts: [`Backend::ALL`]'s names (a test checks).
pub(crate) const BACKEND_ACCEPTED: &str = "pool, vmm, managed";

/// Which other devices get access to a device's pool (`STREAMPOOL_PEER_ACCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAccess {
    /// Devices this process allocates on get access to each other's pools, where capable: what
    /// PyTorch's cross-device copies need, since its pluggable path copies with `cudaMemcpyAsync`.
    Auto,
    /// Every device gets access to every pool when the pool is created.
    On,
    Off,
}

/// The pool's reuse policies; `None` keeps the driver's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReusePolicy {
    pub follow_event_dependencies: Option<bool>,
    pub allow_opportunistic: Option<bool>,
    pub allow_internal_dependencies: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub driver: DriverKind,
    pub backend: Backend,
    pub release_threshold: SizeSpec,
    /// `Max` means the pool may grow to the whole device.
    pub max_pool_size: SizeSpec,
    pub cache_limit: SizeSpec,
    /// Blocks larger than this go straight back to the pool, which can coalesce them.
    pub cache_max_block: SizeSpec,
    /// Blocks up to this size come from a second pool of their own (0: one pool for all).
    pub small_pool_max: SizeSpec,
    /// Before the pool grows, wait for the allocating stream and release the pool's unused
    /// memory, so memory freed in pieces is not kept beside the new growth.
    pub trim_on_growth: bool,
    pub peer_access: PeerAccess,
    /// Every pool is shareable with other processes (CUDA's guide says such pools may keep
    /// their memory; in two runs on H200s, driver 580, such a pool gave it back at each trim).
    pub ipc: bool,
    pub reuse: ReusePolicy,
    /// The physical handle size of the virtual-memory backend (a multiple of the device's
    /// granularity, which it is rounded up to).
    pub vmm_page_size: SizeSpec,
    /// The most memory one new physical handle of the virtual-memory backend backs, a span of
    /// adjacent pages (`STREAMPOOL_VMM_SPAN_SIZE`; 0 or at most a page: every handle one page);
    /// `None` (auto): 256 MiB while memory cycles (a trim at a synchronisation gave memory back,
    /// and less than the most held then is mapped again), else 8 MiB, or one page where a
    /// growth slack or a cold age makes pages move.
    pub vmm_span_bytes: Option<u64>,
    /// A page of the virtual-memory backend unused this long is cold: moved first to back new
    /// blocks (`STREAMPOOL_VMM_COLD_AFTER`); `u64::MAX`: never.
    pub vmm_cold_after_ms: u64,
    /// Beyond this many percent of the bytes in use, the virtual-memory backend moves idle
    /// pages, cold or not, before the device grows (`STREAMPOOL_VMM_GROWTH_SLACK`); `None`:
    /// only cold ones (and, near a full device, any).
    pub vmm_growth_slack_percent: Option<u64>,
    /// Device memory the virtual-memory backend leaves free when it grows, for what the CUDA
    /// runtime and libraries take outside the allocator (`STREAMPOOL_VMM_HEADROOM`).
    pub vmm_headroom: SizeSpec,
    /// After this long without an allocation or a free, a device gives back all memory not in
    /// use (`STREAMPOOL_IDLE_RELEASE`); `None`: never.
    pub idle_release_ms: Option<u64>,
    /// Each device is tended by a background thread: idle release, and the virtual-memory
    /// backend's release threshold (no variable: tests and the fuzzer call it themselves to
    /// stay deterministic).
    pub background: bool,
    pub sim_devices: usize,
    pub sim_memory_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            driver: DriverKind::Cuda,
            // streampool's virtual-memory pool: on the H200 it holds about what expandable
            // segments hold (a few MiB above them on BERT and GPT-2, level on
            // churn, below on multistream and compiled), the CUDA pool more on every workload
            // (bench/results/2026-11-30-h200-default); it alone shares any block and sleeps.
            // A device without virtual memory management gets the pool
            // ([`crate::resource::provision`]).
            backend: Backend::Vmm,
            // Keep everything: a threshold of 0 with per-step syncs costs 1.4-1.5x in training.
            release_threshold: SizeSpec::Max,
            max_pool_size: SizeSpec::Max,
            // Small on purpose: cached blocks pin pool memory (H100, GPT-2: a 256 MiB budget
            // raised peak memory from 1.10x to 1.14x of live bytes, 25% to 1.4x) while training
            // time did not change measurably; 64 MiB still serves alloc/free loops at every size.
            cache_limit: SizeSpec::Bytes(64 << 20),
            cache_max_block: SizeSpec::Max,
            // H100, same run (bench/results/small-pool/README.md): peak
            // memory / peak live bytes went from 1.19x to 1.11x on GPT-2 and from 1.06x to 1.01x
            // on ResNet-50; the pool alone is at 1.09x / 0.99x. 1 MiB is PyTorch's own split.
            small_pool_max: SizeSpec::Bytes(1 << 20),
            // On: H100, training with shapes changing every step (bench/diag_growth.py): over
            // 600 steps the pool grew 3% after warm-up without it and stayed flat with it; over
            // 1,000 steps it still grew 3-4% either way (bench/results/soak/README.md).
            trim_on_growth: true,
            peer_access: PeerAccess::Auto,
            ipc: false,
            reuse: ReusePolicy::default(),
            // The granularity of current GPUs: the least memory held beyond live blocks. PyTorch
            // uses 20 MiB for large blocks because mapping cost grows with the number of
            // handles; which is better here awaits a measurement on the GPU.
            vmm_page_size: SizeSpec::Bytes(2 << 20),
            // 256 MiB spans where memory goes back at a synchronisation and is mapped again (a
            // release threshold, empty_cache), 8 MiB ones elsewhere, pages one by one where
            // they move (a slack or a cold age set): docs/replay.md, "Spans".
            vmm_span_bytes: None,
            // Never: while the device has room, a growth maps new memory rather than move idle
            // pages (near full it moves them: STREAMPOOL_VMM_HEADROOM). A page moved on the
            // allocating thread in a busy step costs far more than the call alone (cuMemSetAccess
            // 115-470 us there, 26 us idle): on an H200, BERT on vmm ran 1.233 (1.185-1.315) x
            // native with pages cold after 10 ms and the 1% slack, 1.012 (0.995-1.037) with
            // neither, at 476 MiB against 470 (expandable segments: 472), A/A 1.003
            // (bench/results/2026-11-30-h200-handles, call 2). A 3% slack with pages cold after
            // 1 s still ran 1.194 (call 1).
            vmm_cold_after_ms: u64::MAX,
            // Off, for the same measurement as the cold age above: a slack bounds memory by
            // moving pages in the steps of a loop, which is what made BERT slow. Replayed traces
            // (the replay gate's medians, bench/replay/baseline.json), peak / live before -> now:
            // bert 1.008 -> 1.021, gpt2 1.010 -> 1.071, churn 1.027 -> 1.074, vision_sizes 1.010
            // -> 1.020, multistream 1.043 -> 1.271; the pages mapped in BERT's timed steps 126
            // -> 0, GPT-2's 115 -> 0 (docs/replay.md). Held memory then has no bound over what
            // is in use but the device's room less the headroom, the memory fraction and the
            // pool cap, as with expandable segments; an idle period gives it back.
            vmm_growth_slack_percent: None,
            // Room for what the CUDA runtime takes while the program runs: lazily loaded
            // kernels, the local memory a kernel with a large stack grows, libraries' own
            // workspaces. A full device fails the next kernel launch with an error the allocator
            // never sees. A share of the card, as local memory grows with its SMs: 819 MiB of an
            // 80 GiB H100 (where 1 KiB of stack per thread takes 264 MiB), 245 MiB of 24 GiB.
            vmm_headroom: SizeSpec::Percent(1.0),
            // A notebook cell, an evaluation pause or an idle server: after 2 s the memory goes
            // to the process's neighbours; a training loop never idles that long.
            idle_release_ms: Some(2000),
            background: true,
            sim_devices: 2,
            sim_memory_bytes: 16 << 30,
        }
    }
}

impl Config {
    /// Reads the process environment; a `STREAMPOOL_*` value that is not UTF-8 text is an error
    /// naming it, like any malformed value, and so is a `STREAMPOOL_*` variable streampool does
    /// not read ([`names`]).
    pub fn from_env() -> Result<Config> {
        names::check_names(std::env::vars_os().map(|(name, _)| name))?;
        Config::from_os_lookup(|name| std::env::var_os(name))
    }

    /// Checks `value` for variable `name` alone, as if it were the only `STREAMPOOL_*` variable
    /// set: the error a malformed value gets (naming the variable, the value and what is
    /// accepted), a misspelt name's, or one for a name that is not a `STREAMPOOL_*` variable.
    pub fn check_setting(name: &str, value: &str) -> Result<()> {
        if !name.starts_with(names::PREFIX) {
            return Err(Error::InvalidArgument(format!(
                "{name:?} is not a STREAMPOOL_* variable"
            )));
        }
        names::check_names([OsString::from(name)])?;
        Config::from_lookup(|n| (n == name).then(|| value.to_owned())).map(|_| ())
    }

    /// Parses from any key lookup (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        Config::from_os_lookup(|name| get(name).map(OsString::from))
    }

    /// Parses from a lookup of raw values, as the environment holds them.
    pub fn from_os_lookup(get_os: impl Fn(&str) -> Option<OsString>) -> Result<Config> {
        let get = |name: &'static str| -> Result<Option<String>> {
            get_os(name).map(|v| utf8_value(name, v)).transpose()
        };
        let mut c = Config::default();
        if let Some(v) = get("STREAMPOOL_DRIVER")? {
            c.driver = match v.trim().to_ascii_lowercase().as_str() {
                "cuda" => DriverKind::Cuda,
                "sim" => DriverKind::Sim,
                _ => {
                    return Err(config_error(
                        "STREAMPOOL_DRIVER",
                        &v,
                        "unknown driver",
                        "cuda or sim",
                    ))
                }
            };
        }
        if let Some(v) = get("STREAMPOOL_BACKEND")? {
            let name = v.trim().to_ascii_lowercase();
            c.backend = (Backend::ALL.into_iter())
                .find(|b| b.name() == name)
                .ok_or_else(|| {
                    config_error(
                        "STREAMPOOL_BACKEND",
                        &v,
                        "unknown backend",
                        BACKEND_ACCEPTED,
                    )
                })?;
        }
        let size = |name: &'static str, default: SizeSpec| -> Result<SizeSpec> {
            match get(name)? {
                None => Ok(default),
                Some(v) => {
                    parse_size(&v).map_err(|reason| config_error(name, &v, &reason, SIZE_ACCEPTED))
                }
            }
        };
        c.release_threshold = size("STREAMPOOL_RELEASE_THRESHOLD", c.release_threshold)?;
        // Zero, in bytes or as a share of the device, is no cap (the README's "`0` = unlimited").
        c.max_pool_size = match size("STREAMPOOL_MAX_POOL_SIZE", c.max_pool_size)? {
            SizeSpec::Bytes(0) => SizeSpec::Max,
            SizeSpec::Percent(0.0) => SizeSpec::Max,
            other => other,
        };
        c.cache_limit = size("STREAMPOOL_CACHE_LIMIT", c.cache_limit)?;
        c.cache_max_block = size("STREAMPOOL_CACHE_MAX_BLOCK", c.cache_max_block)?;
        c.small_pool_max = size("STREAMPOOL_SMALL_POOL_MAX", c.small_pool_max)?;
        // A size of at most 1 TiB, not a share of the device (`what` names it in that refusal).
        let bytes_up_to_1tib = |name: &'static str, v: &str, accepted: &'static str, what: &str| {
            let refuse = |reason: &str| config_error(name, v, reason, accepted);
            match parse_size(v).map_err(|reason| refuse(&reason))? {
                SizeSpec::Bytes(b) if b <= 1 << 40 => Ok(b),
                SizeSpec::Bytes(_) => Err(refuse("larger than 1 TiB")),
                SizeSpec::Percent(_) | SizeSpec::Max => Err(refuse(&format!(
                    "{what} is a size, not a share of the device"
                ))),
            }
        };
        if let Some(v) = get("STREAMPOOL_VMM_PAGE_SIZE")? {
            let (name, accepted) = ("STREAMPOOL_VMM_PAGE_SIZE", VMM_PAGE_SIZE_ACCEPTED);
            c.vmm_page_size = match bytes_up_to_1tib(name, &v, accepted, "a page size")? {
                0 => {
                    let reason = "a page needs a byte at least";
                    return Err(config_error(name, &v, reason, accepted));
                }
                b => SizeSpec::Bytes(b),
            };
        }
        if let Some(v) = get("STREAMPOOL_VMM_SPAN_SIZE")? {
            c.vmm_span_bytes = match v.trim().eq_ignore_ascii_case("auto") {
                true => None,
                false => Some(bytes_up_to_1tib(
                    "STREAMPOOL_VMM_SPAN_SIZE",
                    &v,
                    VMM_SPAN_SIZE_ACCEPTED,
                    "a span",
                )?),
            };
        }
        if let Some(v) = get("STREAMPOOL_VMM_HEADROOM")? {
            let refuse = |reason: &str| {
                config_error("STREAMPOOL_VMM_HEADROOM", &v, reason, HEADROOM_ACCEPTED)
            };
            c.vmm_headroom = match parse_size(&v).map_err(|reason| refuse(&reason))? {
                SizeSpec::Max => return Err(refuse("the whole device cannot stay free")),
                SizeSpec::Percent(p) if p >= 100.0 => {
                    return Err(refuse("the whole device cannot stay free"))
                }
                other => other,
            };
        }
        if let Some(v) = get("STREAMPOOL_IDLE_RELEASE")? {
            c.idle_release_ms = parse_duration_ms("STREAMPOOL_IDLE_RELEASE", &v)?;
        }
        if let Some(v) = get("STREAMPOOL_VMM_GROWTH_SLACK")? {
            c.vmm_growth_slack_percent = parse_percent("STREAMPOOL_VMM_GROWTH_SLACK", &v)?;
        }
        if let Some(v) = get("STREAMPOOL_VMM_COLD_AFTER")? {
            c.vmm_cold_after_ms =
                parse_duration_ms("STREAMPOOL_VMM_COLD_AFTER", &v)?.unwrap_or(u64::MAX);
        }
        let flag = |name: &'static str| -> Result<Option<bool>> {
            get(name)?.map(|v| parse_bool(name, &v)).transpose()
        };
        if let Some(on) = flag("STREAMPOOL_TRIM_ON_GROWTH")? {
            c.trim_on_growth = on;
        }
        if let Some(on) = flag("STREAMPOOL_IPC")? {
            c.ipc = on;
        }
        if let Some(v) = get("STREAMPOOL_PEER_ACCESS")? {
            c.peer_access = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => PeerAccess::Auto,
                _ => match parse_bool("STREAMPOOL_PEER_ACCESS", &v) {
                    Ok(true) => PeerAccess::On,
                    Ok(false) => PeerAccess::Off,
                    Err(_) => {
                        return Err(config_error(
                            "STREAMPOOL_PEER_ACCESS",
                            &v,
                            "not auto or a boolean",
                            PEER_ACCESS_ACCEPTED,
                        ))
                    }
                },
            };
        }
        c.reuse = ReusePolicy {
            follow_event_dependencies: flag("STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES")?,
            allow_opportunistic: flag("STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC")?,
            allow_internal_dependencies: flag("STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES")?,
        };
        if let Some(v) = get("STREAMPOOL_SIM_DEVICES")? {
            let refuse = |reason: &str| {
                config_error("STREAMPOOL_SIM_DEVICES", &v, reason, SIM_DEVICES_ACCEPTED)
            };
            c.sim_devices = match v.trim().parse::<usize>() {
                Ok(n) if SIM_DEVICES.contains(&n) => n,
                Ok(0) => return Err(refuse("no devices")),
                Ok(_) => return Err(refuse("more than 64 devices")),
                Err(_) => return Err(refuse("not a whole number")),
            };
        }
        if let Some(v) = get("STREAMPOOL_SIM_MEMORY")? {
            let refuse = |reason: &str| {
                config_error("STREAMPOOL_SIM_MEMORY", &v, reason, SIM_MEMORY_ACCEPTED)
            };
            c.sim_memory_bytes = match parse_size(&v).map_err(|reason| refuse(&reason))? {
                SizeSpec::Bytes(b) if b > SIM_MAX_MEMORY_BYTES => {
                    return Err(refuse("a simulated device has at most 1TiB"))
                }
                SizeSpec::Bytes(b) if b > 0 => b,
                SizeSpec::Bytes(_) => return Err(refuse("a device needs some memory")),
                SizeSpec::Percent(_) => {
                    return Err(refuse(
                        "this sets the device's memory: a share of it means nothing",
                    ))
                }
                SizeSpec::Max => return Err(refuse("the simulated device needs a size")),
            };
        }
        if let Some(v) = get("STREAMPOOL_LOG")? {
            validate_log_filter(&v)?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests;

//! The allocator of a process: one [`DeviceAllocator`] (`src/device/`) per device over one
//! [`Driver`]. A call about one device (statistics, trims, sleep, PyTorch's pools, exports) goes
//! to the device [`Allocator::device`] hands out; what is here is the allocation entries (sizes
//! are decided here) and the calls over every device or the whole process (record_stream,
//! empty_cache, peer access, the timeline, imports from other processes).
//!
//! Invariants: every public entry validates its arguments (size, device index, pointer) before
//! any state changes, so a rejected call leaves statistics untouched; sizes are decided here: 0
//! gets NULL, above [`MAX_ALLOCATION_BYTES`] is out of memory (as PyTorch reports any request it
//! cannot serve), counted in `num_ooms` and changing nothing else; a device one of whose parts
//! reports itself disabled (after a panic) is disabled as a whole (the device sees to it:
//! `DeviceAllocator::disabling`).

use crate::config::{Config, DriverKind, Settings};
use crate::device::DeviceAllocator;
use crate::driver::{cuda::CudaDriver, DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::history::{History, Recorder, StreampoolEvent};
use crate::ipc::imports::Imports;
use crate::ipc::{self, StreampoolIpcHandle};
use crate::peer::Peers;
use crate::resource::graph_pool::PoolId;
use std::sync::Arc;

/// The largest request streampool passes on: 2^48 bytes (256 TiB), beyond any GPU's memory and
/// far from the sizes whose rounding would overflow 64 bits. A larger request is out of memory at
/// once (the message says why), like one at or below it that is more than the device has.
pub const MAX_ALLOCATION_BYTES: u64 = 1 << 48;

pub struct Allocator {
    driver: Arc<dyn Driver>,
    devices: Vec<Arc<DeviceAllocator>>,
    history: Arc<History>,
    imports: Imports,
    peers: Arc<Peers>,
}

impl Allocator {
    /// Builds the allocator the environment's `STREAMPOOL_*` variables ask for.
    pub fn from_env() -> Result<Allocator> {
        Config::from_env().and_then(Allocator::from_config)
    }

    /// Builds the allocator the configuration asks for.
    pub fn from_config(config: Config) -> Result<Allocator> {
        let driver: Arc<dyn Driver> = match config.driver {
            DriverKind::Cuda => Arc::new(CudaDriver::new()?),
            DriverKind::Sim => sim_driver(&config)?,
        };
        Allocator::new(driver, config)
    }

    pub fn new(driver: Arc<dyn Driver>, config: Config) -> Result<Allocator> {
        // The one place where the layers below get what they need from the configuration.
        let settings = Arc::new(Settings::from(&config));
        let history = Arc::new(History::default());
        let count = driver.device_count()?;
        let peers = Arc::new(Peers::new(config.peer_access, count));
        let devices = (0..count)
            .map(|d| {
                let (driver, settings) = (Arc::clone(&driver), Arc::clone(&settings));
                let recorder = Arc::new(Recorder::new(d, Arc::clone(&history)));
                DeviceAllocator::new(d, driver, settings, recorder, Arc::clone(&peers))
            })
            .collect();
        log::info!("streampool: {} driver, {count} device(s)", driver.name());
        Ok(Allocator {
            driver,
            devices,
            history,
            imports: Imports::default(),
            peers,
        })
    }

    pub fn driver_name(&self) -> &'static str {
        self.driver.name()
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Device `device`: every call about one device goes to it (`stats`, `trim`, `sleep`, ...).
    #[inline]
    pub fn device(&self, device: i64) -> Result<&DeviceAllocator> {
        match usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
        {
            Some(d) => Ok(d),
            None => Err(self.no_such_device(device)),
        }
    }

    #[cold]
    fn no_such_device(&self, device: i64) -> Error {
        let what = match self.driver.name() {
            "sim" => "simulated device(s) (STREAMPOOL_SIM_DEVICES)",
            _ => "CUDA device(s)",
        };
        Error::InvalidArgument(format!(
            "device index {device} is out of range: streampool sees {} {what} (valid: 0..{})",
            self.devices.len(),
            self.devices.len().saturating_sub(1)
        ))
    }

    /// Allocates `bytes` on `device`, ordered on `stream`; 0 bytes gives NULL (not an error).
    pub fn malloc(&self, bytes: u64, device: i64, stream: Stream) -> Result<DevicePtr> {
        let d = self.device(device)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if bytes > MAX_ALLOCATION_BYTES {
            return Err(d.out_of_memory_above(bytes, stream, MAX_ALLOCATION_BYTES));
        }
        // Not `d.disabling(..)`: on success this writes the pointer, with no copy of the whole
        // Result.
        let allocated = timed_section!(
            "device allocate",
            d.allocate(bytes, stream, ipc::in_shareable_scope())
        );
        match allocated {
            Ok(ptr) => Ok(ptr),
            Err(e) => Err(d.disabling_error(e)),
        }
    }

    /// Allocates `bytes` on `device` like [`Allocator::malloc`], into PyTorch memory pool `pool`
    /// if one claimed the allocation; out of memory outside a pool, from a pool that PyTorch
    /// allows to serve then (`use_on_oom`).
    pub fn malloc_into(
        &self,
        bytes: u64,
        device: i64,
        stream: Stream,
        pool: Option<PoolId>,
    ) -> Result<DevicePtr> {
        let d = self.device(device)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if bytes > MAX_ALLOCATION_BYTES {
            return Err(d.out_of_memory_above(bytes, stream, MAX_ALLOCATION_BYTES));
        }
        let Some(id) = pool else {
            return match self.malloc(bytes, device, stream) {
                Err(Error::OutOfMemory(report)) => d
                    .allocate_from_oom_pools(bytes, stream)
                    .ok_or(Error::OutOfMemory(report)),
                other => other,
            };
        };
        d.allocate_in_graph_pool(id, bytes, stream)
    }

    /// Frees `ptr` (NULL does nothing); the block is ordered after all work on its allocation
    /// stream.
    pub fn free(&self, ptr: DevicePtr, device: i64) -> Result<()> {
        let d = self.device(device)?;
        if ptr == DevicePtr::NULL {
            return Ok(());
        }
        match timed_section!("device free", d.free(ptr)) {
            Ok(()) => Ok(()),
            Err(e) => Err(d.disabling_error(e)),
        }
    }

    /// Finds the device owning `ptr` (record_stream gets no device index from PyTorch).
    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        let mut last = Error::UnknownPointer {
            ptr: ptr.0,
            device: 0,
        };
        // A disabled device cannot say whether the block is its own: the others are asked, and
        // its error is the answer only if none has it.
        let mut disabled = None;
        for d in &self.devices {
            match d.disabling(d.record_stream(ptr, stream)) {
                Err(e @ Error::UnknownPointer { .. }) => last = e,
                Err(e @ Error::Disabled { .. }) => disabled = disabled.or(Some(e)),
                other => return other,
            }
        }
        Err(disabled.unwrap_or(last))
    }

    /// One look of the background thread at every device (idle release, the vmm release
    /// threshold, fences): for tests and replays that run without the thread
    /// (`Config::background` off) on the simulator's clock.
    pub fn tend(&self) {
        use crate::background::Tended;
        self.devices.iter().for_each(|d| d.tend());
    }

    /// `torch.cuda.empty_cache()`: every device returns its cache and trims its resources to 0.
    /// A device whose context is broken does not keep the others from being emptied; the first
    /// error is reported.
    pub fn empty_cache(&self) -> Result<()> {
        self.devices
            .iter()
            .map(|d| d.disabling(d.flush(0)))
            .fold(Ok(()), Result::and)
    }

    /// PyTorch's init hook: warns if PyTorch and the driver disagree on the device count.
    pub fn check_device_count(&self, torch_count: i64) {
        let seen = self.devices.len();
        if usize::try_from(torch_count).ok() != Some(seen) {
            log::warn!("streampool_init: PyTorch reports {torch_count} devices, the driver {seen}");
        }
    }

    /// Starts the timeline afresh, keeping the newest `max_entries` events, or stops it (what
    /// was recorded stays readable).
    pub fn record_history(&self, enabled: bool, max_entries: usize) -> Result<()> {
        if !enabled {
            self.history.stop();
            return Ok(());
        }
        self.history.start(max_entries)?;
        self.devices.iter().for_each(|d| d.start_timeline());
        Ok(())
    }

    /// The newest `max_events` timeline events with their stack contexts, and how many events
    /// were dropped.
    pub fn history_with_contexts(
        &self,
        max_events: usize,
    ) -> (Vec<StreampoolEvent>, Vec<u64>, u64) {
        self.history.newest_with_contexts(max_events)
    }

    /// (address, stack context) of `device`'s live blocks allocated with one while recording.
    pub fn live_contexts(&self, device: i64) -> Result<Vec<(u64, u64)>> {
        self.device(device)?;
        Ok(self.history.live_contexts(device as i32))
    }

    /// True while the timeline records.
    pub fn history_recording(&self) -> bool {
        self.history.enabled()
    }

    /// The newest `max_events` timeline events, oldest first, and how many the ring dropped.
    pub fn history(&self, max_events: usize) -> (Vec<StreampoolEvent>, u64) {
        self.history.newest(max_events)
    }

    /// Grants every other device access to `device`'s resources, or to every device's if
    /// `device` is -1; every capable pair is granted, the first that is not is the error.
    pub fn enable_peer_access(&self, device: i64) -> Result<()> {
        if device != -1 {
            return self.device(device)?.enable_peer_access();
        }
        self.devices
            .iter()
            .map(|d| d.enable_peer_access())
            .fold(Ok(()), Result::and)
    }

    /// Maps a block another process exported page by page, from its page descriptors (which
    /// stay the caller's; -1 for a page the descriptor before it backs too).
    pub fn ipc_import_pages(
        &self,
        handle: &ipc::StreampoolIpcPages,
        fds: &[i32],
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.device(handle.device.into())?;
        self.imports
            .import_pages(self.driver.as_ref(), handle, fds, stream)
    }

    /// Imports another process's pool on `device` from `fd` (which stays the caller's).
    pub fn ipc_import_pool(&self, device: i64, fd: i32) -> Result<u64> {
        self.device(device)?;
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "not a file descriptor: {fd}"
            )));
        }
        let (pool, new) = self
            .imports
            .import_pool(&self.driver, device as usize, fd)?;
        if let Some(pool) = new {
            self.peers
                .extra_pool(self.driver.as_ref(), device as usize, pool);
        }
        Ok(pool.raw() as u64)
    }

    pub fn ipc_import(
        &self,
        pool_token: u64,
        handle: &StreampoolIpcHandle,
        stream: Stream,
    ) -> Result<DevicePtr> {
        self.device(handle.device.into())?;
        self.imports
            .import(self.driver.as_ref(), pool_token, handle, stream)
    }

    pub fn ipc_close(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.imports.close(self.driver.as_ref(), ptr, stream)
    }

    /// Imported blocks not yet closed.
    pub fn ipc_open_imports(&self) -> usize {
        self.imports.open_count()
    }
}

/// Parses the `STREAMPOOL_*` variables of the environment (an early, clear error).
pub fn check_env() -> Result<()> {
    Config::from_env().map(|_| ())
}

/// Checks one value of one variable alone ([`Config::check_setting`]).
pub fn check_setting(name: &str, value: &str) -> Result<()> {
    Config::check_setting(name, value)
}

/// The driver `STREAMPOOL_DRIVER` selects; "invalid" if the configuration is malformed.
pub fn configured_driver_name() -> &'static str {
    Config::from_env().map_or("invalid", |c| c.driver.name())
}

#[cfg(feature = "sim")]
fn sim_driver(config: &Config) -> Result<Arc<dyn Driver>> {
    use crate::driver::sim::SimDriver;
    Ok(Arc::new(SimDriver::new(
        config.sim_devices,
        config.sim_memory_bytes,
    )))
}

#[cfg(not(feature = "sim"))]
fn sim_driver(_config: &Config) -> Result<Arc<dyn Driver>> {
    Err(Error::DriverUnavailable(
        "STREAMPOOL_DRIVER=sim: this build of libstreampool has no simulated driver (build it with \
         `cargo build --features sim`, or use the pip package, which includes it)"
            .into(),
    ))
}

//! The allocator of a process: one [`DeviceAllocator`] per device over one [`Driver`].
//!
//! Invariant: every public entry validates its arguments (size, device index, pointer ownership)
//! before any state changes, so a rejected call leaves statistics untouched.

use crate::config::{Config, DriverKind};
use crate::device::DeviceAllocator;
use crate::driver::{cuda::CudaDriver, sim::SimDriver, DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::history::{History, StreampoolBlock, StreampoolEvent};
use crate::ipc::{Imports, StreampoolIpcHandle};
use crate::peer::Peers;
use crate::stats::StreampoolStats;
use std::sync::Arc;

pub struct Allocator {
    driver: Arc<dyn Driver>,
    devices: Vec<DeviceAllocator>,
    history: Arc<History>,
    imports: Imports,
    peers: Arc<Peers>,
}

impl Allocator {
    /// Builds the allocator the configuration asks for.
    pub fn from_config(config: Config) -> Result<Allocator> {
        let driver: Arc<dyn Driver> = match config.driver {
            DriverKind::Cuda => Arc::new(CudaDriver::new()?),
            DriverKind::Sim => {
                Arc::new(SimDriver::new(config.sim_devices, config.sim_memory_bytes))
            }
        };
        Allocator::new(driver, config)
    }

    pub fn new(driver: Arc<dyn Driver>, config: Config) -> Result<Allocator> {
        let config = Arc::new(config);
        let history = Arc::new(History::default());
        let count = driver.device_count()?;
        let peers = Arc::new(Peers::new(config.peer_access, count));
        let devices = (0..count)
            .map(|d| {
                let (driver, config) = (Arc::clone(&driver), Arc::clone(&config));
                let (history, device_peers) = (Arc::clone(&history), Arc::clone(&peers));
                DeviceAllocator::new(d, driver, config, history, device_peers)
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

    pub fn device(&self, device: i64) -> Result<&DeviceAllocator> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device index {device} is out of range: streampool sees {} CUDA device(s) (valid: 0..{})",
                    self.devices.len(),
                    self.devices.len().saturating_sub(1)
                ))
            })
    }

    /// Allocates `bytes` (> 0) on `device`, ordered on `stream`.
    pub fn malloc(&self, bytes: u64, device: i64, stream: Stream) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "allocation size must be positive, got 0 bytes".into(),
            ));
        }
        self.device(device)?.allocate(bytes, stream)
    }

    /// Frees `ptr`; the block is ordered after all work on its allocation stream.
    pub fn free(&self, ptr: DevicePtr, device: i64) -> Result<()> {
        self.device(device)?.free(ptr)
    }

    /// Finds the device owning `ptr` (record_stream gets no device index from PyTorch).
    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        let mut last = Error::UnknownPointer { ptr, device: 0 };
        for d in &self.devices {
            match d.record_stream(ptr, stream) {
                Err(e @ Error::UnknownPointer { .. }) => last = e,
                other => return other,
            }
        }
        Err(last)
    }

    /// `torch.cuda.empty_cache()`: every device returns its cache and trims its pool to 0. A
    /// device whose context is broken does not keep the others from being emptied; the first
    /// error is reported.
    pub fn empty_cache(&self) -> Result<()> {
        self.devices
            .iter()
            .map(|d| d.flush(0))
            .fold(Ok(()), Result::and)
    }

    /// Starts the timeline afresh, keeping the newest `max_entries` events, or stops it (what
    /// was recorded stays readable).
    pub fn record_history(&self, enabled: bool, max_entries: usize) -> Result<()> {
        if !enabled {
            self.history.stop();
            return Ok(());
        }
        self.history.start(max_entries)?;
        self.devices
            .iter()
            .for_each(DeviceAllocator::start_timeline);
        Ok(())
    }

    /// The newest `max_events` timeline events, oldest first, and how many the ring dropped.
    pub fn history(&self, max_events: usize) -> (Vec<StreampoolEvent>, u64) {
        self.history.newest(max_events)
    }

    /// Grants every other device access to `device`'s pool, or to every pool if `device` is
    /// -1; every capable pair is granted, the first that is not is the error.
    pub fn enable_peer_access(&self, device: i64) -> Result<()> {
        if device != -1 {
            return self.device(device)?.enable_peer_access();
        }
        self.devices
            .iter()
            .map(DeviceAllocator::enable_peer_access)
            .fold(Ok(()), Result::and)
    }

    /// True if `device` supports stream-ordered memory pools.
    pub fn pools_supported(&self, device: i64) -> Result<bool> {
        self.device(device)?;
        self.driver.pools_supported(device as usize)
    }

    /// True if `device`'s pools can be shared with other processes.
    pub fn ipc_supported(&self, device: i64) -> Result<bool> {
        self.device(device)?;
        self.driver.ipc_supported(device as usize)
    }

    /// Exports the live shareable block at `ptr` on `device`, ready after the work queued on
    /// `stream` so far.
    pub fn ipc_export(
        &self,
        ptr: DevicePtr,
        device: i64,
        stream: Stream,
    ) -> Result<StreampoolIpcHandle> {
        self.device(device)?.export(ptr, stream)
    }

    pub fn ipc_release_export(&self, device: i64, event: u64) -> Result<()> {
        self.device(device)?.release_export(event)
    }

    /// Imports another process's pool on `device` from `fd` (which stays the caller's).
    pub fn ipc_import_pool(&self, device: i64, fd: i32) -> Result<u64> {
        self.device(device)?;
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "not a file descriptor: {fd}"
            )));
        }
        let driver = self.driver.as_ref();
        let (pool, new) = self.imports.import_pool(driver, device as usize, fd)?;
        if new {
            self.peers.extra_pool(driver, device as usize, pool);
        }
        Ok(pool.0 as u64)
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

    pub fn blocks(&self, device: i64) -> Result<Vec<StreampoolBlock>> {
        Ok(self.device(device)?.blocks())
    }

    pub fn stats(&self, device: i64) -> Result<StreampoolStats> {
        self.device(device)?.stats()
    }
}

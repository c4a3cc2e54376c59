//! streampool: a PyTorch pluggable CUDA allocator — a small Rust layer over its own
//! virtual-memory pool for every block size (`STREAMPOOL_BACKEND=vmm`, the default) or over CUDA
//! stream-ordered memory pools (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`, `pool`).
//!
//! Layers, top to bottom, in the order a call goes through them:
//! - `ffi`: the C ABI (`my_malloc`/`my_free` for PyTorch, hooks, stats): argument conversion,
//!   `catch_unwind`, status codes; no policy.
//! - `api`: the process-wide [`Allocator`] built from [`config`] on first use; `fork`: whether
//!   this process is a fork child of a user of streampool (a leaf any layer may ask).
//! - [`allocator`]: argument checks, the settings each layer below gets from the configuration
//!   ([`config::Settings`]), and one device allocator per device.
//! - `device`: the pipeline of one device, one layer per file: graph capture and stream waits,
//!   cache, limit, growth, out-of-memory recovery, over its resources.
//! - `resource`: where blocks come from — a CUDA pool, the virtual-memory pool, the driver's
//!   pool for graph memory — behind one narrow trait (RMM's `device_memory_resource` shape), in
//!   one table of sources per device whose ids every block record carries.
//! - `stream_order`: events, the capture watch and fences — when memory freed on one stream may
//!   serve another — for the device's waits and the virtual-memory resource alike.
//! - [`history`]: the memory timeline; `peer`: which devices may access which memory;
//!   [`ipc`]: sharing blocks with other processes; [`stats`]: counters and the C stats struct.
//! - [`driver`]: the CUDA edge behind one trait — `driver::cuda` for GPUs, `driver::sim` (feature
//!   `sim`) for CI and machines without a GPU.
//!
//! Stream-reuse rule: a freed block is reused without synchronisation only by its own stream; a
//! block that other streams used (record_stream) waits for events on them.
//!
//! Thread-safety rule: PyTorch calls in from the main thread and from autograd's backward thread
//! at once; each device's ledger sits behind its own mutex, and driver calls that can wait for the
//! GPU are made outside it.

/// `$e`, its wall time added to `$name`'s total in a diagnostic build (`--features call-counts`,
/// `src/driver/cuda/call_counts.rs`); `$e` alone otherwise.
macro_rules! timed_section {
    ($name:literal, $e:expr) => {{
        #[cfg(feature = "call-counts")]
        let _timed = $crate::driver::cuda::call_counts::Timed::start($name);
        $e
    }};
}

pub mod allocator;
mod api;
mod background;
mod cache;
pub mod config;
mod cxx_throw;
mod device;
pub mod driver;
pub mod error;
mod fasthash;
mod ffi;
mod fork;
pub mod history;
pub mod ipc;
mod peer;
pub(crate) mod resource;
pub mod stats;
mod stream_order;
mod switches;
mod sync;
pub mod tag;
mod torch_edge;
pub mod units;

pub use allocator::{Allocator, MAX_ALLOCATION_BYTES};
pub use config::Config;
pub use device::StreamFilter;
pub use device::{DeviceAllocator, GraphPools};
pub use error::{Error, Result};
pub use stats::StreampoolStats;

/// For tests of the fork-safe first-use paths (builds with the simulated driver).
#[doc(hidden)]
#[cfg(feature = "sim")]
pub mod testing {
    pub use crate::cxx_throw::cxx_runtime_found;
    pub use crate::fork::{set_first_use_hook, FirstUse};
}

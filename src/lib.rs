//! streampool: a PyTorch pluggable CUDA allocator — a small Rust cache over CUDA stream-ordered
//! memory pools (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`).
//!
//! Layers, top to bottom:
//! - [`ffi`]: the C ABI (`my_malloc`/`my_free` for PyTorch, hooks, stats); no policy.
//! - [`api`]: the process-wide [`allocator::Allocator`] built from [`config`] on first use.
//! - [`allocator`]: argument checks and one [`device::DeviceAllocator`] per device.
//! - [`device`]: the policy, in order: graph capture, cache, limit, room, pool, OOM recovery.
//! - [`cache`]: freed blocks per stream; [`pool`]: the device's explicit pool and its knobs.
//! - [`history`]: the memory timeline each device records into when asked; [`peer`]: which
//!   devices may access which pools; [`ipc`]: sharing blocks with other processes.
//! - [`driver`]: the CUDA edge behind one trait — [`driver::cuda`] for GPUs, [`driver::sim`] for CI.
//!
//! Stream-reuse rule: a freed block is reused without synchronisation only by its own stream; a
//! block that other streams used (record_stream) waits for events on them.
//!
//! Thread-safety rule: PyTorch calls in from the main thread and from autograd's backward thread
//! at once; each device's bookkeeping sits behind its own mutex, and driver calls that can take
//! time are made outside it.

pub mod allocator;
pub mod api;
pub mod cache;
pub mod config;
mod cxx_throw;
pub mod device;
pub mod driver;
pub mod error;
pub mod fasthash;
pub mod ffi;
pub mod history;
pub mod ipc;
pub mod peer;
pub mod pool;
pub mod stats;
mod sync;
pub mod units;

pub use allocator::Allocator;
pub use config::Config;
pub use error::{Error, Result};
pub use stats::StreampoolStats;

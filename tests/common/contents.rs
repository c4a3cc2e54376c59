//! Helpers for the sleep tests: a vmm rig, a stream filter for PyTorch pools' routes, and
//! contents written into device memory and checked bit for bit (the simulator carries bytes only
//! where a test wrote them). A test crate takes it with `#[path = "common/contents.rs"] mod
//! contents;` beside `mod common;`.
#![allow(dead_code)]

use crate::common::{base_config, rig_with, Rig};
use streampool::config::Backend;
use streampool::driver::DevicePtr;
use streampool::Config;

/// An allocator on the vmm backend over one strict simulated device of `memory_bytes`.
pub fn vmm_rig(memory_bytes: u64) -> Rig {
    let config = Config {
        backend: Backend::Vmm,
        ..base_config()
    };
    rig_with(1, memory_bytes, config)
}

/// As [`vmm_rig`], with new memory in physical handles of up to `span_bytes`.
pub fn vmm_rig_with_spans(memory_bytes: u64, span_bytes: u64) -> Rig {
    let config = Config {
        backend: Backend::Vmm,
        vmm_span_bytes: Some(span_bytes),
        ..base_config()
    };
    rig_with(1, memory_bytes, config)
}

/// After a sleep that failed: the host buffer is kept, the device serves an allocation, and a
/// sleep and a wake go through.
pub fn awake_and_sleeps_again(r: &Rig) {
    assert!(
        r.device(0).sleep_host_buffer_bytes() > 0,
        "the buffer is kept"
    );
    let b = r.malloc(1 << 20, 0, 1); // awake: allocations are served
    r.free(b, 0);
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
}

/// A pattern of `bytes` that differs from zeros (fresh memory) and from every other `seed`.
pub fn pattern(seed: u8, bytes: u64) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
        .collect()
}

/// Writes a pattern of `seed` into `[ptr, ptr + bytes)` of device 0.
pub fn fill(r: &Rig, ptr: DevicePtr, bytes: u64, seed: u8) {
    r.sim.write_memory(0, ptr, &pattern(seed, bytes)).unwrap();
}

/// True if `[ptr, ptr + bytes)` of device 0 holds the pattern of `seed` bit for bit.
pub fn holds(r: &Rig, ptr: DevicePtr, bytes: u64, seed: u8) -> bool {
    r.sim.read_memory(0, ptr, bytes).unwrap() == pattern(seed, bytes)
}

/// True if `[ptr, ptr + bytes)` of device 0 holds zeros: fresh memory, the contents discarded.
pub fn discarded(r: &Rig, ptr: DevicePtr, bytes: u64) -> bool {
    r.sim
        .read_memory(0, ptr, bytes)
        .unwrap()
        .iter()
        .all(|&b| b == 0)
}

/// Allocates `bytes` on device 0, stream 1, under `tag` (none: no tag pushed).
pub fn tagged(r: &Rig, tag: Option<&str>, bytes: u64) -> DevicePtr {
    if let Some(tag) = tag {
        streampool::tag::push(tag).unwrap();
    }
    let ptr = r.malloc(bytes, 0, 1);
    if tag.is_some() {
        streampool::tag::pop().unwrap();
    }
    ptr
}

/// Claims allocations on one stream, as a capture's filter claims its capturing stream.
pub struct OnStream(pub streampool::driver::Stream);

impl streampool::StreamFilter for OnStream {
    fn claims(&self, stream: streampool::driver::Stream) -> bool {
        stream == self.0
    }
}

//! Model checks of the virtual-memory resource's lock (`STREAMPOOL_BACKEND=vmm`): with
//! `--cfg loom` its lock and the device's are loom's (src/sync.rs), and loom runs each model under
//! every interleaving of their lock sections with at most 3 preemptions per run.
//!
//! - `two_streams_allocate_and_free_large_blocks_at_once`: blocks never overlap (a block is live
//!   until its free is called) and everything is unmapped after `empty_cache` (that a block
//!   handed to the other stream waits there for the free, on the GPU, is checked by
//!   src/resource/vmm/tests.rs);
//! - `growth_remaps_idle_pages_while_another_thread_frees`: a thread that must grow takes idle
//!   pages while another frees next to them (the strict simulator panics on any unmap of memory
//!   still in use).
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom_vmm
//! ```
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;

struct Rig {
    sim: std::sync::Arc<SimDriver>,
    alloc: Allocator,
    /// Live blocks (address, bytes): a std mutex, never held across a loom operation.
    live: std::sync::Mutex<Vec<(DevicePtr, u64)>>,
}

impl Rig {
    fn new() -> Rig {
        let sim = std::sync::Arc::new(SimDriver::new(1, 64 * MIB).strict());
        let config = Config {
            backend: Backend::Vmm,
            background: false,
            ..Config::default()
        };
        let alloc = Allocator::new(sim.clone() as std::sync::Arc<dyn Driver>, config).unwrap();
        Rig {
            sim,
            alloc,
            live: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn malloc(&self, bytes: u64, stream: Stream) -> DevicePtr {
        let ptr = self.alloc.malloc(bytes, 0, stream).unwrap();
        self.sim.touch(0, 0, ptr, bytes, stream).unwrap();
        let mut live = self.live.lock().unwrap();
        for &(other, other_bytes) in live.iter() {
            assert!(
                ptr.0 + bytes <= other.0 || other.0 + other_bytes <= ptr.0,
                "{ptr:#x}+{bytes} overlaps live {other:#x}+{other_bytes}"
            );
        }
        live.push((ptr, bytes));
        ptr
    }

    /// Forgets, then frees: a block is live until its free is called. From then on the resource
    /// may hand its range to another stream at once (ordered after the free by a GPU-side wait).
    fn free(&self, ptr: DevicePtr) {
        self.live.lock().unwrap().retain(|&(p, _)| p != ptr);
        self.alloc.free(ptr, 0).unwrap();
    }

    fn finish(&self) {
        self.sim.complete_all();
        self.alloc.empty_cache().unwrap();
        assert_eq!(self.sim.physical_bytes(0), 0, "mapped memory left");
        assert_eq!(self.sim.outstanding_bytes(), 0, "pool memory left");
    }
}

fn check(model: fn()) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(3));
    builder.check(model);
}

#[test]
fn two_streams_allocate_and_free_large_blocks_at_once() {
    check(|| {
        let r = Arc::new(Rig::new());
        let threads: Vec<_> = [Stream(1), Stream(2)]
            .into_iter()
            .map(|stream| {
                let r = Arc::clone(&r);
                thread::spawn(move || {
                    let a = r.malloc(4 * MIB, stream);
                    r.free(a);
                    let b = r.malloc(4 * MIB, stream);
                    r.free(b);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        r.finish();
    });
}

#[test]
fn growth_remaps_idle_pages_while_another_thread_frees() {
    check(|| {
        let r = Arc::new(Rig::new());
        let blocks: Vec<DevicePtr> = (0..3).map(|_| r.malloc(2 * MIB, Stream(1))).collect();
        r.free(blocks[0]);
        r.sim.complete_all();
        let freeing = {
            let r = Arc::clone(&r);
            let last = blocks[2];
            thread::spawn(move || r.free(last))
        };
        let big = r.malloc(6 * MIB, Stream(2));
        freeing.join().unwrap();
        r.free(big);
        r.free(blocks[1]);
        r.finish();
    });
}

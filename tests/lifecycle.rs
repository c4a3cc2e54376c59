//! Process shapes beyond one healthy device: several devices of which only some are used, a
//! device whose context is lost to a sticky error while another keeps working, the device count
//! PyTorch reports at init, and an allocator dropped (its driver resources go with it).

mod common;
#[path = "common/wrapped.rs"]
mod wrapped;

use common::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use streampool::driver::sim::SimDriver;
use streampool::driver::{Driver, Stream};
use streampool::{Allocator, Config};
use wrapped::Wrapped;

#[test]
fn a_device_that_is_never_used_gets_no_pool_and_costs_nothing() {
    let r = rig(64 * MIB);
    let p = r.malloc(3 * MIB, 1, 7);
    r.free(p, 1);
    let unused = r.stats(0);
    assert_eq!(
        (
            unused.reserved_bytes,
            unused.num_allocs,
            unused.num_device_allocs
        ),
        (0, 0, 0),
        "device 0 was never asked for memory: {unused:?}"
    );
    assert!(r.stats(1).reserved_bytes >= 3 * MIB);
    r.alloc.empty_cache().unwrap();
    assert_eq!(
        r.stats(0),
        unused,
        "empty_cache must not create a pool either"
    );
    r.finish();
}

#[test]
fn a_sticky_error_on_one_device_is_reported_and_the_other_device_keeps_working() {
    // Not strict: device 0's memory cannot be given back once its context is gone.
    let sim = Arc::new(SimDriver::new(2, 64 * MIB));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, common::base_config()).unwrap();
    let on_0 = alloc.malloc(MIB, 0, Stream(0)).unwrap();
    let on_1 = alloc.malloc(MIB, 1, Stream(0)).unwrap();
    alloc.free(on_1, 1).unwrap(); // cached on device 1

    sim.set_sticky_error(0);
    let e = alloc.malloc(8 * MIB, 0, Stream(0)).unwrap_err().to_string();
    assert!(
        e.starts_with("CUDA driver call cu") && e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{e}"
    );
    alloc.free(on_0, 0).unwrap(); // bookkeeping only: the block goes to the cache
    let e = alloc.empty_cache().unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    assert_eq!(
        alloc.device(1).unwrap().stats().unwrap().cached_bytes,
        0,
        "device 1 was emptied despite device 0's error"
    );

    for round in 0..100 {
        let p = alloc.malloc(MIB + round * 512, 1, Stream(3)).unwrap();
        alloc.free(p, 1).unwrap();
    }
    alloc.empty_cache().unwrap_err();
    let s = alloc.device(1).unwrap().stats().unwrap();
    assert_eq!(
        (s.allocated_bytes, s.num_allocs, s.num_frees),
        (0, 101, 101)
    );
    assert_eq!(
        s.pool_used_bytes, 0,
        "device 1 holds nothing after empty_cache"
    );
}

/// Warnings logged in this test binary (by every test in it).
struct Warnings(Mutex<Vec<String>>);

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            self.0.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static WARNINGS: Warnings = Warnings(Mutex::new(Vec::new()));

#[test]
fn init_warns_only_when_pytorch_and_the_driver_disagree_on_the_device_count() {
    log::set_logger(&WARNINGS).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let about_counts = || -> Vec<String> {
        let warnings = WARNINGS.0.lock().unwrap();
        warnings
            .iter()
            .filter(|w| w.starts_with("streampool_init"))
            .cloned()
            .collect()
    };
    let r = rig(64 * MIB); // 2 devices
    r.alloc.check_device_count(2);
    assert!(about_counts().is_empty(), "{:?}", about_counts());
    r.alloc.check_device_count(3);
    r.alloc.check_device_count(-1);
    assert_eq!(
        about_counts(),
        [
            "streampool_init: PyTorch reports 3 devices, the driver 2",
            "streampool_init: PyTorch reports -1 devices, the driver 2"
        ]
    );
    r.finish();
}

/// Events kept for reuse (spares, from waits that completed) are destroyed with the allocator.
#[test]
fn dropping_the_allocator_destroys_the_events_it_kept() {
    let w = Wrapped::new(1, 64 * MIB);
    let alloc = Allocator::new(w.clone() as Arc<dyn Driver>, common::pool_config()).unwrap();
    let p = alloc.malloc(MIB, 0, Stream(1)).unwrap();
    alloc.record_stream(p, Stream(2)).unwrap();
    alloc.free(p, 0).unwrap(); // waits for an event on stream 2
    w.sim.complete_all();
    alloc.empty_cache().unwrap(); // the wait is over: its event becomes a spare
    let created = w.events_created.load(Ordering::SeqCst);
    assert_eq!(created, 1);
    assert_eq!(
        w.events_destroyed.load(Ordering::SeqCst),
        0,
        "kept for reuse"
    );
    drop(alloc);
    assert_eq!(w.events_destroyed.load(Ordering::SeqCst), created);
    assert_eq!(w.sim.outstanding_bytes(), 0);
}

/// The vmm resource's fences (one still waiting on its stream, spares from completed ones) are
/// destroyed with the allocator too.
#[test]
fn dropping_the_allocator_destroys_the_vmm_resource_s_fences() {
    let w = Wrapped::new(1, 256 * MIB);
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let alloc = Allocator::new(w.clone() as Arc<dyn Driver>, config).unwrap();
    let a = alloc.malloc(8 * MIB, 0, Stream(1)).unwrap();
    let b = alloc.malloc(8 * MIB, 0, Stream(2)).unwrap();
    w.sim.touch(0, 0, b, 8 * MIB, Stream(2)).unwrap(); // stream 2 still works on b
    alloc.free(a, 0).unwrap(); // a fence on stream 1
    alloc.free(b, 0).unwrap(); // a fence on stream 2, not completed
    let created = w.events_created.load(Ordering::SeqCst);
    assert!(created >= 2, "{created} fences");
    drop(alloc);
    assert_eq!(w.events_destroyed.load(Ordering::SeqCst), created);
}

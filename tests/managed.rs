//! The managed-memory backend (`STREAMPOOL_BACKEND=managed`) through the whole allocator, on a
//! strict simulator that checks races: blocks come from `cuMemAllocManaged`, are reused in
//! stream order, run out as any backend does, and all go back on `empty_cache`; a device without
//! managed memory gets the pool backend.

use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::units::SizeSpec;
use streampool::{Allocator, Config, Error};

const MIB: u64 = 1 << 20;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

fn managed_rig(memory_bytes: u64, unsupported: bool) -> (Arc<SimDriver>, Allocator) {
    managed_rig_with(memory_bytes, unsupported, SizeSpec::Max)
}

fn managed_rig_with(
    memory_bytes: u64,
    unsupported: bool,
    max_pool_size: SizeSpec,
) -> (Arc<SimDriver>, Allocator) {
    let sim = Arc::new(SimDriver::new(1, memory_bytes).strict().check_races());
    if unsupported {
        sim.set_managed_unsupported(0);
    }
    let config = Config {
        backend: Backend::Managed,
        background: false,
        max_pool_size,
        ..Config::default()
    };
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    (sim, alloc)
}

fn malloc(sim: &SimDriver, alloc: &Allocator, bytes: u64, stream: Stream) -> DevicePtr {
    let ptr = alloc.malloc(bytes, 0, stream).unwrap();
    sim.touch(0, 0, ptr, bytes, stream).unwrap();
    ptr
}

#[test]
fn blocks_are_managed_memory_reused_in_stream_order_and_all_given_back() {
    let (sim, alloc) = managed_rig(256 * MIB, false);
    let a = malloc(&sim, &alloc, 3 * MIB, S1);
    let b = malloc(&sim, &alloc, 4096, S2);
    assert!(
        sim.pool_infos(0).is_empty(),
        "no CUDA pool: {:?}",
        sim.pool_infos(0)
    );
    assert!(sim.outstanding_bytes() >= 3 * MIB + 4096);
    alloc.free(a, 0).unwrap();
    // S1's work still uses a: S2 gets other memory, S1 may get a again.
    let c = malloc(&sim, &alloc, 3 * MIB, S2);
    assert_ne!(c, a);
    assert_eq!(malloc(&sim, &alloc, 3 * MIB, S1), a);
    for p in [a, b, c] {
        alloc.free(p, 0).unwrap();
    }
    alloc.empty_cache().unwrap();
    assert_eq!(
        sim.outstanding_bytes(),
        0,
        "everything went back to the driver"
    );
}

#[test]
fn running_out_is_an_out_of_memory_error_and_frees_make_room() {
    let (sim, alloc) = managed_rig(64 * MIB, false);
    let mut blocks = Vec::new();
    let error = loop {
        match alloc.malloc(8 * MIB, 0, S1) {
            Ok(p) => blocks.push(p),
            Err(e) => break e,
        }
        assert!(blocks.len() < 100);
    };
    assert!(matches!(error, Error::OutOfMemory(_)), "{error}");
    assert_eq!(blocks.len(), 8);
    for p in blocks.drain(..) {
        alloc.free(p, 0).unwrap();
    }
    // Another size on another stream: what S1 freed goes back to the driver first.
    let big = malloc(&sim, &alloc, 40 * MIB, S2);
    alloc.free(big, 0).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(sim.outstanding_bytes(), 0);
}

/// `STREAMPOOL_MAX_POOL_SIZE` was not passed to the managed backend: with it at 100 MiB the
/// blocks took the whole device. It is a hard cap there too, and so is the memory fraction
/// (kept blocks went past it under 32 threads): kept blocks go back first.
#[test]
fn the_pool_size_cap_and_the_fraction_hold_live_and_kept_blocks_and_kept_ones_go_back_first() {
    let capped = managed_rig_with(64 * MIB, false, SizeSpec::Bytes(8 * MIB));
    let fraction = managed_rig_with(64 * MIB, false, SizeSpec::Max);
    fraction
        .1
        .device(0)
        .unwrap()
        .set_memory_fraction(0.125)
        .unwrap();
    for (sim, alloc) in [capped, fraction] {
        eight_mib_hold(&sim, &alloc);
    }
}

fn eight_mib_hold(sim: &SimDriver, alloc: &Allocator) {
    let reserved = |alloc: &Allocator| alloc.device(0).unwrap().stats().unwrap().reserved_bytes;
    let a = malloc(sim, alloc, 3 * MIB, S1);
    let b = malloc(sim, alloc, 3 * MIB, S1);
    match alloc.malloc(3 * MIB, 0, S1) {
        Err(Error::OutOfMemory(_)) => {}
        other => panic!("a third block of 3 MiB under an 8 MiB cap gave {other:?}"),
    }
    assert_eq!(sim.outstanding_bytes(), 6 * MIB);
    // Kept for reuse, then given back (after its stream's work) to make room for another size.
    alloc.free(a, 0).unwrap();
    let c = malloc(sim, alloc, 5 * MIB, S2);
    assert!(reserved(alloc) <= 8 * MIB, "{} B reserved", reserved(alloc));
    assert_eq!(sim.outstanding_bytes(), 8 * MIB);
    for p in [b, c] {
        alloc.free(p, 0).unwrap();
    }
    alloc.empty_cache().unwrap();
    assert_eq!(sim.outstanding_bytes(), 0);
}

#[test]
fn a_device_without_managed_memory_gets_the_pool_backend() {
    let (sim, alloc) = managed_rig(256 * MIB, true);
    let a = malloc(&sim, &alloc, MIB, S1);
    assert!(!sim.pool_infos(0).is_empty(), "the CUDA pool serves it");
    alloc.free(a, 0).unwrap();
    alloc.empty_cache().unwrap();
    sim.complete_all();
    assert_eq!(sim.outstanding_bytes(), 0);
}

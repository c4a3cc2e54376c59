//! What a device holds from CUDA in all (`DeviceAllocator::reserved_total`, PyTorch's
//! `memory_reserved()` under install()): its own resources' reserved bytes, plus the shareable
//! pool's, never less than the blocks it holds, and back to the pools' figure once those are gone.

mod common;

use common::rig;
use streampool::ipc::{begin_shareable, end_shareable};

const MIB: u64 = 1 << 20;

#[test]
fn the_total_counts_the_own_resources_and_the_shareable_pool() {
    let rig = rig(1 << 30);
    let own = |rig: &common::Rig| rig.stats(0).reserved_bytes;
    let held: Vec<_> = [1, 5, 33, 130]
        .iter()
        .map(|&n| rig.malloc(n * MIB, 0, 0))
        .collect();
    let (total, peak) = rig.alloc.device(0).unwrap().reserved_total().unwrap();
    assert_eq!(total, own(&rig), "only the own resources hold memory");
    assert!(total >= 169 * MIB && peak >= total);

    begin_shareable().unwrap();
    let shared = rig.malloc(3 * MIB, 0, 0);
    end_shareable().unwrap();
    let (with_shared, _) = rig.alloc.device(0).unwrap().reserved_total().unwrap();
    let stats = rig.stats(0);
    assert!(stats.ipc_reserved_bytes >= 3 * MIB);
    assert_eq!(
        with_shared,
        stats.reserved_bytes + stats.ipc_reserved_bytes,
        "the shareable pool is a pool of its own"
    );
    rig.free(shared, 0);
    for p in held {
        rig.free(p, 0);
    }
    rig.alloc.device(0).unwrap().trim(0).unwrap();
    let (after, _) = rig.alloc.device(0).unwrap().reserved_total().unwrap();
    let stats = rig.stats(0);
    assert_eq!(after, stats.reserved_bytes + stats.ipc_reserved_bytes);
    assert!(
        rig.alloc
            .device(7)
            .and_then(|dev| dev.reserved_total())
            .is_err(),
        "no such device"
    );
    rig.finish();
}

/// `empty_cache()` gives the shareable pool's free memory back too, and `reset_peak_memory_stats()`
/// brings the reserved peak back to the current figure, the shareable pool's part included (its
/// peak is added in, so a reset that left it kept an old high).
#[test]
fn a_reset_brings_the_peak_back_to_the_total_with_the_shareable_pool() {
    let rig = rig(1 << 30);
    let device = rig.alloc.device(0).unwrap();
    begin_shareable().unwrap();
    let shared = rig.malloc(64 * MIB, 0, 0);
    end_shareable().unwrap();
    let kept = rig.malloc(MIB, 0, 0);
    rig.free(shared, 0);
    rig.sim.complete_all();
    device.trim(0).unwrap(); // (empty_cache()): the shareable pool's free memory goes back too
    assert!(rig.stats(0).ipc_reserved_bytes < 64 * MIB);
    let (now, peak) = device.reserved_total().unwrap();
    assert!(
        peak >= now + 64 * MIB,
        "the shareable pool's 64 MiB went back: {now} {peak}"
    );
    device.reset_peak_stats().unwrap();
    assert_eq!(device.reserved_total().unwrap(), (now, now));
    rig.free(kept, 0);
    rig.finish();
}

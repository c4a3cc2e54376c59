//! The device's pools through the simulated driver: growth and trimming, the small-block pool,
//! and driver faults — found by what they are (`pool_infos`), never by handle number.

mod common;
use common::*;
use streampool::driver::sim::SimFault;
use streampool::driver::{DevicePtr, PoolDriver, PoolUsage};
use streampool::ipc::{begin_shareable, end_shareable};
use streampool::units::SizeSpec;
use streampool::Config;

#[test]
fn driver_faults_are_reported_and_the_allocator_stays_usable() {
    let r = pool_rig(1 << 30);
    r.sim.inject_fault(SimFault::PoolCreate, 1);
    let e = r.alloc.malloc(64, 0, s(0)).unwrap_err().to_string();
    assert!(e.contains("cuMemPoolCreate"), "{e}");
    let p = r.malloc(64, 0, 0); // pool creation is retried on the next call
    r.sim.inject_fault(SimFault::Alloc, 1);
    let e = r.alloc.malloc(1 << 20, 0, s(0)).unwrap_err().to_string();
    assert!(e.contains("cuMemAllocFromPoolAsync"), "{e}");
    r.alloc.record_stream(p, s(3)).unwrap();
    r.sim.inject_fault(SimFault::EventCreate, 1);
    r.free(p, 0); // falls back to synchronising
    let q = r.malloc(64, 0, 0);
    r.free(q, 0);
    assert_eq!(r.stats(0).allocated_bytes, 0);
    r.finish();
}

/// Once, a pool whose attributes could not be set after `cuMemPoolCreate` was never
/// destroyed. Fails if the error path leaks the pool (`std::mem::forget` of the resource there).
#[test]
fn a_pool_whose_attributes_cannot_be_set_is_destroyed() {
    let r = pool_rig(1 << 30);
    r.sim.inject_fault(SimFault::PoolSetAttr, 1);
    let e = r.alloc.malloc(4096, 0, s(0)).unwrap_err().to_string();
    assert!(e.contains("cuMemPoolSetAttribute"), "{e}");
    let pools = r.sim.pool_infos(0);
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert!(pools[0].destroyed, "the half-made pool is gone: {pools:?}");
    // The next allocation makes the pools afresh.
    let p = r.malloc(4096, 0, 0);
    assert_eq!(r.own_pools(0).len(), 2, "main and small-block pools");
    // The same for the shareable pool of `streampool.shareable()`.
    r.sim.inject_fault(SimFault::PoolSetAttr, 1);
    begin_shareable().unwrap();
    let e = r.alloc.malloc(4096, 0, s(0)).unwrap_err().to_string();
    end_shareable().unwrap();
    assert!(e.contains("cuMemPoolSetAttribute"), "{e}");
    let shareable: Vec<_> = r
        .sim
        .pool_infos(0)
        .into_iter()
        .filter(|p| p.shareable)
        .collect();
    assert_eq!(shareable.len(), 1, "{shareable:?}");
    assert!(shareable[0].destroyed, "{shareable:?}");
    r.free(p, 0);
    r.finish();
}

#[test]
fn a_block_the_driver_will_not_free_does_not_stop_trimming_or_the_oom_retry() {
    let r = pool_rig(256 * MIB);
    let stuck = r.malloc(100 * MIB, 0, 0); // over the cache budget: freed at once
    r.sim.inject_fault(SimFault::Free, 2);
    r.alloc.free(stuck, 0).unwrap_err(); // refused; kept for a retry
    let small = r.malloc(10 * MIB, 0, 0);
    r.free(small, 0); // cached
    let e = r.alloc.empty_cache().unwrap_err().to_string(); // one of the two is refused
    assert!(e.contains("cuMemFreeAsync"), "{e}");
    let st = r.stats(0);
    assert_eq!(
        st.cached_bytes, 0,
        "the cache went back despite the refusal"
    );
    assert!(
        [10 * MIB, 100 * MIB].contains(&st.pool_used_bytes),
        "{st:?}"
    );
    assert_eq!(
        st.reserved_bytes, st.pool_used_bytes,
        "trimmed to the block still held"
    );
    // Out of memory: the flush before the retry is refused again (logged), the retry still runs.
    r.sim.inject_fault(SimFault::Free, 1);
    let e = r.alloc.malloc(250 * MIB, 0, s(0)).unwrap_err().to_string();
    assert!(e.starts_with("CUDA out of memory."), "{e}");
    assert_eq!(r.stats(0).num_alloc_retries, 1);
    r.alloc.empty_cache().unwrap(); // the driver takes it back at last
    assert_eq!(r.stats(0).reserved_bytes, 0);
    r.finish();
}

#[test]
fn cache_gives_blocks_back_before_the_pool_grows() {
    let r = pool_rig(1 << 30);
    let a = r.malloc(8 * MIB, 0, 1);
    r.free(a, 0);
    assert_eq!(r.stats(0).cached_bytes, 8 * MIB);
    // a different size on the same stream: the pool reuses the cached block's memory
    let b = r.malloc(6 * MIB, 0, 1);
    let st = r.stats(0);
    assert_eq!(st.cached_bytes, 0);
    assert_eq!(st.reserved_bytes, 8 * MIB, "pool did not grow");
    r.free(b, 0);
    r.finish();
}

#[test]
fn before_the_pool_grows_it_releases_memory_it_no_longer_uses() {
    let grow_after_8_mib_freed = |trim_on_growth: bool| {
        let config = Config {
            trim_on_growth,
            ..common::pool_config()
        };
        let r = rig_with(2, 1 << 30, config);
        let a = r.malloc(8 * MIB, 0, 1);
        r.free(a, 0); // cached
        let b = r.malloc(20 * MIB, 0, 1); // does not fit in the 8 MiB
        let reserved = r.stats(0).reserved_bytes;
        r.free(b, 0);
        r.finish();
        reserved
    };
    assert_eq!(
        grow_after_8_mib_freed(false),
        28 * MIB,
        "kept 8 MiB beside 20"
    );
    assert_eq!(
        grow_after_8_mib_freed(true),
        20 * MIB,
        "released the 8 MiB first"
    );
}

#[test]
fn a_miss_waits_for_its_stream_only_when_returned_blocks_cannot_make_room() {
    let r = pool_rig(1 << 30);
    let a = r.malloc(8 * MIB, 0, 5);
    let b = r.malloc(8 * MIB, 0, 5);
    r.free(a, 0);
    r.free(b, 0);
    let st = r.stats(0);
    assert_eq!(st.cached_bytes, 16 * MIB);
    assert_eq!(
        st.num_growth_syncs, 2,
        "each growth of the empty pool waited"
    );
    // The pool is full of cached blocks of this stream: returning them makes room, no wait.
    let c = r.malloc(10 * MIB, 0, 5);
    let st = r.stats(0);
    assert_eq!((st.cached_bytes, st.num_growth_syncs), (0, 2));
    // Nothing cached to return and no room: the stream is waited for before the pool grows.
    let d = r.malloc(64 * MIB, 0, 5);
    assert_eq!(r.stats(0).num_growth_syncs, 3);
    // Without STREAMPOOL_TRIM_ON_GROWTH it never waits.
    let quiet = rig_with(
        1,
        1 << 30,
        Config {
            trim_on_growth: false,
            ..common::pool_config()
        },
    );
    let e = quiet.malloc(64 * MIB, 0, 5);
    assert_eq!(quiet.stats(0).num_growth_syncs, 0);
    quiet.free(e, 0);
    quiet.finish();
    for p in [c, d] {
        r.free(p, 0);
    }
    r.finish();
}

fn small_pool_config() -> Config {
    Config {
        small_pool_max: SizeSpec::Bytes(MIB),
        ..common::pool_config()
    }
}

#[test]
fn small_blocks_come_from_their_own_pool_and_its_growth_keeps_large_blocks_cached() {
    let r = rig_with(2, 1 << 30, small_pool_config());
    let large = r.malloc(8 * MIB, 0, 0);
    let tiny = r.malloc(MIB, 0, 0);
    let [main, small] = [0, 1].map(|i| r.own_pools(0)[i].handle);
    let usage = |pool| r.sim.pool_usage(0, pool).unwrap();
    assert_eq!(usage(main).used_bytes, 8 * MIB);
    assert_eq!(usage(small).used_bytes, MIB);
    let st = r.stats(0);
    let sum = |f: fn(&PoolUsage) -> u64| f(&usage(main)) + f(&usage(small));
    assert_eq!(
        st.reserved_bytes,
        sum(|u| u.reserved_bytes),
        "both pools count"
    );
    assert_eq!(st.pool_used_bytes, 9 * MIB);
    // A cached large block stays cached while the small pool grows: it cannot help it.
    r.free(large, 0);
    let smalls: Vec<DevicePtr> = (0..64).map(|_| r.malloc(MIB - 512, 0, 0)).collect();
    assert!(usage(small).reserved_bytes >= 65 * MIB);
    assert_eq!(r.stats(0).cached_bytes, 8 * MIB);
    // The large block's pool still reuses it for a large request.
    assert_eq!(r.malloc(8 * MIB, 0, 0), large);
    for p in smalls.into_iter().chain([tiny, large]) {
        r.free(p, 0);
    }
    r.finish();
}

#[test]
fn small_pool_follows_peer_access_and_is_off_when_disabled_or_for_a_capped_or_shareable_pool() {
    let r = rig_with(2, 1 << 30, small_pool_config());
    let a = r.malloc(4096, 0, 0);
    let b = r.malloc(4096, 1, 0);
    for (device, peer) in [(0, 1), (1, 0)] {
        let pools = r.own_pools(device);
        assert_eq!(
            pools.len(),
            2,
            "device {device}: main and small-block pools"
        );
        for pool in pools {
            assert_eq!(pool.peers, [peer], "device {device}'s pool {pool:?}");
        }
    }
    r.free(a, 0);
    r.free(b, 1);
    r.finish();
    for config in [
        Config {
            small_pool_max: SizeSpec::Bytes(0),
            ..common::pool_config()
        },
        Config {
            max_pool_size: SizeSpec::Bytes(512 * MIB),
            ..small_pool_config()
        },
        Config {
            ipc: true,
            ..small_pool_config()
        },
    ] {
        let ipc = config.ipc;
        let r = rig_with(1, 1 << 30, config);
        let p = r.malloc(4096, 0, 0);
        let pools = r.live_pools(0);
        assert_eq!(pools.len(), 1, "one pool only: {pools:?}");
        assert_eq!(pools[0].shareable, ipc, "{pools:?}");
        assert_eq!(
            r.sim.pool_usage(0, pools[0].handle).unwrap().used_bytes,
            4096
        );
        r.free(p, 0);
        r.finish();
    }
}

/// The mirror of the test above: a growth of the main pool gives back its own cached blocks, not
/// the small-block pool's (1 MiB, the largest small block, included).
#[test]
fn the_main_pool_s_growth_keeps_small_blocks_cached() {
    let r = rig_with(1, 1 << 30, small_pool_config());
    let small = r.malloc(MIB, 0, 0);
    r.free(small, 0);
    let large = r.malloc(8 * MIB, 0, 0);
    assert_eq!(r.stats(0).cached_bytes, MIB);
    assert_eq!(r.malloc(MIB, 0, 0), small, "still cached");
    r.free(small, 0);
    r.free(large, 0);
    r.finish();
}

#[test]
fn trim_returns_the_cache_and_keeps_the_bytes_asked_for() {
    let r = pool_rig(1 << 30);
    let a = r.malloc(40 * MIB, 0, 1);
    r.free(a, 0);
    assert_eq!(r.stats(0).cached_bytes, 40 * MIB);
    r.device(0).trim(16 * MIB).unwrap();
    let st = r.stats(0);
    assert_eq!((st.cached_bytes, st.reserved_bytes), (0, 16 * MIB));
    r.device(0).trim(0).unwrap();
    assert_eq!(r.stats(0).reserved_bytes, 0);
    assert!(
        r.alloc.device(2).and_then(|dev| dev.trim(0)).is_err(),
        "no device 2"
    );
    r.finish();
}

#[test]
fn the_release_threshold_is_set_on_every_pool_of_the_device() {
    let r = pool_rig(1 << 30);
    r.device(1).set_release_threshold(8 * MIB).unwrap();
    let pools = r.own_pools(1);
    assert_eq!(pools.len(), 2, "main and small-block pools: {pools:?}");
    for pool in pools {
        assert_eq!(pool.release_threshold_bytes, 8 * MIB, "{pool:?}");
    }
    assert!(
        r.alloc
            .device(2)
            .and_then(|dev| dev.set_release_threshold(0))
            .is_err(),
        "no device 2"
    );
    r.finish();
}

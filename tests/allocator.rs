//! Behaviour of the allocator through the simulated driver: reuse rules, record_stream, graph
//! capture, OOM recovery, memory limits, bad input.

mod common;
use common::*;
use streampool::driver::sim::SimFault;
use streampool::driver::Driver;
use streampool::{Config, Error};

#[test]
fn live_pointers_are_distinct_and_do_not_overlap() {
    let r = rig(1 << 30);
    let sizes = [1u64, 511, 512, 513, 4096, 1 << 20, 3 << 20, 77];
    let mut live: Vec<(u64, u64)> = Vec::new();
    for round in 0..4 {
        for (i, &s) in sizes.iter().enumerate() {
            let stream = i % 3;
            let p = r.alloc.malloc(s + round, 0, stream).unwrap();
            for &(q, qs) in &live {
                assert!(
                    p + s + round <= q || q + qs <= p,
                    "{p:#x}+{s} overlaps {q:#x}+{qs}"
                );
            }
            live.push((p, s + round));
        }
        // free every other block so later rounds reuse memory
        let mut keep = Vec::new();
        for (i, (p, s)) in live.drain(..).enumerate() {
            if i % 2 == 0 {
                r.alloc.free(p, 0).unwrap();
            } else {
                keep.push((p, s));
            }
        }
        live = keep;
    }
    for (p, _) in live {
        r.alloc.free(p, 0).unwrap();
    }
    r.finish();
}

#[test]
fn same_stream_reuses_from_cache_without_a_driver_call() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(1000, 0, 7).unwrap();
    r.alloc.free(a, 0).unwrap();
    let before = r.stats(0);
    let b = r.alloc.malloc(1000, 0, 7).unwrap();
    let after = r.stats(0);
    assert_eq!(a, b);
    assert_eq!(after.num_cache_hits, before.num_cache_hits + 1);
    assert_eq!(after.num_device_allocs, before.num_device_allocs);
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn another_stream_does_not_get_a_cached_block() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(4096, 0, 1).unwrap();
    r.alloc.free(a, 0).unwrap();
    let b = r.alloc.malloc(4096, 0, 2).unwrap();
    assert_ne!(
        a, b,
        "stream 2 must not reuse stream 1's block without synchronisation"
    );
    assert_eq!(r.stats(0).num_cache_hits, 0);
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn record_stream_delays_reuse_until_the_other_stream_is_done() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(8192, 0, 1).unwrap();
    r.alloc.record_stream(a, 2).unwrap();
    r.alloc.free(a, 0).unwrap();
    let s = r.stats(0);
    assert_eq!(s.allocated_bytes, 0);
    assert_eq!(
        s.active_bytes, 8192,
        "still active while stream 2 may use it"
    );
    let b = r.alloc.malloc(8192, 0, 1).unwrap();
    assert_ne!(a, b, "reused before stream 2 finished");
    r.sim.complete_stream(0, 2);
    r.alloc.free(b, 0).unwrap();
    let c = r.alloc.malloc(8192, 0, 1).unwrap();
    let d = r.alloc.malloc(8192, 0, 1).unwrap();
    assert!(
        [c, d].contains(&a),
        "after the event completed the block is reusable"
    );
    assert_eq!(r.stats(0).active_bytes, 2 * 8192);
    r.alloc.free(c, 0).unwrap();
    r.alloc.free(d, 0).unwrap();
    r.finish();
}

#[test]
fn record_stream_of_unknown_pointer_is_an_error() {
    let r = rig(1 << 30);
    assert!(matches!(
        r.alloc.record_stream(0xdead_0000, 2),
        Err(Error::UnknownPointer { .. })
    ));
    r.finish();
}

#[test]
fn captured_allocations_bypass_the_cache() {
    let r = rig(1 << 30);
    // a block cached on stream 5 before capture
    let warm = r.alloc.malloc(4096, 0, 5).unwrap();
    r.alloc.free(warm, 0).unwrap();
    r.sim.begin_capture(0, 5);
    let g = r.alloc.malloc(4096, 0, 5).unwrap();
    assert_ne!(
        g, warm,
        "a graph must not get memory a later eager tensor can be given"
    );
    r.alloc.free(g, 0).unwrap();
    let g2 = r.alloc.malloc(4096, 0, 5).unwrap();
    assert_ne!(g2, warm);
    r.alloc.free(g2, 0).unwrap();
    r.sim.end_capture(0, 5);
    let eager = r.alloc.malloc(4096, 0, 5).unwrap();
    assert_eq!(
        eager, warm,
        "after capture, the cache serves eager tensors again"
    );
    assert_eq!(r.stats(0).cached_bytes, 0);
    r.alloc.free(eager, 0).unwrap();
    r.finish();
}

#[test]
fn record_stream_during_capture_is_deferred_until_capture_ends() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(4096, 0, 1).unwrap();
    r.alloc.record_stream(a, 2).unwrap();
    r.sim.begin_capture(0, 9);
    let g = r.alloc.malloc(512, 0, 9).unwrap(); // the allocator learns that a capture is underway
    r.alloc.free(a, 0).unwrap();
    r.alloc.free(g, 0).unwrap();
    r.sim.end_capture(0, 9);
    r.sim.complete_all();
    let b = r.alloc.malloc(4096, 0, 1).unwrap(); // capture ended: events recorded now, not complete
    assert_ne!(a, b);
    r.sim.complete_all();
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn cache_gives_blocks_back_before_the_pool_grows() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(8 * MIB, 0, 1).unwrap();
    r.alloc.free(a, 0).unwrap();
    assert_eq!(r.stats(0).cached_bytes, 8 * MIB);
    // a different size on the same stream: the pool reuses the cached block's memory
    let b = r.alloc.malloc(6 * MIB, 0, 1).unwrap();
    let s = r.stats(0);
    assert_eq!(s.cached_bytes, 0);
    assert_eq!(s.reserved_bytes, 8 * MIB, "pool did not grow");
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn out_of_memory_flushes_synchronises_trims_and_retries() {
    let r = rig(64 * MIB);
    // stream 1 frees 48 MiB into the cache; for stream 2 the cache hands it to the pool, which
    // can't reuse it before stream 1 reaches the free: growth fails, a synchronisation fixes it
    let a = r.alloc.malloc(48 * MIB, 0, 1).unwrap();
    r.alloc.free(a, 0).unwrap();
    let b = r.alloc.malloc(40 * MIB, 0, 2).unwrap();
    let s = r.stats(0);
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_ooms, 0);
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn out_of_memory_reports_like_pytorch_and_changes_nothing() {
    let r = rig(64 * MIB);
    let keep = r.alloc.malloc(MIB, 0, 0).unwrap();
    let before = r.stats(0);
    let err = r.alloc.malloc(10 << 40, 0, 0).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("CUDA out of memory."), "{msg}");
    assert!(
        msg.contains("Tried to allocate 10.00 TiB") && msg.contains("GPU 0"),
        "{msg}"
    );
    let after = r.stats(0);
    assert_eq!(after.num_ooms, before.num_ooms + 1);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.allocations_current, 1);
    // still usable
    let p = r.alloc.malloc(MIB, 0, 0).unwrap();
    r.alloc.free(p, 0).unwrap();
    r.alloc.free(keep, 0).unwrap();
    r.finish();
}

#[test]
fn memory_fraction_is_a_hard_cap() {
    let r = rig(100 * MIB);
    r.alloc.device(0).unwrap().set_memory_fraction(0.5).unwrap();
    let a = r.alloc.malloc(40 * MIB, 0, 0).unwrap();
    let err = r.alloc.malloc(20 * MIB, 0, 0).unwrap_err().to_string();
    assert!(
        err.starts_with("CUDA out of memory.") && err.contains("set_per_process_memory_fraction"),
        "{err}"
    );
    r.alloc.free(a, 0).unwrap();
    // the cached 40 MiB block goes back to the pool to make room under the cap
    let b = r.alloc.malloc(45 * MIB, 0, 0).unwrap();
    r.alloc.free(b, 0).unwrap();
    assert!(r.alloc.device(0).unwrap().set_memory_fraction(1.5).is_err());
    assert_eq!(r.stats(0).memory_limit_bytes, 50 * MIB);
    r.finish();
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let r = rig(1 << 30);
    let p = r.alloc.malloc(4096, 0, 0).unwrap();
    let before = r.stats(0);
    let check = |e: Error, want: &str| assert!(e.to_string().contains(want), "{e} lacks {want:?}");
    check(r.alloc.malloc(0, 0, 0).unwrap_err(), "positive");
    check(
        r.alloc.malloc(64, -1, 0).unwrap_err(),
        "device index -1 is out of range",
    );
    check(
        r.alloc.malloc(64, 2, 0).unwrap_err(),
        "device index 2 is out of range",
    );
    check(
        r.alloc.free(0x1234, 0).unwrap_err(),
        "unknown pointer 0x1234",
    );
    check(r.alloc.free(p + 512, 0).unwrap_err(), "unknown pointer"); // interior
    check(r.alloc.free(p, 1).unwrap_err(), "unknown pointer"); // wrong device
    assert_eq!(r.stats(0), before);
    r.alloc.free(p, 0).unwrap();
    let after_free = r.stats(0);
    check(r.alloc.free(p, 0).unwrap_err(), "already freed"); // double free
    assert_eq!(r.stats(0), after_free);
    r.finish();
}

#[test]
fn driver_faults_are_reported_and_the_allocator_stays_usable() {
    let r = rig(1 << 30);
    r.sim.inject_fault(SimFault::PoolCreate, 1);
    let e = r.alloc.malloc(64, 0, 0).unwrap_err().to_string();
    assert!(e.contains("cuMemPoolCreate"), "{e}");
    let p = r.alloc.malloc(64, 0, 0).unwrap(); // pool creation is retried on the next call
    r.sim.inject_fault(SimFault::Alloc, 1);
    let e = r.alloc.malloc(1 << 20, 0, 0).unwrap_err().to_string();
    assert!(e.contains("cuMemAllocFromPoolAsync"), "{e}");
    r.alloc.record_stream(p, 3).unwrap();
    r.sim.inject_fault(SimFault::EventCreate, 1);
    r.alloc.free(p, 0).unwrap(); // falls back to synchronising
    let q = r.alloc.malloc(64, 0, 0).unwrap();
    r.alloc.free(q, 0).unwrap();
    assert_eq!(r.stats(0).allocated_bytes, 0);
    r.finish();
}

#[test]
fn stats_count_pool_and_cache() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(1000, 1, 0).unwrap();
    let b = r.alloc.malloc(3 * MIB, 1, 0).unwrap();
    let s = r.stats(1);
    assert_eq!(
        (
            s.allocated_bytes,
            s.allocations_current,
            s.num_device_allocs
        ),
        (1000 + 3 * MIB, 2, 2)
    );
    assert_eq!(
        s.reserved_bytes,
        2 * MIB + 4 * MIB,
        "2 MiB granules, in the small pool and the main pool"
    );
    r.alloc.free(a, 1).unwrap();
    r.alloc.free(b, 1).unwrap();
    let s = r.stats(1);
    assert_eq!(
        (s.allocated_bytes, s.allocated_bytes_peak, s.cached_bytes),
        (0, 1000 + 3 * MIB, 1024 + 3 * MIB)
    );
    assert_eq!(
        (s.num_allocs, s.num_frees, s.freed_bytes_total),
        (2, 2, 1000 + 3 * MIB)
    );
    r.alloc.device(1).unwrap().reset_peak_stats().unwrap();
    assert_eq!(r.stats(1).allocated_bytes_peak, 0);
    r.alloc.empty_cache().unwrap();
    let s = r.stats(1);
    assert_eq!(
        (s.cached_bytes, s.reserved_bytes, s.num_device_frees),
        (0, 0, 2)
    );
    assert_eq!(
        r.stats(0),
        streampool::StreampoolStats {
            device_total_bytes: 1 << 30,
            ..Default::default()
        }
    );
    r.finish();
}

#[test]
fn failed_event_after_capture_keeps_the_block_until_it_is_safe() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(4096, 0, 1).unwrap();
    r.alloc.record_stream(a, 2).unwrap();
    r.sim.begin_capture(0, 9);
    let g = r.alloc.malloc(512, 0, 9).unwrap();
    r.alloc.free(a, 0).unwrap(); // deferred: no events during capture
    r.alloc.free(g, 0).unwrap();
    r.sim.end_capture(0, 9);
    let probe = r.sim.event_create(0).unwrap();
    r.sim.event_record(0, probe, 2).unwrap(); // work stream 2 still has queued
    r.sim.inject_fault(SimFault::EventCreate, 1);
    let b = r.alloc.malloc(4096, 0, 1).unwrap();
    assert_ne!(
        b, a,
        "no event on stream 2: the block must not be reused yet"
    );
    assert!(
        !r.sim.event_query(0, probe).unwrap(),
        "the allocation did not wait for the device (it holds the device lock)"
    );
    assert_eq!(r.stats(0).active_bytes, 4096 + 4096, "a is still active");
    r.alloc.empty_cache().unwrap(); // synchronises: now a is done with and goes back
    assert!(r.sim.event_query(0, probe).unwrap());
    assert_eq!(r.stats(0).active_bytes, 4096);
    r.sim.event_destroy(0, probe);
    r.alloc.free(b, 0).unwrap();
    r.finish();
}

#[test]
fn a_block_the_driver_will_not_free_does_not_stop_trimming_or_the_oom_retry() {
    let r = rig(256 * MIB);
    let stuck = r.alloc.malloc(100 * MIB, 0, 0).unwrap(); // over the cache budget: freed at once
    r.sim.inject_fault(SimFault::Free, 2);
    r.alloc.free(stuck, 0).unwrap_err(); // refused; kept for a retry
    let small = r.alloc.malloc(10 * MIB, 0, 0).unwrap();
    r.alloc.free(small, 0).unwrap(); // cached
    let e = r.alloc.empty_cache().unwrap_err().to_string(); // one of the two is refused
    assert!(e.contains("cuMemFreeAsync"), "{e}");
    let s = r.stats(0);
    assert_eq!(s.cached_bytes, 0, "the cache went back despite the refusal");
    assert!([10 * MIB, 100 * MIB].contains(&s.pool_used_bytes), "{s:?}");
    assert_eq!(
        s.reserved_bytes, s.pool_used_bytes,
        "trimmed to the block still held"
    );
    // Out of memory: the flush before the retry is refused again (logged), the retry still runs.
    r.sim.inject_fault(SimFault::Free, 1);
    let e = r.alloc.malloc(250 * MIB, 0, 0).unwrap_err().to_string();
    assert!(e.starts_with("CUDA out of memory."), "{e}");
    assert_eq!(r.stats(0).num_alloc_retries, 1);
    r.alloc.empty_cache().unwrap(); // the driver takes it back at last
    assert_eq!(r.stats(0).reserved_bytes, 0);
    r.finish();
}

#[test]
fn before_the_pool_grows_it_releases_memory_it_no_longer_uses() {
    let grow_after_8_mib_freed = |trim_on_growth: bool| {
        let config = Config {
            trim_on_growth,
            ..Config::default()
        };
        let r = rig_with(2, 1 << 30, config);
        let a = r.alloc.malloc(8 * MIB, 0, 1).unwrap();
        r.alloc.free(a, 0).unwrap(); // cached
        let b = r.alloc.malloc(20 * MIB, 0, 1).unwrap(); // does not fit in the 8 MiB
        let reserved = r.stats(0).reserved_bytes;
        r.alloc.free(b, 0).unwrap();
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

fn small_pool_config() -> Config {
    Config {
        small_pool_max: streampool::units::SizeSpec::Bytes(MIB),
        ..Config::default()
    }
}

#[test]
fn small_blocks_come_from_their_own_pool_and_its_growth_keeps_large_blocks_cached() {
    use streampool::driver::PoolHandle;
    let r = rig_with(2, 1 << 30, small_pool_config());
    let (main, small) = (PoolHandle(0), PoolHandle(1));
    let large = r.alloc.malloc(8 * MIB, 0, 0).unwrap();
    let tiny = r.alloc.malloc(MIB, 0, 0).unwrap();
    assert_eq!(r.sim.pool_usage(0, main).unwrap().used_bytes, 8 * MIB);
    assert_eq!(r.sim.pool_usage(0, small).unwrap().used_bytes, MIB);
    let s = r.stats(0);
    let sum = |f: fn(&streampool::driver::PoolUsage) -> u64| {
        f(&r.sim.pool_usage(0, main).unwrap()) + f(&r.sim.pool_usage(0, small).unwrap())
    };
    assert_eq!(
        s.reserved_bytes,
        sum(|u| u.reserved_bytes),
        "both pools count"
    );
    assert_eq!(s.pool_used_bytes, 9 * MIB);
    // A cached large block stays cached while the small pool grows: it cannot help it.
    r.alloc.free(large, 0).unwrap();
    let smalls: Vec<u64> = (0..64)
        .map(|_| r.alloc.malloc(MIB - 512, 0, 0).unwrap())
        .collect();
    assert!(r.sim.pool_usage(0, small).unwrap().reserved_bytes >= 65 * MIB);
    assert_eq!(r.stats(0).cached_bytes, 8 * MIB);
    // The large block's pool still reuses it for a large request.
    assert_eq!(r.alloc.malloc(8 * MIB, 0, 0).unwrap(), large);
    for p in smalls.into_iter().chain([tiny, large]) {
        r.alloc.free(p, 0).unwrap();
    }
    r.finish();
}

#[test]
fn small_pool_follows_peer_access_and_is_off_for_a_capped_or_shareable_pool() {
    use streampool::driver::PoolHandle;
    let r = rig_with(2, 1 << 30, small_pool_config());
    let a = r.alloc.malloc(4096, 0, 0).unwrap();
    let b = r.alloc.malloc(4096, 1, 0).unwrap();
    for pool in [PoolHandle(0), PoolHandle(1)] {
        assert_eq!(
            r.sim.pool_peers(0, pool),
            vec![1],
            "device 0's pool {pool:?}"
        );
        assert_eq!(
            r.sim.pool_peers(1, pool),
            vec![0],
            "device 1's pool {pool:?}"
        );
    }
    r.alloc.free(a, 0).unwrap();
    r.alloc.free(b, 1).unwrap();
    r.finish();
    for config in [
        Config {
            max_pool_size: streampool::units::SizeSpec::Bytes(512 * MIB),
            ..small_pool_config()
        },
        Config {
            ipc: true,
            ..small_pool_config()
        },
    ] {
        let r = rig_with(1, 1 << 30, config);
        let p = r.alloc.malloc(4096, 0, 0).unwrap();
        assert_eq!(r.sim.pool_usage(0, PoolHandle(0)).unwrap().used_bytes, 4096);
        assert_eq!(r.sim.pool_count(0), 1, "one pool only");
        r.alloc.free(p, 0).unwrap();
        r.finish();
    }
}

#[test]
fn a_miss_waits_for_its_stream_only_when_returned_blocks_cannot_make_room() {
    let r = rig(1 << 30);
    let a = r.alloc.malloc(8 * MIB, 0, 5).unwrap();
    let b = r.alloc.malloc(8 * MIB, 0, 5).unwrap();
    r.alloc.free(a, 0).unwrap();
    r.alloc.free(b, 0).unwrap();
    let s = r.stats(0);
    assert_eq!(s.cached_bytes, 16 * MIB);
    assert_eq!(
        s.num_growth_syncs, 2,
        "each growth of the empty pool waited"
    );
    // The pool is full of cached blocks of this stream: returning them makes room, no wait.
    let c = r.alloc.malloc(10 * MIB, 0, 5).unwrap();
    let s = r.stats(0);
    assert_eq!((s.cached_bytes, s.num_growth_syncs), (0, 2));
    // Nothing cached to return and no room: the stream is waited for before the pool grows.
    let d = r.alloc.malloc(64 * MIB, 0, 5).unwrap();
    assert_eq!(r.stats(0).num_growth_syncs, 3);
    // Without STREAMPOOL_TRIM_ON_GROWTH it never waits.
    let quiet = rig_with(
        1,
        1 << 30,
        Config {
            trim_on_growth: false,
            ..Config::default()
        },
    );
    let e = quiet.alloc.malloc(64 * MIB, 0, 5).unwrap();
    assert_eq!(quiet.stats(0).num_growth_syncs, 0);
    quiet.alloc.free(e, 0).unwrap();
    quiet.finish();
    for p in [c, d] {
        r.alloc.free(p, 0).unwrap();
    }
    r.finish();
}

//! Behaviour of the allocator through the simulated driver: reuse rules, record_stream and graph
//! capture. Limits and out of memory are in tests/limits.rs, the pools and driver faults in
//! tests/pools.rs.

mod common;
use common::*;
use streampool::driver::sim::SimFault;
use streampool::driver::{DevicePtr, StreamDriver};
use streampool::Error;

#[test]
fn live_pointers_are_distinct_and_do_not_overlap() {
    let r = rig(1 << 30);
    let sizes = [1u64, 511, 512, 513, 4096, 1 << 20, 3 << 20, 77];
    let mut live: Vec<(DevicePtr, u64)> = Vec::new();
    for round in 0..4 {
        for (i, &bytes) in sizes.iter().enumerate() {
            let bytes = bytes + round;
            let p = r.malloc(bytes, 0, i % 3);
            for &(q, q_bytes) in &live {
                assert!(
                    !overlaps(p, bytes, q, q_bytes),
                    "{p:#x}+{bytes} overlaps {q:#x}+{q_bytes}"
                );
            }
            live.push((p, bytes));
        }
        // free every other block so later rounds reuse memory
        let mut keep = Vec::new();
        for (i, (p, bytes)) in live.drain(..).enumerate() {
            if i % 2 == 0 {
                r.free(p, 0);
            } else {
                keep.push((p, bytes));
            }
        }
        live = keep;
    }
    for (p, _) in live {
        r.free(p, 0);
    }
    r.finish();
}

#[test]
fn same_stream_reuses_from_cache_without_a_driver_call() {
    let r = rig(1 << 30);
    let a = r.malloc(1000, 0, 7);
    r.free(a, 0);
    let before = r.stats(0);
    let b = r.malloc(1000, 0, 7);
    let after = r.stats(0);
    assert_eq!(a, b);
    assert_eq!(after.num_cache_hits, before.num_cache_hits + 1);
    assert_eq!(after.num_device_allocs, before.num_device_allocs);
    r.free(b, 0);
    r.finish();
}

#[test]
fn another_stream_does_not_get_a_cached_block() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.free(a, 0);
    let b = r.malloc(4096, 0, 2);
    assert_ne!(
        a, b,
        "stream 2 must not reuse stream 1's block without synchronisation"
    );
    assert_eq!(r.stats(0).num_cache_hits, 0);
    r.free(b, 0);
    r.finish();
}

#[test]
fn record_stream_delays_reuse_until_the_other_stream_is_done() {
    let r = rig(1 << 30);
    let a = r.malloc(8192, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.free(a, 0);
    let st = r.stats(0);
    assert_eq!(st.allocated_bytes, 0);
    assert_eq!(
        st.active_bytes, 8192,
        "still active while stream 2 may use it"
    );
    let b = r.malloc(8192, 0, 1);
    assert_ne!(a, b, "reused before stream 2 finished");
    r.sim.complete_stream(0, s(2));
    r.free(b, 0);
    let c = r.malloc(8192, 0, 1);
    let d = r.malloc(8192, 0, 1);
    assert!(
        [c, d].contains(&a),
        "after the event completed the block is reusable"
    );
    assert_eq!(r.stats(0).active_bytes, 2 * 8192);
    r.free(c, 0);
    r.free(d, 0);
    r.finish();
}

#[test]
fn record_stream_of_unknown_pointer_is_an_error() {
    let r = rig(1 << 30);
    assert!(matches!(
        r.alloc.record_stream(DevicePtr(0xdead_0000), s(2)),
        Err(Error::UnknownPointer { .. })
    ));
    r.finish();
}

#[test]
fn captured_allocations_bypass_the_cache() {
    let r = rig(1 << 30);
    // a block cached on stream 5 before capture
    let warm = r.malloc(4096, 0, 5);
    r.free(warm, 0);
    r.sim.begin_capture(0, s(5));
    let g = r.malloc(4096, 0, 5);
    assert_ne!(
        g, warm,
        "a graph must not get memory a later eager tensor can be given"
    );
    r.free(g, 0);
    let g2 = r.malloc(4096, 0, 5);
    assert_ne!(g2, warm);
    r.free(g2, 0);
    r.sim.end_capture(0, s(5));
    let eager = r.malloc(4096, 0, 5);
    assert_eq!(
        eager, warm,
        "after capture, the cache serves eager tensors again"
    );
    assert_eq!(r.stats(0).cached_bytes, 0);
    r.free(eager, 0);
    r.finish();
}

#[test]
fn record_stream_during_capture_is_deferred_until_capture_ends() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.sim.begin_capture(0, s(9));
    let g = r.malloc(512, 0, 9); // the allocator learns that a capture is underway
    r.free(a, 0);
    r.free(g, 0);
    r.sim.end_capture(0, s(9));
    r.sim.complete_all();
    let b = r.malloc(4096, 0, 1); // capture ended: events recorded now, not complete
    assert_ne!(a, b);
    r.sim.complete_all();
    r.free(b, 0);
    r.finish();
}

#[test]
fn failed_event_after_capture_keeps_the_block_until_it_is_safe() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.sim.begin_capture(0, s(9));
    let g = r.malloc(512, 0, 9);
    r.free(a, 0); // deferred: no events during capture
    r.free(g, 0);
    r.sim.end_capture(0, s(9));
    let probe = r.sim.event_create(0).unwrap();
    r.sim.event_record(0, probe, s(2)).unwrap(); // work stream 2 still has queued
    r.sim.inject_fault(SimFault::EventCreate, 1);
    let b = r.malloc(4096, 0, 1);
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
    r.free(b, 0);
    r.finish();
}

#[test]
fn stats_count_pool_and_cache() {
    let r = rig(1 << 30);
    let a = r.malloc(1000, 1, 0);
    let b = r.malloc(3 * MIB, 1, 0);
    let st = r.stats(1);
    assert_eq!(
        (
            st.allocated_bytes,
            st.allocations_current,
            st.num_device_allocs
        ),
        (1000 + 3 * MIB, 2, 2)
    );
    assert_eq!(
        st.reserved_bytes,
        2 * MIB + 4 * MIB,
        "2 MiB granules, in the small pool and the main pool"
    );
    r.free(a, 1);
    r.free(b, 1);
    let st = r.stats(1);
    assert_eq!(
        (st.allocated_bytes, st.allocated_bytes_peak, st.cached_bytes),
        (0, 1000 + 3 * MIB, 1024 + 3 * MIB)
    );
    assert_eq!(
        (st.num_allocs, st.num_frees, st.freed_bytes_total),
        (2, 2, 1000 + 3 * MIB)
    );
    r.alloc.reset_peak_stats(1).unwrap();
    assert_eq!(r.stats(1).allocated_bytes_peak, 0);
    r.alloc.empty_cache().unwrap();
    let st = r.stats(1);
    assert_eq!(
        (st.cached_bytes, st.reserved_bytes, st.num_device_frees),
        (0, 0, 2)
    );
    assert_eq!(
        r.stats(0),
        streampool::StreampoolStats {
            device_total_bytes: 1 << 30,
            memory_limit_bytes: u64::MAX,
            ..Default::default()
        },
        "an unused device: nothing counted, no limit"
    );
    r.finish();
}

//! Behaviour of the allocator through the simulated driver: reuse rules, record_stream and graph
//! capture. Limits and out of memory are in tests/limits.rs, the pools and driver faults in
//! tests/pools.rs.

mod common;
use common::*;
use streampool::driver::sim::SimFault;
use streampool::driver::{DevicePtr, StreamDriver};
use streampool::history::StreampoolBlockState;
use streampool::Error;

/// True if `ptr` is a freed block of device 0 that waits for the streams that used it.
fn waiting(r: &Rig, ptr: DevicePtr) -> bool {
    r.device(0)
        .blocks()
        .iter()
        .any(|b| b.address == ptr.0 && b.state == StreampoolBlockState::WaitingForStreams as u32)
}

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

/// On the pool backend (the vmm backend caches nothing: it reuses a stream's frees itself).
#[test]
fn same_stream_reuses_from_cache_without_a_driver_call() {
    let r = pool_rig(1 << 30);
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

/// On the pool backend (the vmm backend hands a block freed on one stream to another after a
/// GPU-side wait for the free: src/resource/vmm/tests).
#[test]
fn another_stream_does_not_get_a_cached_block() {
    let r = pool_rig(1 << 30);
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

/// At the program's synchronisation (`streampool_synchronized`, which torch.cuda.synchronize()
/// calls under install()) a block waiting for another stream goes back to its source: every
/// stream's work queued before it is done.
#[test]
fn a_synchronisation_ends_the_wait_of_a_block_another_stream_used() {
    let r = rig(1 << 30);
    let a = r.malloc(8192, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.free(a, 0);
    assert_eq!(r.stats(0).active_bytes, 8192, "waiting for stream 2");
    r.sim.complete_all(); // torch.cuda.synchronize(), then its hook
    r.alloc.device(0).unwrap().synchronized().unwrap();
    assert_eq!(r.stats(0).active_bytes, 0, "back at the synchronisation");
    r.finish();
}

/// A block that three other streams used (two of them twice) waits for each: whichever finishes
/// last, the block is not reused before it does (a record names the first stream, the ledger
/// lists them all once a second one comes).
#[test]
fn record_stream_on_several_streams_delays_reuse_until_each_is_done() {
    let r = rig(1 << 30);
    for last in [2, 3, 4] {
        let a = r.malloc(8192, 0, 1);
        for stream in [2, 2, 3, 4, 3] {
            r.alloc.record_stream(a, s(stream)).unwrap();
        }
        r.free(a, 0);
        for stream in [2, 3, 4].into_iter().filter(|&t| t != last) {
            r.sim.complete_stream(0, s(stream));
        }
        let b = r.malloc(8192, 0, 1);
        assert_ne!(a, b, "reused while stream {last} may still use it");
        assert_eq!(r.stats(0).active_bytes, 2 * 8192, "it still waits");
        r.sim.complete_stream(0, s(last));
        let c = r.malloc(8192, 0, 1);
        assert_eq!(a, c, "reusable once stream {last} is done too");
        r.free(b, 0);
        r.free(c, 0);
        r.sim.complete_all();
        r.alloc.empty_cache().unwrap();
    }
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
    let r = rig_with(2, 1 << 30, common::pool_config());
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
    r.device(1).reset_peak_stats().unwrap();
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

#[test]
fn the_allocator_reports_its_driver_its_devices_and_what_each_supports() {
    let r = rig_with(3, 64 * MIB, common::base_config());
    assert_eq!(r.alloc.driver_name(), "sim");
    assert_eq!(r.alloc.device_count(), 3);
    r.sim.set_vmm_unsupported(1);
    assert!(r.device(0).pools_supported().unwrap());
    assert!(r.device(0).vmm_supported().unwrap());
    assert!(!r.device(1).vmm_supported().unwrap(), "device 1 has no VMM");
    for bad in [-1, 3] {
        assert!(
            r.alloc
                .device(bad)
                .and_then(|dev| dev.pools_supported())
                .is_err(),
            "device {bad}"
        );
        assert!(
            r.alloc
                .device(bad)
                .and_then(|dev| dev.vmm_supported())
                .is_err(),
            "device {bad}"
        );
    }
    r.finish();
}

#[test]
fn reset_peak_stats_resets_the_pools_high_water_marks_too() {
    let r = rig(1 << 30);
    let a = r.malloc(40 * MIB, 0, 0);
    r.free(a, 0);
    r.alloc.empty_cache().unwrap();
    let st = r.stats(0);
    assert_eq!((st.reserved_bytes, st.reserved_bytes_peak), (0, 40 * MIB));
    r.device(0).reset_peak_stats().unwrap();
    assert_eq!(r.stats(0).reserved_bytes_peak, 0);
    r.finish();
}

/// On the pool backend (the vmm backend caches nothing).
#[test]
fn record_stream_on_the_block_s_own_stream_adds_no_wait() {
    let r = pool_rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(1)).unwrap();
    r.free(a, 0);
    let st = r.stats(0);
    assert_eq!(
        (st.cached_bytes, st.active_bytes),
        (4096, 0),
        "cached at once, like any block of stream 1"
    );
    assert_eq!(r.malloc(4096, 0, 1), a);
    r.free(a, 0);
    r.finish();
}

/// A block other streams used is free only after they are done: an `empty_cache` whose device
/// synchronisation failed knows nothing of them and must leave the block waiting.
#[test]
fn empty_cache_that_could_not_synchronise_keeps_blocks_waiting_for_other_streams() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.free(a, 0); // waits for an event on stream 2
    r.sim.inject_fault(SimFault::Synchronize, 1);
    let e = r.alloc.empty_cache().unwrap_err().to_string();
    assert!(e.contains("cuCtxSynchronize"), "{e}");
    assert!(
        waiting(&r, a),
        "{a:#x} left the waits without a synchronisation"
    );
    assert_eq!(r.stats(0).active_bytes, 4096);
    r.alloc.empty_cache().unwrap();
    assert_eq!(r.stats(0).active_bytes, 0);
    r.finish();
}

/// While a capture is known nothing is synchronised or queried: `empty_cache` leaves a block
/// that waits for another stream waiting, and no allocation takes it back (even once that
/// stream is done) until the capture has ended.
#[test]
fn during_a_known_capture_blocks_waiting_for_other_streams_stay_waiting() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.free(a, 0); // waits for an event on stream 2
    r.sim.begin_capture(0, s(9));
    let graph = r.malloc(512, 0, 9); // the allocator learns of the capture
    r.alloc.empty_cache().unwrap();
    assert!(
        waiting(&r, a),
        "empty_cache released {a:#x} during a capture"
    );
    r.sim.complete_stream(0, s(2));
    let b = r.malloc(4096, 0, 1);
    assert_ne!(b, a, "handed back during a capture");
    assert!(waiting(&r, a));
    r.free(graph, 0);
    r.sim.end_capture(0, s(9));
    let c = r.malloc(4096, 0, 1);
    assert_eq!(
        c, a,
        "the capture ended and stream 2 is done: back through the cache"
    );
    r.free(b, 0);
    r.free(c, 0);
    r.finish();
}

/// A block for which neither an event nor a synchronisation could be had waits, deferred; the
/// next allocation records its event, and once the stream is done it is reused without an
/// `empty_cache`.
#[test]
fn a_block_deferred_for_lack_of_an_event_gets_one_at_the_next_allocation() {
    let r = rig(1 << 30);
    let a = r.malloc(4096, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.sim.inject_fault(SimFault::EventCreate, 1);
    r.sim.inject_fault(SimFault::Synchronize, 1);
    assert!(r.alloc.free(a, 0).is_err(), "no event, no synchronisation");
    assert!(waiting(&r, a));
    let b = r.malloc(4096, 0, 1); // records the event on stream 2 now
    assert_ne!(b, a);
    r.sim.complete_stream(0, s(2));
    let c = r.malloc(4096, 0, 1);
    assert_eq!(c, a, "stream 2 is done: reused");
    r.free(b, 0);
    r.free(c, 0);
    r.finish();
}

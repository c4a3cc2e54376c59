//! Inputs found by the fuzz target `fuzz/fuzz_targets/allocator_ops.rs` (scripts/fuzz), minimised
//! and written out as plain tests; each failed before its fix (docs/reliability.md).

mod common;
use common::*;
use std::sync::Arc;
use streampool::driver::sim::{SimDriver, SimFault};
use streampool::driver::{Driver, StreamDriver};
use streampool::{Allocator, Config};

/// Fuzz input (minimised, 4 ops): malloc 5,049,568 B on stream 1, free it, malloc 5,050,093 B on
/// stream 1, malloc 2,952,588 B on stream 0 (all device 0).
///
/// The second malloc does not fit the cached block, so the cache hands it back to the pool
/// (`cuMemFreeAsync` on stream 1) and stream 1 allocates from the pool. The simulator's
/// `SimDevice::retire_own_stream` then releases *every* pending free of stream 1 into the
/// device's shared address space, not just for stream 1, so the third malloc, on stream 0, gets
/// the first block's memory while stream 1 has not completed the work it queued before the free.
/// A real stream-ordered pool makes another stream wait for the free (or its event) first; the
/// simulator lets stream 0 overwrite memory stream 1 may still be reading.
#[test]
fn memory_freed_on_one_stream_is_not_given_to_another_before_that_stream_completes() {
    // Without trim_on_growth, which would wait for stream 1 and so complete the free.
    let config = Config {
        trim_on_growth: false,
        ..common::base_config()
    };
    let r = rig_with(2, 64 * MIB, config);
    let a_bytes = 5_049_568;
    let a = r.malloc(a_bytes, 0, 1);
    r.free(a, 0);
    let b = r.malloc(5_050_093, 0, 1);
    let c_bytes = 2_952_588;
    let c = r.malloc(c_bytes, 0, 0);
    assert!(
        !overlaps(c, c_bytes, a, a_bytes),
        "stream 0 got {c:#x}+{c_bytes}, inside the block {a:#x}+{a_bytes} freed on stream 1, \
         before stream 1 completed"
    );
    r.free(b, 0);
    r.free(c, 0);
    r.finish();
}

/// Fuzz input (minimised, 5 ops): malloc 20,992 B on device 0, stream 0; inject
/// `SimFault::EventRecord` and `SimFault::Synchronize`; record_stream(ptr, 1); free(ptr).
///
/// `DeviceAllocator::free_after_streams` (then in src/device.rs; now `free` in src/device/mod.rs) cannot record the event for stream 1, so
/// it falls back to synchronising the device; when that fails too, `synced?` returns the error
/// before `keep_or_return`, and the block is in no list: not live, not cached, not pending, never
/// handed back to the pool. Its bytes stay allocated in the pool for the life of the process and
/// stay counted in the device's `held_bytes` (which `set_memory_fraction` enforces against). The
/// event whose record failed is also dropped without `event_destroy`.
#[test]
fn failed_event_record_and_failed_synchronize_do_not_leak_the_block() {
    let r = rig(64 * MIB);
    let p = r.malloc(20_992, 0, 0);
    r.sim.inject_fault(SimFault::EventRecord, 1);
    r.sim.inject_fault(SimFault::Synchronize, 1);
    r.alloc.record_stream(p, s(1)).unwrap();
    let e = r.alloc.free(p, 0).unwrap_err().to_string();
    assert!(e.contains("cuCtxSynchronize"), "{e}");
    // Nothing is live; once all work is done the block must be back in the pool.
    r.sim.complete_all();
    r.finish();
}

/// Found while fixing the one above: a block whose `cuMemFreeAsync` fails (the cache was full, so
/// the block went straight back to the pool) used to leave streampool's books and stay allocated
/// in the pool for good. It now stays held and the next `empty_cache` hands it back.
#[test]
fn a_block_the_driver_refuses_to_free_is_returned_by_the_next_empty_cache() {
    let r = rig_with(2, 256 * MIB, common::pool_config());
    let p = r.malloc(100 * MIB, 0, 0); // larger than the 64 MiB cache budget
    r.sim.inject_fault(SimFault::Free, 1);
    let e = r.alloc.free(p, 0).unwrap_err().to_string();
    assert!(e.contains("cuMemFreeAsync"), "{e}");
    let s = r.stats(0);
    assert_eq!(
        (s.allocated_bytes, s.num_frees),
        (0, 1),
        "the free itself counted"
    );
    assert_eq!(s.pool_used_bytes, 100 * MIB, "still held from the pool");
    r.finish();
}

/// Fuzz input (the vmm backend, one op): malloc 1 TiB on a 64 MiB device. The vmm resource
/// looked for a window of free addresses for it page by page, listing 512 Ki pages of every
/// candidate window (and would have reserved a 1 TiB address range) before finding out that the
/// device cannot hold it; the fuzzer ran out of its 2 GiB of memory. A request larger than the
/// device now fails as out of memory at once.
#[test]
fn the_vmm_backend_refuses_a_request_larger_than_the_device_at_once() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let started = std::time::Instant::now();
    for bytes in [1 << 40, streampool::MAX_ALLOCATION_BYTES] {
        let e = r.alloc.malloc(bytes, 0, s(1)).unwrap_err().to_string();
        assert!(e.starts_with("CUDA out of memory."), "{e}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    r.finish();
}

/// Fuzz input (the vmm backend): a large block freed on a stream while that stream captures a
/// graph; the capture ends; everything completes; `empty_cache` left the block's page mapped.
/// The vmm resource keeps such a block out of its free ranges until the capture ends and then
/// records its fence — during the trim, after empty_cache's synchronisation, so the fence had not
/// completed and the page was not idle. The trim now waits for those fences too.
#[test]
fn empty_cache_releases_a_vmm_block_freed_during_a_capture() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let p = r.malloc(2 * MIB, 0, 3);
    r.sim.begin_capture(0, s(3));
    r.alloc.free(p, 0).unwrap();
    r.sim.end_capture(0, s(3));
    r.sim.complete_all();
    r.alloc.empty_cache().unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        0,
        "the page freed during the capture is still mapped"
    );
    r.finish();
}

/// Fuzz input (the vmm backend, injected faults): giving a new page access failed, and so did
/// unmapping it again; the page was then kept as free memory — mapped, but without access — and
/// the next block placed there could not be used by its own device. Such a page is now blocked
/// until access is set or it is unmapped.
#[test]
fn a_vmm_page_left_without_access_is_never_handed_out() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let first = r.malloc(2 * MIB, 0, 1);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    assert!(r.alloc.malloc(4 * MIB, 0, s(1)).is_err());
    for _ in 0..3 {
        let p = r.malloc(4 * MIB, 0, 1);
        r.sim.touch(0, 0, p, 4 * MIB, s(1)).unwrap();
        r.alloc.free(p, 0).unwrap();
    }
    r.alloc.free(first, 0).unwrap();
    r.finish();
}

/// Fuzz input (the vmm backend, injected faults): the free of a large block could record no fence
/// (event creation failed). The vmm resource kept the block to fence it later but reported the
/// error, so the device kept it too, to return it again at the next `empty_cache` — which the
/// resource then refused as an unknown pointer. A free now never fails for want of a fence: the
/// fence is recorded later.
#[test]
fn a_vmm_free_that_cannot_record_its_fence_keeps_the_block_without_an_error() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        release_threshold: streampool::units::SizeSpec::Bytes(0),
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let p = r.malloc(4 * MIB, 0, 1);
    r.sim.inject_fault(SimFault::EventCreate, 1);
    r.alloc.free(p, 0).unwrap();
    assert!(
        !r.sim.take_injected(SimFault::EventCreate),
        "the free tried to fence"
    );
    r.sim.complete_all();
    r.alloc.empty_cache().unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        0,
        "released once it could be fenced"
    );
    r.finish();
}

/// Fuzz input (the vmm backend): the timeline started while blocks were live, and the first event
/// after it was a page unmapped by the release threshold; it carried the gauges of the device's
/// last event while recording (none: zeros) instead of its current ones. The gauges now start at
/// the device's current values when the timeline starts.
#[test]
fn a_mapping_event_right_after_the_timeline_starts_carries_the_device_s_gauges() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let live = r.malloc(4 * MIB, 0, 1);
    let freed = r.malloc(4 * MIB, 0, 1);
    r.alloc.free(freed, 0).unwrap();
    r.sim.complete_all();
    r.alloc.record_history(true, 16).unwrap();
    r.device(0).trim(0).unwrap(); // unmaps the freed block's pages
    let (events, _) = r.alloc.history(usize::MAX);
    let unmap = events.iter().find(|e| e.kind == 9).expect("an unmap event");
    assert_eq!(unmap.allocated_bytes, 4 * MIB, "{unmap:?}");
    r.alloc.free(live, 0).unwrap();
    r.finish();
}

/// Fuzz input (the vmm backend, 2026-12-01; a fault of the harness, not of the library): blocks
/// of 4.8 MiB on stream 1, one freed with stream 1's work unfinished, then 2.6 MiB on stream 2.
/// The vmm backend hands stream 2 the freed memory after making stream 2 wait on the GPU for
/// stream 1's fence, as it promises; the harness counted only work completed on the host and
/// called that a race. Its check now accepts a wait on the GPU (`SimDriver::event_precedes`);
/// this test holds both halves: the memory is reused, and only after the wait.
#[test]
fn memory_freed_on_one_stream_goes_to_another_only_after_it_waited_on_the_gpu() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let sim = Arc::new(SimDriver::new(1, 64 * MIB).strict().check_races());
    let r = Rig {
        alloc: Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap(),
        sim,
    };
    let (sim, alloc) = (&r.sim, &r.alloc);
    let (s1, s2) = (s(1), s(2));
    let (a_bytes, b_bytes, c_bytes) = (5_057_246, 5_049_607, 2_752_339);
    let a = alloc.malloc(a_bytes, 0, s1).unwrap();
    let b = alloc.malloc(b_bytes, 0, s1).unwrap();
    sim.touch(0, 0, b, b_bytes, s1).unwrap(); // work of stream 1, unfinished, uses b
    let used = sim.event_create(0).unwrap();
    sim.event_record(0, used, s1).unwrap();
    alloc.free(b, 0).unwrap();
    assert!(
        !sim.event_precedes(0, used, s2),
        "stream 2 has not waited yet"
    );
    let waits = sim.calls("cuStreamWaitEvent");
    let c = alloc.malloc(c_bytes, 0, s2).unwrap();
    assert!(
        overlaps(c, c_bytes, b, b_bytes),
        "reused the freed block's memory"
    );
    assert_eq!(
        sim.calls("cuStreamWaitEvent"),
        waits + 1,
        "stream 2 waited on the GPU"
    );
    assert!(
        !sim.event_query(0, used).unwrap(),
        "stream 1's work is still unfinished"
    );
    assert!(
        sim.event_precedes(0, used, s2),
        "stream 2's work runs after stream 1's"
    );
    sim.touch(0, 0, c, c_bytes, s2).unwrap(); // no race: ordered after stream 1's use
    sim.event_destroy(0, used);
    for p in [a, c] {
        alloc.free(p, 0).unwrap();
    }
    r.finish();
}

/// Fuzz input (allocator_ops with sleep and wake, vmm): two mallocs on device 0, then `wake` of
/// device 1, never used.
///
/// The wake set device 1 up before it found nothing asleep, and setting a device up grants the
/// memory of the devices already in use access to it (peer access, automatic): device 0's
/// `num_set_access_calls` went up under a refused call. A device never used is now refused at
/// once.
#[test]
fn waking_a_device_never_used_is_refused_and_changes_no_other_device() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(2, 64 * MIB, config);
    let a = r.malloc(64 * 1024, 0, 1);
    let before = [r.stats(0), r.stats(1)];
    let e = r.device(1).wake().unwrap_err().to_string();
    assert!(e.contains("not asleep"), "{e}");
    assert_eq!(
        [r.stats(0), r.stats(1)],
        before,
        "a refused wake changed statistics"
    );
    r.free(a, 0);
    r.finish();
}

/// Fuzz inputs (allocator_ops with sleep and wake, vmm): sleep device 0, begin a capture on
/// stream 1, malloc on stream 1; and sleep, set a memory fraction of 0, malloc.
///
/// The capture's allocation went to graph memory, which asked nothing of the sleeping device,
/// and was served; the one above the limit was an out-of-memory error (counted in `num_ooms`)
/// rather than the device's refusal. A sleeping device now refuses both, saying it is asleep.
#[test]
fn a_sleeping_device_refuses_allocations_during_a_capture_and_above_its_limit_alike() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let a = r.malloc(MIB, 0, 1);
    r.device(0).sleep(1, &[]).unwrap();
    r.sim.begin_capture(0, s(1));
    let e = r.alloc.malloc(MIB, 0, s(1)).unwrap_err().to_string();
    assert!(e.contains("asleep"), "{e}");
    r.sim.end_capture(0, s(1));
    r.device(0).set_memory_fraction(0.0).unwrap();
    let before = r.stats(0);
    let e = r.alloc.malloc(5 * MIB, 0, s(1)).unwrap_err().to_string();
    assert!(e.contains("asleep"), "{e}");
    assert_eq!(
        r.stats(0),
        before,
        "a refused allocation changed statistics"
    );
    r.device(0).set_memory_fraction(1.0).unwrap();
    r.device(0).wake().unwrap();
    r.free(a, 0);
    r.finish();
}

/// Fuzz input (allocator_ops with sleep and wake, vmm, minimised from 33 ops): 52 MiB of blocks
/// on a 64 MiB device, `cuMemRelease` made to fail once, sleep, then the final wake.
///
/// The sleep gave every page back but one span, whose release failed: kept aside, to be released
/// at the next try. The wake mapped the live blocks' pages again beside it and ran out of memory.
/// A wake now tries those spans again first.
#[test]
fn a_span_the_driver_would_not_release_at_a_sleep_is_released_before_the_wake_maps() {
    let config = Config {
        backend: streampool::config::Backend::Vmm,
        vmm_span_bytes: Some(32 * MIB),
        ..common::base_config()
    };
    let r = rig_with(1, 64 * MIB, config);
    let a = r.malloc(40 * MIB, 0, 1);
    r.sim.inject_fault(SimFault::MemRelease, 1);
    r.device(0).sleep(1, &[]).unwrap();
    assert!(
        !r.sim.take_injected(SimFault::MemRelease),
        "the fault fired"
    );
    assert!(r.sim.physical_bytes(0) > 0, "a span kept aside");
    r.device(0).wake().unwrap();
    r.sim.touch(0, 0, a, 40 * MIB, s(1)).unwrap();
    r.free(a, 0);
    r.finish();
}

//! The simulator's own rules, checked directly (the allocator's tests rely on them).

use super::vmm::GRANULE_BYTES;
use super::*;
use crate::driver::{MemHandle, PoolAttr, PoolDriver, StreamDriver, VmmDriver};

const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

#[test]
fn same_stream_reuses_at_once_other_streams_after_completion() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    let pool = sim.pool_create(0, u64::MAX, false).unwrap();
    let a = sim.alloc_async(0, pool, 4 << 20, S1).unwrap();
    sim.free_async(0, a, S1).unwrap();
    assert_eq!(
        sim.alloc_async(0, pool, 4 << 20, S1).unwrap(),
        a,
        "own stream reuses at once"
    );
    sim.free_async(0, a, S1).unwrap();
    let b = sim.alloc_async(0, pool, 4 << 20, S2).unwrap();
    assert_ne!(
        a, b,
        "another stream must not get memory whose free has not completed"
    );
    sim.free_async(0, b, S2).unwrap();
    sim.synchronize(0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().used_bytes, 0);
    sim.pool_destroy(0, pool).unwrap();
}

#[test]
fn capacity_limits_growth_and_trim_releases() {
    let sim = SimDriver::new(1, 8 << 20).strict();
    let pool = sim.pool_create(0, u64::MAX, false).unwrap();
    sim.pool_set_attr(0, pool, PoolAttr::ReleaseThresholdBytes(u64::MAX))
        .unwrap();
    let a = sim.alloc_async(0, pool, 6 << 20, Stream(0)).unwrap();
    let err = sim.alloc_async(0, pool, 4 << 20, Stream(0)).unwrap_err();
    assert!(err.is_device_oom());
    assert!(
        sim.alloc_async(0, pool, u64::MAX - 100, Stream(0))
            .unwrap_err()
            .is_device_oom(),
        "a size near 2^64 is out of memory, not a wrapped small allocation"
    );
    sim.free_async(0, a, Stream(0)).unwrap();
    sim.synchronize(0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 6 << 20);
    sim.pool_trim(0, pool, 0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 0);
    sim.pool_destroy(0, pool).unwrap();
    assert!(
        sim.alloc_async(0, pool, 512, Stream(0)).is_err(),
        "a destroyed pool serves nothing"
    );
}

#[test]
fn events_complete_with_their_stream() {
    let sim = SimDriver::new(1, 8 << 20);
    let e = sim.event_create(0).unwrap();
    sim.event_record(0, e, Stream(7)).unwrap();
    assert!(!sim.event_query(0, e).unwrap());
    sim.complete_stream(0, Stream(7));
    assert!(sim.event_query(0, e).unwrap());
    sim.event_destroy(0, e);
}

#[test]
#[should_panic(expected = "leak")]
fn strict_drop_reports_leaked_memory() {
    let sim = SimDriver::new(1, 8 << 20).strict();
    let pool = sim.pool_create(0, u64::MAX, false).unwrap();
    sim.alloc_async(0, pool, 512, Stream(0)).unwrap();
}

#[test]
#[should_panic(expected = "1 pools not destroyed")]
fn strict_drop_reports_pools_left() {
    let sim = SimDriver::new(1, 8 << 20).strict();
    sim.pool_create(0, u64::MAX, false).unwrap();
}

/// A mapped, accessible page at the start of a fresh reservation of `pages` pages.
fn mapped(sim: &SimDriver, pages: u64) -> (DevicePtr, MemHandle) {
    let base = sim.address_reserve(0, pages * GRANULE_BYTES).unwrap();
    let h = sim.mem_create(0, GRANULE_BYTES).unwrap();
    sim.mem_map(0, base, GRANULE_BYTES, h).unwrap();
    sim.mem_set_access(0, base, GRANULE_BYTES, &[0]).unwrap();
    (base, h)
}

fn tidy(sim: &SimDriver, base: DevicePtr, pages: u64, h: MemHandle) {
    sim.mem_unmap(0, base, GRANULE_BYTES).unwrap();
    sim.mem_release(0, h).unwrap();
    sim.address_free(0, base, pages * GRANULE_BYTES).unwrap();
}

#[test]
fn vmm_counts_physical_memory_and_runs_out() {
    let sim = SimDriver::new(1, 3 * GRANULE_BYTES).strict();
    let (base, h) = mapped(&sim, 4);
    let h2 = sim.mem_create(0, 2 * GRANULE_BYTES).unwrap();
    assert_eq!(sim.mem_info(0).unwrap().free_bytes, 0);
    assert!(sim
        .mem_create(0, GRANULE_BYTES)
        .unwrap_err()
        .is_device_oom());
    sim.mem_release(0, h2).unwrap();
    tidy(&sim, base, 4, h);
    assert_eq!(sim.physical_bytes(0), 0);
}

#[test]
fn vmm_touch_needs_mapping_and_access() {
    let sim = SimDriver::new(2, 64 << 20);
    let base = sim.address_reserve(0, 2 * GRANULE_BYTES).unwrap();
    let h = sim.mem_create(0, GRANULE_BYTES).unwrap();
    assert!(sim.touch(0, 0, base, 512, S1).is_err(), "unmapped");
    sim.mem_map(0, base, GRANULE_BYTES, h).unwrap();
    assert!(
        sim.touch(0, 0, base, 512, S1).is_err(),
        "mapped, but no access set yet"
    );
    sim.mem_set_access(0, base, GRANULE_BYTES, &[0]).unwrap();
    sim.touch(0, 0, base, 512, S1).unwrap();
    assert!(
        sim.touch(0, 1, base, 512, S1).is_err(),
        "the peer has no access"
    );
    sim.mem_set_access(0, base, GRANULE_BYTES, &[1]).unwrap();
    sim.touch(0, 1, base, 512, S1).unwrap();
    assert!(
        sim.touch(0, 0, base.offset(GRANULE_BYTES - 256), 512, S1)
            .is_err(),
        "past the page"
    );
    sim.complete_all();
    tidy(&sim, base, 2, h);
}

#[test]
#[should_panic(expected = "unfinished work on stream")]
fn vmm_unmap_of_memory_in_use_panics_when_strict() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    let (base, _) = mapped(&sim, 1);
    sim.touch(0, 0, base, 4096, S2).unwrap();
    let _ = sim.mem_unmap(0, base, GRANULE_BYTES);
}

#[test]
fn vmm_rejects_overlapping_maps_partial_unmaps_and_busy_releases() {
    let sim = SimDriver::new(1, 64 << 20);
    let (base, h) = mapped(&sim, 2);
    let other = sim.mem_create(0, GRANULE_BYTES).unwrap();
    assert!(
        sim.mem_map(0, base, GRANULE_BYTES, other).is_err(),
        "over a mapping"
    );
    assert!(
        sim.mem_unmap(0, base, 2 * GRANULE_BYTES).is_err(),
        "not one whole mapping"
    );
    assert!(sim.mem_release(0, h).is_err(), "still mapped");
    assert!(
        sim.address_free(0, base, 2 * GRANULE_BYTES).is_err(),
        "not empty"
    );
    assert!(
        sim.address_reserve(0, 4096).is_err(),
        "not a multiple of the granule"
    );
    sim.mem_release(0, other).unwrap();
    tidy(&sim, base, 2, h);
}

/// CUDA lets one handle be mapped at several addresses; work of one stream may not touch it at
/// one while another stream's unfinished work uses it at the other (the resource moves a page's
/// memory before the old address is unmapped only in stream order).
#[test]
fn a_handle_mapped_twice_is_shared_memory_in_stream_order_only() {
    let sim = SimDriver::new(1, 64 << 20);
    let (base, h) = mapped(&sim, 2);
    let alias = base.offset(GRANULE_BYTES);
    sim.mem_map(0, alias, GRANULE_BYTES, h).unwrap();
    sim.mem_set_access(0, alias, GRANULE_BYTES, &[0]).unwrap();
    let (s1, s2) = (Stream(1), Stream(2));
    sim.touch(0, 0, base, 512, s1).unwrap();
    assert!(
        sim.touch(0, 0, alias, 512, s1).is_ok(),
        "the same stream: in order"
    );
    assert!(
        sim.touch(0, 0, alias, 512, s2).is_err(),
        "another stream while s1's work at the other address is unfinished"
    );
    sim.complete_all();
    sim.touch(0, 0, alias, 512, s2).unwrap();
    sim.complete_all();
    assert!(sim.mem_release(0, h).is_err(), "still mapped twice");
    sim.mem_unmap(0, alias, GRANULE_BYTES).unwrap();
    assert!(sim.mem_release(0, h).is_err(), "still mapped once");
    tidy(&sim, base, 2, h);
}

#[test]
#[should_panic(expected = "physical handles not released")]
fn strict_drop_reports_vmm_leaks() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    sim.mem_create(0, GRANULE_BYTES).unwrap();
}

#[test]
#[should_panic(expected = "cuMemFreeHost: not a live host buffer")]
fn freeing_a_host_buffer_twice_is_a_misuse() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    let buffer = sim.host_alloc(0, 4096).unwrap();
    sim.host_free(0, buffer);
    sim.host_free(0, buffer);
}

#[test]
fn counts_event_queries_and_the_handles_set_access_covers() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    let base = sim.address_reserve(0, 4 * GRANULE_BYTES).unwrap();
    let handles: Vec<MemHandle> = (0..3)
        .map(|page| {
            let h = sim.mem_create(0, GRANULE_BYTES).unwrap();
            sim.mem_map(0, base.offset(page * GRANULE_BYTES), GRANULE_BYTES, h)
                .unwrap();
            h
        })
        .collect();
    sim.mem_set_access(0, base, 3 * GRANULE_BYTES, &[0])
        .unwrap();
    sim.mem_set_access(0, base, GRANULE_BYTES, &[0]).unwrap();
    assert_eq!(sim.calls("cuMemSetAccess"), 2);
    assert_eq!(sim.calls("cuMemSetAccess handles"), 4, "3 + 1 mappings");
    let event = sim.event_create(0).unwrap();
    sim.event_record(0, event, S1).unwrap();
    assert!(!sim.event_query(0, event).unwrap());
    assert!(!sim.event_query(0, event).unwrap());
    assert_eq!(sim.calls("cuEventQuery"), 2);
    sim.event_destroy(0, event);
    sim.complete_all();
    for (page, h) in handles.into_iter().enumerate() {
        sim.mem_unmap(0, base.offset(page as u64 * GRANULE_BYTES), GRANULE_BYTES)
            .unwrap();
        sim.mem_release(0, h).unwrap();
    }
    sim.address_free(0, base, 4 * GRANULE_BYTES).unwrap();
}

#[test]
fn a_stream_completes_up_to_a_tick_and_no_further() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    let (early, late) = (sim.event_create(0).unwrap(), sim.event_create(0).unwrap());
    sim.event_record(0, early, S1).unwrap();
    let tick = sim.stream_tick(0, S1);
    sim.event_record(0, late, S1).unwrap();
    assert_eq!(sim.stream_tick(0, S1), tick + 1, "a record is one tick");
    sim.complete_stream_to(0, S1, tick);
    assert!(
        sim.event_query(0, early).unwrap(),
        "work up to the tick completed"
    );
    assert!(
        !sim.event_query(0, late).unwrap(),
        "later work is still pending"
    );
    assert!(!sim.stream_query(0, S1).unwrap());
    sim.complete_stream_to(0, S1, u64::MAX);
    assert!(sim.event_query(0, late).unwrap() && sim.stream_query(0, S1).unwrap());
    sim.event_destroy(0, early);
    sim.event_destroy(0, late);
}

#[test]
fn pools_that_apply_frees_at_sync_release_them_only_after_one() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    sim.pools_apply_frees_at_sync(0);
    let pool = sim.pool_create(0, u64::MAX, false).unwrap();
    let a = sim.alloc_async(0, pool, 4 << 20, S1).unwrap();
    sim.free_async(0, a, S1).unwrap();
    sim.complete_stream(0, S1); // the GPU is done; the pool does not know yet
    sim.pool_trim(0, pool, 0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 4 << 20);
    sim.stream_synchronize(0, S1).unwrap();
    sim.pool_trim(0, pool, 0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 0);
    let b = sim.alloc_async(0, pool, 4 << 20, S2).unwrap();
    sim.free_async(0, b, S2).unwrap();
    sim.complete_all();
    sim.synchronize(0).unwrap();
    sim.pool_trim(0, pool, 0).unwrap();
    assert_eq!(sim.pool_usage(0, pool).unwrap().reserved_bytes, 0);
    sim.pool_destroy(0, pool).unwrap();
}

/// An exportable handle's memory is mapped by an importer through a file descriptor (within one
/// process here): the import is the same memory (stream-ordered like any alias), counts no new
/// memory, and the memory lives until creator and importer both released it.
#[test]
fn an_exported_handle_is_imported_through_its_fd_and_lives_until_both_released() {
    let sim = SimDriver::new(1, 64 << 20).strict();
    assert!(sim.mem_export_supported(0).unwrap());
    let plain = sim.mem_create(0, GRANULE_BYTES).unwrap();
    assert!(
        sim.mem_export_fd(0, plain).is_err(),
        "not created exportable"
    );
    let h = sim.mem_create_exportable(0, GRANULE_BYTES).unwrap();
    let fd = sim.mem_export_fd(0, h).unwrap();
    let imported = sim.mem_import_fd(0, fd).unwrap();
    // SAFETY: the fd was returned by mem_export_fd and is closed once.
    unsafe { libc::close(fd) };
    assert_eq!(
        sim.physical_bytes(0),
        2 * GRANULE_BYTES,
        "the import adds nothing"
    );
    let base = sim.address_reserve(0, 2 * GRANULE_BYTES).unwrap();
    let alias = base.offset(GRANULE_BYTES);
    sim.mem_map(0, base, GRANULE_BYTES, h).unwrap();
    sim.mem_map(0, alias, GRANULE_BYTES, imported).unwrap();
    for at in [base, alias] {
        sim.mem_set_access(0, at, GRANULE_BYTES, &[0]).unwrap();
    }
    sim.touch(0, 0, base, 512, Stream(1)).unwrap();
    assert!(
        sim.touch(0, 0, alias, 512, Stream(2)).is_err(),
        "the same memory"
    );
    sim.complete_all();
    sim.mem_unmap(0, base, GRANULE_BYTES).unwrap();
    sim.mem_release(0, h).unwrap();
    assert_eq!(
        sim.physical_bytes(0),
        2 * GRANULE_BYTES,
        "alive while imported"
    );
    sim.touch(0, 0, alias, 512, Stream(2)).unwrap();
    sim.complete_all();
    sim.mem_unmap(0, alias, GRANULE_BYTES).unwrap();
    sim.mem_release(0, imported).unwrap();
    assert_eq!(
        sim.physical_bytes(0),
        GRANULE_BYTES,
        "gone with its last reference"
    );
    sim.mem_release(0, plain).unwrap();
    sim.address_free(0, base, 2 * GRANULE_BYTES).unwrap();
}

/// Each device's addresses stay in its own window: a reservation that would run into the next
/// device's fails as an exhausted address space does, and the next device's are untouched.
#[test]
fn a_device_s_addresses_never_reach_the_next_device_s() {
    let sim = SimDriver::new(2, 1 << 30);
    // Up to the window's end (a reservation claims a granule more, for its alignment).
    let most = SIM_ADDR_WINDOW_BYTES - GRANULE_BYTES;
    let first = sim.address_reserve(0, most).unwrap();
    assert!(
        sim.address_reserve(0, GRANULE_BYTES).is_err(),
        "past the window"
    );
    let other = sim.address_reserve(1, GRANULE_BYTES).unwrap();
    assert!(
        other.0 >= first.0 + most,
        "{other:?} inside device 0's {first:?}"
    );
    sim.address_free(1, other, GRANULE_BYTES).unwrap();
    // A pool allocation that finds no addresses left fails and books nothing.
    let pool = sim.pool_create(0, u64::MAX, false).unwrap();
    assert!(sim.alloc_async(0, pool, 4 << 20, S1).is_err());
    let usage = sim.pool_usage(0, pool).unwrap();
    assert_eq!((usage.used_bytes, usage.reserved_bytes), (0, 0));
    sim.pool_destroy(0, pool).unwrap();
    sim.address_free(0, first, most).unwrap();
}

//! Sharing blocks with other processes, on the simulated driver: in one process the
//! exporter and the importer are the same allocator, which is enough to check the handles, the
//! pool routing and the bookkeeping on both sides.

mod common;
use common::*;
use streampool::driver::DevicePtr;
use streampool::ipc::{begin_shareable, end_shareable};
use streampool::Config;

fn with_shareable<T>(f: impl FnOnce() -> T) -> T {
    begin_shareable().unwrap();
    let out = f();
    end_shareable().unwrap();
    out
}

#[test]
fn a_shareable_block_round_trips_through_export_import_and_close() {
    let rig = rig(64 * MIB);
    let ptr = with_shareable(|| rig.malloc(3 * MIB, 0, 5));
    let handle = rig.alloc.device(0).unwrap().export(ptr, s(0)).unwrap();
    assert_eq!((handle.device, handle.block_bytes), (0, 3 * MIB));
    assert!(handle.pool_fd >= 0);
    assert_eq!(rig.stats(0).ipc_used_bytes, 3 * MIB);
    assert_eq!(rig.stats(0).reserved_bytes, 0, "the main pool is untouched");
    // The importing side (here the same process).
    let pool = rig.alloc.ipc_import_pool(0, handle.pool_fd).unwrap();
    let imported = rig.alloc.ipc_import(pool, &handle, s(9)).unwrap();
    assert_eq!(imported, ptr);
    assert_eq!(
        (rig.sim.imported_count(0), rig.alloc.ipc_open_imports()),
        (1, 1)
    );
    rig.alloc.ipc_close(imported, s(9)).unwrap();
    assert_eq!(
        (rig.sim.imported_count(0), rig.alloc.ipc_open_imports()),
        (0, 0)
    );
    assert!(rig.alloc.ipc_close(imported, s(9)).is_err(), "closed twice");
    // The exporter lets go: the block goes straight back to the shareable pool.
    rig.alloc
        .device(0)
        .unwrap()
        .release_export(handle.event)
        .unwrap();
    rig.free(ptr, 0);
    assert_eq!(rig.stats(0).cached_bytes, 0);
    rig.finish();
}

#[test]
fn shareable_allocations_never_take_cached_blocks() {
    let rig = rig(64 * MIB);
    let normal = rig.malloc(MIB, 0, 0);
    rig.free(normal, 0); // cached on stream 0
    let shared = with_shareable(|| rig.malloc(MIB, 0, 0));
    assert_ne!(shared, normal);
    rig.alloc.device(0).unwrap().export(shared, s(0)).unwrap();
    let again = rig.malloc(MIB, 0, 0);
    assert_eq!(
        again, normal,
        "outside the scope the cache serves as before"
    );
    rig.free(again, 0);
    rig.free(shared, 0);
    rig.finish();
}

#[test]
fn exporting_a_block_from_the_ordinary_pool_says_how_to_make_it_shareable() {
    let rig = rig(64 * MIB);
    let large = rig.malloc(8 * MIB, 0, 0); // from the main pool
    let p = rig.malloc(MIB, 0, 0); // from the small-block pool
    for block in [large, p] {
        let e = rig
            .alloc
            .device(0)
            .unwrap()
            .export(block, s(0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not in a shareable pool") && e.contains("streampool.shareable()"),
            "{e}"
        );
        assert!(e.contains("STREAMPOOL_IPC=1"), "{e}");
    }
    rig.free(large, 0);
    assert!(
        rig.alloc
            .device(0)
            .unwrap()
            .export(p.offset(512), s(0))
            .is_err(),
        "interior pointer"
    );
    assert!(
        rig.alloc.device(1).unwrap().export(p, s(0)).is_err(),
        "wrong device"
    );
    rig.free(p, 0);
    rig.finish();
}

#[test]
fn with_ipc_on_every_pool_block_is_shareable_cached_ones_included() {
    let config = Config {
        ipc: true,
        ..common::base_config()
    };
    let rig = rig_with(2, 64 * MIB, config);
    let p = rig.malloc(MIB, 1, 0);
    rig.free(p, 1);
    let q = rig.malloc(MIB, 1, 0);
    assert_eq!(p, q, "from the cache");
    let handle = rig.alloc.device(1).unwrap().export(q, s(0)).unwrap();
    let st = rig.stats(1);
    assert_eq!(
        (st.ipc_reserved_bytes, st.ipc_used_bytes),
        (st.reserved_bytes, st.pool_used_bytes)
    );
    let pool = rig.alloc.ipc_import_pool(1, handle.pool_fd).unwrap();
    let imported = rig.alloc.ipc_import(pool, &handle, s(0)).unwrap();
    rig.alloc.ipc_close(imported, s(0)).unwrap();
    rig.alloc
        .device(1)
        .unwrap()
        .release_export(handle.event)
        .unwrap();
    rig.free(q, 1);
    rig.finish();
}

#[test]
fn a_device_without_sharing_support_gives_a_clear_error() {
    let rig = rig(64 * MIB);
    rig.sim.set_ipc_unsupported(1);
    let e = with_shareable(|| rig.alloc.malloc(MIB, 1, s(0)).unwrap_err().to_string());
    assert!(
        e.contains("device 1 cannot share pool memory") && e.contains("HANDLE_TYPES"),
        "{e}"
    );
    assert!(
        !rig.alloc.device(1).unwrap().ipc_supported().unwrap()
            && rig.alloc.device(0).unwrap().ipc_supported().unwrap()
    );
    assert_eq!(rig.stats(1).num_allocs, 0);
    rig.finish();
}

#[test]
fn bad_imports_and_scopes_are_errors() {
    let rig = rig(64 * MIB);
    assert!(end_shareable().is_err(), "end without begin");
    let ptr = with_shareable(|| rig.malloc(MIB, 0, 0));
    let handle = rig.alloc.device(0).unwrap().export(ptr, s(0)).unwrap();
    assert!(
        rig.alloc.ipc_import(0xdead, &handle, s(0)).is_err(),
        "pool never imported"
    );
    let e = rig.alloc.ipc_import_pool(0, -1).unwrap_err().to_string();
    assert!(e.contains("not a file descriptor: -1"), "{e}");
    // 0 is a descriptor like any other (a process without stdin can receive a pool as 0): the
    // driver decides, here that it is no exported pool.
    let e = rig.alloc.ipc_import_pool(0, 0).unwrap_err().to_string();
    assert!(e.contains("cuMemPoolImportFromShareableHandle"), "{e}");
    assert!(rig.alloc.ipc_import_pool(5, handle.pool_fd).is_err());
    let unknown_fd = std::fs::File::open("/dev/null").unwrap();
    use std::os::fd::AsRawFd;
    assert!(rig
        .alloc
        .ipc_import_pool(0, unknown_fd.as_raw_fd())
        .is_err());
    assert!(rig.alloc.ipc_close(DevicePtr(0x1234), s(0)).is_err());
    assert_eq!(rig.alloc.ipc_open_imports(), 0);
    rig.alloc
        .device(0)
        .unwrap()
        .release_export(handle.event)
        .unwrap();
    rig.free(ptr, 0);
    rig.finish();
}

#[test]
fn a_shareable_block_used_on_other_streams_goes_back_to_its_pool_not_the_cache() {
    let rig = rig_with(2, 64 * MIB, common::pool_config());
    let shared = with_shareable(|| rig.malloc(MIB, 0, 1));
    rig.alloc.record_stream(shared, s(2)).unwrap();
    rig.free(shared, 0);
    assert_eq!(rig.stats(0).active_bytes, MIB, "waits for stream 2");
    rig.sim.complete_all();
    let normal = rig.malloc(MIB, 0, 1); // collects the finished wait
    let st = rig.stats(0);
    assert_eq!(
        (st.cached_bytes, st.ipc_used_bytes, st.num_cache_hits),
        (0, 0, 0)
    );
    assert_eq!(
        st.num_device_frees, 1,
        "the shareable block went back to its pool"
    );
    rig.free(normal, 0);
    rig.finish();
}

#[test]
fn the_memory_fraction_caps_shareable_allocations_too() {
    let rig = rig(64 * MIB);
    rig.alloc
        .device(0)
        .unwrap()
        .set_memory_fraction(0.25)
        .unwrap(); // 16 MiB
    let first = with_shareable(|| rig.malloc(12 * MIB, 0, 0));
    let e = with_shareable(|| rig.alloc.malloc(8 * MIB, 0, s(0)).unwrap_err().to_string());
    assert!(
        e.starts_with("CUDA out of memory.") && e.contains("limit"),
        "{e}"
    );
    rig.free(first, 0);
    rig.finish();
}

#[test]
fn a_block_imported_twice_is_mapped_once_until_its_last_close() {
    let rig = rig(64 * MIB);
    let ptr = with_shareable(|| rig.malloc(MIB, 0, 0));
    let (h1, h2) = (
        rig.alloc.device(0).unwrap().export(ptr, s(0)).unwrap(),
        rig.alloc.device(0).unwrap().export(ptr, s(0)).unwrap(),
    );
    let pool = rig.alloc.ipc_import_pool(0, h1.pool_fd).unwrap();
    let (a, b) = (
        rig.alloc.ipc_import(pool, &h1, s(0)).unwrap(),
        rig.alloc.ipc_import(pool, &h2, s(0)).unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(
        (rig.sim.imported_count(0), rig.alloc.ipc_open_imports()),
        (1, 2)
    );
    rig.alloc.ipc_close(a, s(0)).unwrap();
    assert_eq!(
        (rig.sim.imported_count(0), rig.alloc.ipc_open_imports()),
        (1, 1),
        "still mapped"
    );
    rig.alloc.ipc_close(b, s(0)).unwrap();
    assert_eq!(
        (rig.sim.imported_count(0), rig.alloc.ipc_open_imports()),
        (0, 0)
    );
    for h in [h1, h2] {
        rig.alloc
            .device(0)
            .unwrap()
            .release_export(h.event)
            .unwrap();
        let again = rig
            .alloc
            .device(0)
            .unwrap()
            .release_export(h.event)
            .unwrap_err()
            .to_string();
        assert!(
            again.contains("not the event of an unreleased export"),
            "{again}"
        );
    }
    assert!(
        rig.alloc.device(0).unwrap().release_export(0xbad).is_err(),
        "never exported"
    );
    rig.free(ptr, 0);
    rig.finish();
}

/// Found by what it is (the device's one shareable pool), not by number: with the small-block
/// pool it is the third pool. Fails if shareable pools are never granted to peers.
#[test]
fn the_shareable_pool_follows_the_peer_access_policy() {
    let rig = rig_with(2, 64 * MIB, common::pool_config()); // auto
    let p1 = rig.malloc(MIB, 1, 0);
    let ptr = with_shareable(|| rig.malloc(MIB, 0, 0));
    assert_eq!(rig.own_pools(0).len(), 2, "main and small-block pools");
    // device 1 allocates, so it may read device 0's shareable pool.
    assert_eq!(rig.shareable_pool(0).peers, [1]);
    rig.free(ptr, 0);
    rig.free(p1, 1);
    rig.finish();
    let rig = rig_with(
        2,
        64 * MIB,
        Config {
            peer_access: streampool::config::PeerAccess::Off,
            ..common::pool_config()
        },
    );
    let p1 = rig.malloc(MIB, 1, 0);
    let ptr = with_shareable(|| rig.malloc(MIB, 0, 0));
    assert!(rig.shareable_pool(0).peers.is_empty(), "off: no grants");
    rig.free(ptr, 0);
    rig.free(p1, 1);
    rig.finish();
}

#[test]
fn shareable_allocations_count_as_device_allocations() {
    let rig = rig(64 * MIB);
    let p = with_shareable(|| rig.malloc(MIB, 0, 0));
    let st = rig.stats(0);
    assert_eq!(
        (st.num_allocs, st.num_device_allocs, st.num_cache_hits),
        (1, 1, 0)
    );
    rig.free(p, 0);
    rig.finish();
}

//! Growth of a device's CUDA pools (`src/device/growth.rs`): before a pool grows, its cached
//! blocks go back to it and, with `trim_on_growth`, it waits for the allocating stream and
//! releases what it does not use; after it grew although it reported room (fragmentation), its
//! cached blocks go back too. Read through the simulator's pool accounting
//! (`DeviceAllocator::stats`: reserved, cached, growth syncs) and the memory timeline.

mod common;
#[path = "common/wrapped.rs"]
mod wrapped;

use common::*;
use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::Driver;
use streampool::history::{StreampoolEvent, StreampoolEventKind as Kind};
use streampool::units::SizeSpec;
use streampool::{Allocator, Config};
use wrapped::Wrapped;

fn events(r: &Rig) -> Vec<StreampoolEvent> {
    r.alloc.history(usize::MAX).0
}

fn kinds(events: &[StreampoolEvent]) -> Vec<u32> {
    events.iter().map(|e| e.kind).collect()
}

fn k(kinds: &[Kind]) -> Vec<u32> {
    kinds.iter().map(|&k| k as u32).collect()
}

/// The pool has free room for the request (memory freed earlier and completed): it serves it
/// without growing, the cache keeps its blocks and nobody waits for the stream.
#[test]
fn a_miss_the_pool_has_room_for_leaves_the_cache_alone_and_does_not_wait() {
    let r = pool_rig(1 << 30);
    // Over the 64 MiB cache budget: freed straight back to the pool, which keeps it as room.
    let big = r.malloc(100 * MIB, 0, 1);
    r.free(big, 0);
    r.sim.complete_all();
    let a = r.malloc(8 * MIB, 0, 1);
    r.free(a, 0); // cached
    let syncs = r.stats(0).num_growth_syncs;
    let b = r.malloc(4 * MIB, 0, 2); // another stream: a miss
    let st = r.stats(0);
    assert_eq!(st.reserved_bytes, 100 * MIB, "the pool did not grow");
    assert_eq!(st.cached_bytes, 8 * MIB, "the cached block stays cached");
    assert_eq!(st.num_growth_syncs, syncs, "no wait for the stream");
    r.free(b, 0);
    r.finish();
}

/// A real pool can grow although its free bytes would hold the request: they are scattered
/// (`Wrapped::scatter`). The cache could not have known; once the pool grew, its cached blocks go
/// back so that they do not push the next peak higher still.
#[test]
fn a_pool_that_grew_although_it_reported_room_gets_its_cached_blocks_back() {
    let w = Wrapped::new(1, 1 << 30);
    let alloc = Allocator::new(w.clone() as Arc<dyn Driver>, common::pool_config()).unwrap();
    let a = alloc.malloc(8 * MIB, 0, s(1)).unwrap();
    alloc.free(a, 0).unwrap(); // cached
    let main = w.sim.pool_infos(0)[0].handle; // created first: the pool of large blocks
    w.scatter(0, main, 64 * MIB);
    // The pool reports 64 MiB of room: nothing goes back before the allocation; it grows.
    let b = alloc.malloc(20 * MIB, 0, s(1)).unwrap();
    let st = alloc.device(0).unwrap().stats().unwrap();
    assert_eq!(
        st.reserved_bytes,
        (64 + 8 + 20) * MIB,
        "it grew by 20 MiB: {st:?}"
    );
    assert_eq!(
        st.cached_bytes, 0,
        "the cached 8 MiB went back after the growth"
    );
    assert_eq!(st.num_device_frees, 1);
    alloc.free(b, 0).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.device(0).unwrap().stats().unwrap().reserved_bytes, 0);
    drop(alloc);
    assert_eq!(w.sim.outstanding_bytes(), 0);
}

/// The stream's own earlier frees (two 4 MiB blocks, back in the pool but not reached by the
/// stream) are room once the stream caught up: after the wait the pool serves 8 MiB without
/// releasing or growing anything.
#[test]
fn a_wait_that_makes_room_is_followed_by_neither_a_trim_nor_growth() {
    let config = Config {
        cache_limit: SizeSpec::Bytes(0), // every free goes straight back to the pool
        ..common::pool_config()
    };
    let r = rig_with(1, 1 << 30, config);
    let a = r.malloc(4 * MIB, 0, 1);
    let b = r.malloc(4 * MIB, 0, 1);
    r.free(a, 0);
    r.free(b, 0);
    r.alloc.record_history(true, 100).unwrap();
    let syncs = r.stats(0).num_growth_syncs;
    let c = r.malloc(8 * MIB, 0, 1);
    let st = r.stats(0);
    assert_eq!(st.num_growth_syncs, syncs + 1, "waited for stream 1");
    assert_eq!(st.reserved_bytes, 8 * MIB);
    assert_eq!(
        kinds(&events(&r)),
        k(&[Kind::PoolAlloc, Kind::Alloc]),
        "no trim, no growth"
    );
    r.free(c, 0);
    r.finish();
}

/// Nothing of the stream's makes room for 20 MiB: the pool releases its unused 8 MiB first and
/// then grows by 20 MiB, and the timeline says so with the device's reserved bytes (the
/// small-block pool's 2 MiB included).
#[test]
fn a_pool_that_must_grow_releases_its_unused_memory_first_as_the_timeline_shows() {
    let r = pool_rig(1 << 30);
    let tiny = r.malloc(4096, 0, 0); // the small-block pool holds 2 MiB throughout
    let a = r.malloc(8 * MIB, 0, 1);
    r.free(a, 0); // cached
    r.alloc.record_history(true, 100).unwrap();
    let b = r.malloc(20 * MIB, 0, 1);
    let events = events(&r);
    let expected = [
        Kind::PoolFree, // the cached block goes back to the pool
        Kind::PoolTrim,
        Kind::PoolGrow,
        Kind::PoolAlloc,
        Kind::Alloc,
    ];
    assert_eq!(kinds(&events), k(&expected), "{events:?}");
    let (trim, grow) = (&events[1], &events[2]);
    assert_eq!((trim.bytes, trim.reserved_bytes), (8 * MIB, 2 * MIB));
    assert_eq!((grow.bytes, grow.reserved_bytes), (20 * MIB, 22 * MIB));
    assert_eq!(r.stats(0).reserved_bytes, 22 * MIB);
    r.free(b, 0);
    r.free(tiny, 0);
    r.finish();
}

/// `STREAMPOOL_TRIM_ON_GROWTH=0` skips the wait, not the return of cached blocks: the pool still
/// reuses a cached block's memory for a request of another size instead of growing.
#[test]
fn without_trim_on_growth_cached_blocks_still_go_back_before_the_pool_grows() {
    let config = Config {
        trim_on_growth: false,
        ..common::pool_config()
    };
    let r = rig_with(1, 1 << 30, config);
    let a = r.malloc(8 * MIB, 0, 1);
    r.free(a, 0); // cached
    let b = r.malloc(6 * MIB, 0, 1); // the cached block wastes more than 1/8 of it: a miss
    let st = r.stats(0);
    assert_eq!(
        (st.reserved_bytes, st.cached_bytes, st.num_growth_syncs),
        (8 * MIB, 0, 0),
        "the pool reused the cached block's memory, without a wait"
    );
    r.free(b, 0);
    r.finish();
}

/// The virtual-memory resource reuses its own holes (it does not return before growth): its
/// growth never waits for the stream, for large blocks or small ones (carved out of its pages).
#[test]
fn the_virtual_memory_backend_never_waits_for_its_stream_before_growing() {
    let config = Config {
        backend: Backend::Vmm,
        ..common::pool_config()
    };
    let r = rig_with(1, 1 << 30, config);
    let large = r.malloc(8 * MIB, 0, 1);
    let small = r.malloc(4096, 0, 1);
    r.free(large, 0);
    let larger = r.malloc(12 * MIB, 0, 1);
    assert_eq!(r.stats(0).num_growth_syncs, 0, "vmm: no wait");
    r.free(larger, 0);
    r.free(small, 0);
    r.finish();
}

/// While the device knows of a capture, nothing synchronises: a growing pool does not wait for
/// its stream, and `empty_cache` returns the cache without trimming; once the capture ended it
/// trims.
#[test]
fn while_a_capture_is_known_growth_does_not_wait_and_empty_cache_does_not_trim() {
    let r = pool_rig(1 << 30);
    r.sim.begin_capture(0, s(9));
    let graph = r.malloc(4096, 0, 9); // the allocator learns of the capture
    let a = r.malloc(8 * MIB, 0, 1);
    assert_eq!(r.stats(0).num_growth_syncs, 0, "no wait during a capture");
    r.free(a, 0);
    r.alloc.empty_cache().unwrap();
    let st = r.stats(0);
    assert_eq!(
        (st.cached_bytes, st.reserved_bytes),
        (0, 8 * MIB),
        "the cache went back, the pool kept its memory"
    );
    r.free(graph, 0);
    r.sim.end_capture(0, s(9));
    r.alloc.empty_cache().unwrap();
    assert_eq!(r.stats(0).reserved_bytes, 0);
    r.finish();
}

//! Graph captures the device has not seen allocate, and frees on capturing streams: no call a
//! capture forbids reaches the driver while one may be under way (PyTorch opens its route to the
//! graph pool before it begins the capture), on both backends.

mod common;

use common::pools::{malloc_routed, OnStream, POOL};
use common::{base_config, rig_with, s, MIB};
use std::sync::Arc;
use streampool::Error;

/// A block of the pool backend freed on a stream while it captures goes back to its CUDA pool
/// only after the capture: `cuMemFreeAsync` on that stream would be a node of the graph (an
/// error on a GPU for memory the graph did not allocate). Neither at its free (a block too large
/// for the cache goes straight back) nor at `empty_cache()` (the cache's blocks go back). After
/// the capture, `empty_cache()` returns them.
#[test]
fn no_block_goes_back_to_a_cuda_pool_on_a_capturing_stream() {
    let r = rig_with(1, 512 * MIB, common::pool_config());
    let big = r.malloc(64 * MIB, 0, 5);
    let small = r.malloc(MIB, 0, 5);
    let pools = r.device(0).graph_pools();
    pools
        .begin_allocate_to_pool(POOL, Arc::new(OnStream(s(5))))
        .unwrap();
    r.sim.begin_capture(0, s(5));
    let inside = malloc_routed(&r, 4096, 5); // the capture is known to the device now
    r.free(big, 0); // too large for the cache
    r.free(small, 0); // cached
    r.alloc.empty_cache().unwrap();
    assert_eq!(r.sim.calls("unsafe during capture"), 0);
    let held = r.stats(0).reserved_bytes;
    r.free(inside, 0);
    r.sim.end_capture(0, s(5));
    pools.end_allocate_to_pool(POOL).unwrap();
    pools.release_pool(POOL).unwrap();
    r.alloc.empty_cache().unwrap();
    assert!(
        r.stats(0).reserved_bytes + 64 * MIB <= held,
        "the blocks put off during the capture did not go back after it"
    );
}

/// While a route to a graph pool is open a capture may be under way that the device has not
/// seen allocate (PyTorch opens the route before it begins the capture, and a capture may never
/// allocate): `empty_cache()`, an allocation that runs out of memory, and one past the memory
/// fraction then neither synchronise the device nor unmap memory — on both backends.
#[test]
fn nothing_synchronises_while_a_capture_the_device_has_not_seen_may_be_under_way() {
    for config in [base_config(), common::pool_config()] {
        let backend = config.backend;
        let r = rig_with(1, 64 * MIB, config);
        let warm = r.malloc(4 * MIB, 0, 1);
        let cached = r.malloc(16 * MIB, 0, 2);
        r.free(warm, 0);
        r.free(cached, 0); // the pool backend's cache holds it: reserved, not live
        r.device(0).set_memory_fraction(0.5).unwrap();
        let pools = r.device(0).graph_pools();
        pools
            .begin_allocate_to_pool(POOL, Arc::new(OnStream(s(5))))
            .unwrap();
        r.sim.begin_capture(0, s(5)); // nothing allocated on stream 5 yet
                                      // A growth: new memory mapped (vmm, served), or reserved past the fraction where only a
                                      // synchronisation would make room (the pool: the cached block goes back on stream 2,
                                      // whose free the pool applies at a synchronisation; refused, as PyTorch's allocator
                                      // releases no cached memory while a route is open).
        match r.alloc.malloc(24 * MIB, 0, s(1)) {
            Ok(grown) => r.free(grown, 0),
            Err(e) => assert!(matches!(e, Error::OutOfMemory { .. }), "{e}"),
        }
        r.alloc.empty_cache().unwrap();
        assert!(
            r.alloc.malloc(48 * MIB, 0, s(1)).is_err(),
            "past the fraction"
        );
        assert!(r.alloc.malloc(200 * MIB, 0, s(1)).is_err(), "out of memory");
        assert_eq!(
            r.sim.calls("unsafe during capture"),
            0,
            "{backend:?}: a call the capture forbids"
        );
        r.sim.end_capture(0, s(5));
        pools.end_allocate_to_pool(POOL).unwrap();
        pools.release_pool(POOL).unwrap();
        r.alloc.empty_cache().unwrap();
    }
}

/// Graph memory (a capture no route claims, beside an open route) freed inside its capture goes
/// to the driver at once, on the capturing stream: that free is the graph's own node. Put off,
/// it would be freed outside the graph later, and the graph could not be launched again.
#[test]
fn graph_memory_freed_in_its_capture_is_freed_there_while_a_route_is_open() {
    for config in [base_config(), common::pool_config()] {
        let backend = config.backend;
        let r = rig_with(1, 512 * MIB, config);
        let pools = r.device(0).graph_pools();
        pools
            .begin_allocate_to_pool(POOL, Arc::new(OnStream(s(5))))
            .unwrap();
        r.sim.begin_capture(0, s(7)); // a capture the route does not claim
        let g = r.malloc(MIB, 0, 7);
        assert!(
            r.sim.is_driver_memory(0, g),
            "{backend:?}: not graph memory"
        );
        let frees = r.sim.calls("cuMemFreeAsync");
        r.free(g, 0);
        assert_eq!(
            r.sim.calls("cuMemFreeAsync"),
            frees + 1,
            "{backend:?}: the graph's own free was put off"
        );
        r.sim.end_capture(0, s(7));
        pools.end_allocate_to_pool(POOL).unwrap();
        pools.release_pool(POOL).unwrap();
        r.alloc.empty_cache().unwrap();
    }
}

//! Limits on what the process reserves from the device: the memory fraction caps reserved memory
//! (pools' bytes, mapped pages), not only held blocks, on both backends and under sixteen threads;
//! a pool growth past the cap is undone; under the cap a synchronisation makes room first.

mod common;
use common::vmm::vmm_config;
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use streampool::driver::Stream;
use streampool::units::{format_bytes, SizeSpec};
use streampool::{Config, Error};

/// The pool backend with no cache: every free goes straight back to the pool.
fn uncached_pool() -> Config {
    Config {
        cache_limit: SizeSpec::Bytes(0),
        ..common::pool_config()
    }
}

/// As in PyTorch, the memory fraction caps what the process reserves from the device, not only
/// its live and cached blocks. A 48 MiB block freed on stream 1 is cached; a 40 MiB block for
/// stream 2 under a 64 MiB cap evicts it to the pool, where it waits for stream 1: the pool would
/// grow to 88 MiB around it. The device must free that memory first (synchronise, trim) and stay
/// within the cap. Failed while the cap applied to held bytes only (88 MiB reserved).
#[test]
fn the_memory_fraction_caps_reserved_memory_not_only_held_blocks() {
    for config in [common::pool_config(), vmm_config()] {
        let r = rig_with(1, 256 * MIB, config);
        r.device(0).set_memory_fraction(0.25).unwrap(); // 64 MiB
        let a = r.malloc(48 * MIB, 0, 1);
        r.free(a, 0);
        r.sim.reset_in_use_high(0);
        let b = r.malloc(40 * MIB, 0, 2);
        let high = r.sim.in_use_high_bytes(0);
        assert!(
            high <= 64 * MIB,
            "{} in use under a cap of 64 MiB",
            format_bytes(high)
        );
        assert_eq!(r.stats(0).num_ooms, 0);
        r.free(b, 0);
        r.finish();
    }
}

/// The same under 16 threads on streams of their own, churning blocks of 1-8 MiB under a 64 MiB
/// cap: the device's memory in use (pools' reserved bytes, or mapped pages) never passes the cap
/// at any moment — the simulator keeps its high-water mark — and every refusal is out of memory.
/// Failed on the pool backend while the cap applied to held bytes only (several times the cap
/// reserved), and in most runs with the check before growth but no lock around the growth.
/// A growth its check cannot foresee is what device/reserved_cap.rs documents: memory freed on
/// another stream and still pending counts as the pool's room but serves only that stream, so the
/// pool grows anyway, by up to the request rounded up to its 2 MiB granule (8 MiB here); the
/// block goes back and the pool is trimmed before the call returns, but the simulator's
/// high-water mark saw it (2 MiB over in about one run in six, 4 MiB in about one in forty).
/// More than one such growth at once (no lock around the growth: a quarter of the pool's runs),
/// or any on vmm, fails; the pool's case runs four times.
#[test]
fn the_memory_fraction_caps_reserved_memory_under_16_threads() {
    const THREADS: usize = 16;
    const ROUNDS: u64 = 200;
    const CAP_BYTES: u64 = 64 * MIB;
    let pool = || common::pool_config();
    for config in [pool(), pool(), pool(), pool(), vmm_config()] {
        let backend = config.backend;
        let r = rig_with(1, 1 << 30, config);
        r.device(0).set_memory_fraction(1.0 / 16.0).unwrap();
        r.sim.reset_in_use_high(0);
        let (served, unexpected) = (AtomicU64::new(0), Mutex::new(Vec::new()));
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (r, served, unexpected) = (&r, &served, &unexpected);
                scope.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                    let mut held = Vec::new();
                    for round in 0..ROUNDS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let bytes = (1 + x % 8) * MIB - (x >> 40) % 4096;
                        match unpanicked(|| r.alloc.malloc(bytes, 0, Stream(t + 1))) {
                            Ok(Ok(p)) => {
                                served.fetch_add(1, Ordering::Relaxed);
                                held.push(p);
                            }
                            Ok(Err(Error::OutOfMemory(_))) => {}
                            Ok(Err(e)) => unexpected.lock().unwrap().push(e.to_string()),
                            Err(panic) => unexpected.lock().unwrap().push(panic),
                        }
                        if held.len() > 2 || round % 5 == 0 {
                            for p in held.drain(..) {
                                if let Err(e) = r.alloc.free(p, 0) {
                                    unexpected.lock().unwrap().push(e.to_string());
                                }
                            }
                        }
                    }
                    for p in held {
                        r.alloc.free(p, 0).unwrap();
                    }
                });
            }
        });
        assert_eq!(unexpected.into_inner().unwrap(), Vec::<String>::new());
        let high = r.sim.in_use_high_bytes(0);
        let undone_growth_bytes = match backend {
            streampool::config::Backend::Pool => 8 * MIB,
            _ => 0,
        };
        assert!(
            high <= CAP_BYTES + undone_growth_bytes,
            "{backend:?}: {} in use at once under a cap of {}",
            format_bytes(high),
            format_bytes(CAP_BYTES)
        );
        assert!(served.into_inner() >= ROUNDS, "{backend:?}: too few served");
        r.finish();
    }
}

/// The pool's free memory is fragmented: a 32 MiB block for stream 2 fits in the 40 MiB the pool
/// has free by its numbers, but the pool grows by 32 MiB anyway, to 72 MiB under a 64 MiB cap.
/// The growth must be undone (the block back, the pool trimmed) and the block served again within
/// the cap. Failed without the check after the growth (72 MiB stayed reserved).
#[test]
fn a_pool_growth_past_the_memory_fraction_is_undone() {
    let r = rig_with(1, 256 * MIB, uncached_pool());
    r.device(0).set_memory_fraction(0.25).unwrap(); // 64 MiB
    let a = r.malloc(40 * MIB, 0, 1);
    r.free(a, 0);
    r.sim.complete_stream(0, s(1));
    r.sim.fragment_pools(0);
    let b = r.malloc(32 * MIB, 0, 2);
    let st = r.stats(0);
    assert!(
        st.reserved_bytes <= 64 * MIB,
        "{} reserved under a cap of 64 MiB",
        format_bytes(st.reserved_bytes)
    );
    assert_eq!(st.num_ooms, 0);
    r.free(b, 0);
    r.finish();
}

/// The limit lowered below what the pool reserves: an allocation that the pool serves from its
/// free memory is not refused and does not synchronise, as in PyTorch (the limit is checked where
/// memory would be added). Here 40 MiB are reserved, 32 of them free, and the limit drops to
/// 32 MiB; a 16 MiB block fits the free memory. Failed when the check compared the device's
/// reserved total with the limit whatever the growth (a synchronisation and a trim first, and on a
/// real pool, whose trim releases only whole free chunks, an out-of-memory error).
#[test]
fn a_pool_serving_from_its_free_memory_is_not_refused_under_a_lowered_limit() {
    let r = rig_with(1, 256 * MIB, uncached_pool());
    let live = r.malloc(8 * MIB, 0, 1);
    let freed = r.malloc(32 * MIB, 0, 1);
    r.free(freed, 0);
    r.sim.complete_stream(0, s(1));
    r.device(0).set_memory_fraction(0.125).unwrap(); // 32 MiB, below the 40 MiB reserved
    let before = r.stats(0);
    let p = r.malloc(16 * MIB, 0, 2);
    let after = r.stats(0);
    assert_eq!(after.num_ooms, 0);
    assert_eq!(
        after.num_growth_syncs, before.num_growth_syncs,
        "synchronised"
    );
    assert_eq!(
        after.reserved_bytes,
        40 * MIB,
        "the pool grew or was trimmed"
    );
    r.free(p, 0);
    r.free(live, 0);
    r.finish();
}

/// Under the cap, the first way to room is a synchronisation: a 48 MiB block the cache gave back
/// on stream 1 is free pool memory once the device has caught up, and a 40 MiB block for stream 2
/// takes it. Nothing more is done: the other cached block stays, and nothing is trimmed (50 MiB
/// stay reserved). Failed without that step (the cache went back too), with a trim after a
/// synchronisation that had made room (40 MiB left reserved), and when the step was not counted
/// in `num_growth_syncs`.
#[test]
fn under_the_cap_a_synchronisation_makes_room_before_anything_else() {
    let r = rig_with(1, 256 * MIB, common::pool_config());
    r.device(0).set_memory_fraction(0.25).unwrap(); // 64 MiB
    let small = r.malloc(MIB / 2, 0, 1);
    let big = r.malloc(48 * MIB, 0, 1);
    r.free(small, 0);
    r.free(big, 0); // both cached on stream 1: 50 MiB reserved (a 2 MiB granule for the small one)
    let before = r.stats(0);
    let c = r.malloc(40 * MIB, 0, 2);
    let after = r.stats(0);
    assert_eq!(after.num_ooms, 0);
    assert_eq!(after.cached_bytes, MIB / 2, "the small block stays cached");
    assert_eq!(after.reserved_bytes, 50 * MIB, "nothing trimmed");
    assert_eq!(
        after.num_growth_syncs - before.num_growth_syncs,
        2,
        "one wait for the stream before growth, one synchronisation for the cap"
    );
    r.free(c, 0);
    r.finish();
}

/// Under the cap, a CUDA pool's growth is checked as the pool grows: by its granule (2 MiB), not
/// by the bytes the block lacks. With 2 MiB reserved and a 3 MiB limit, a 1 MiB block that needs
/// the small pool to grow would take it to 4 MiB: out of memory, and the pool is not asked. Failed
/// when the growth was checked unrounded (the pool grew past the limit and the block went back).
#[test]
fn under_the_cap_a_pool_growth_is_checked_by_its_granule() {
    let r = rig_with(1, 256 * MIB, uncached_pool());
    let live = r.malloc(2 * MIB, 0, 1);
    let device = r.device(0);
    device.set_memory_fraction(3.0 / 256.0).unwrap();
    assert_eq!(r.stats(0).memory_limit_bytes, 3 * MIB);
    let calls = r.sim.calls("cuMemAllocFromPoolAsync");
    let refused = r.alloc.malloc(MIB, 0, s(1));
    assert!(matches!(refused, Err(Error::OutOfMemory(_))), "{refused:?}");
    assert_eq!(
        r.sim.calls("cuMemAllocFromPoolAsync"),
        calls,
        "the pool was asked to grow past the limit"
    );
    assert_eq!(r.stats(0).reserved_bytes, 2 * MIB);
    r.free(live, 0);
    r.finish();
}

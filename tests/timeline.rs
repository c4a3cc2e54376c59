//! The memory timeline (`record_history`) and the block listing behind `dump_snapshot`.

mod common;
use common::*;
use streampool::history::{StreampoolBlockState as State, StreampoolEventKind as Kind};

fn kinds(rig: &Rig) -> Vec<u32> {
    rig.alloc
        .history(usize::MAX)
        .0
        .iter()
        .map(|e| e.kind)
        .collect()
}

fn k(kinds: &[Kind]) -> Vec<u32> {
    kinds.iter().map(|&k| k as u32).collect()
}

#[test]
fn nothing_is_recorded_until_asked() {
    let rig = rig(64 * MIB);
    let p = rig.malloc(MIB, 0, 1);
    rig.free(p, 0);
    assert!(kinds(&rig).is_empty());
    rig.finish();
}

#[test]
fn records_allocations_pool_traffic_growth_and_trims_with_gauges() {
    let rig = rig_with(2, 64 * MIB, common::pool_config());
    rig.alloc.record_history(true, 1000).unwrap();
    let p = rig.malloc(MIB - 100, 0, 1);
    rig.free(p, 0);
    let q = rig.malloc(MIB - 100, 0, 1); // from the cache
    assert_eq!(p, q);
    rig.free(q, 0);
    rig.alloc.empty_cache().unwrap();
    let expected = [
        Kind::PoolGrow,
        Kind::PoolAlloc,
        Kind::Alloc,
        Kind::Free,
        Kind::Alloc,
        Kind::Free,
        Kind::PoolFree,
        Kind::PoolTrim,
    ];
    assert_eq!(kinds(&rig), k(&expected));
    let (events, dropped) = rig.alloc.history(usize::MAX);
    assert_eq!(dropped, 0);
    let [grow, pool_alloc, alloc, free, _, _, pool_free, trim] = events[..] else {
        panic!("{events:?}")
    };
    assert_eq!((grow.bytes, grow.reserved_bytes), (2 * MIB, 2 * MIB));
    assert_eq!((pool_alloc.address, pool_alloc.bytes), (p.0, MIB));
    assert_eq!(
        (alloc.address, alloc.bytes, alloc.stream),
        (p.0, MIB - 100, 1)
    );
    assert_eq!((alloc.allocated_bytes, alloc.held_bytes), (MIB - 100, MIB));
    assert_eq!((free.allocated_bytes, free.cached_bytes), (0, 0));
    assert_eq!((pool_free.address, pool_free.held_bytes), (p.0, 0));
    assert_eq!((trim.bytes, trim.reserved_bytes), (2 * MIB, 0));
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert!(events.iter().all(|e| e.device == 0));
    rig.finish();
}

#[test]
fn out_of_memory_is_recorded_and_a_full_ring_keeps_the_newest() {
    let rig = rig(64 * MIB);
    rig.alloc.record_history(true, 2).unwrap();
    let p = rig.malloc(MIB, 1, 0);
    assert!(rig.alloc.malloc(1 << 40, 1, s(0)).is_err());
    let (events, dropped) = rig.alloc.history(usize::MAX);
    assert_eq!(dropped, 2); // PoolGrow, PoolAlloc, Alloc, Oom: the ring of 2 keeps the last two
    assert_eq!(
        events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        k(&[Kind::Alloc, Kind::Oom])
    );
    assert_eq!((events[1].bytes, events[1].device), (1 << 40, 1));
    assert_eq!(events[1].address, 64 * MIB - 2 * MIB, "device_free");
    rig.alloc.record_history(false, 0).unwrap();
    rig.free(p, 1);
    assert_eq!(
        rig.alloc.history(usize::MAX).0.len(),
        2,
        "stopped, and kept"
    );
    assert!(rig.alloc.record_history(true, 0).is_err());
    rig.finish();
}

/// On the pool backend, which caches blocks (the vmm backend caches none).
#[test]
fn blocks_list_live_cached_and_waiting_blocks() {
    let rig = pool_rig(64 * MIB);
    let live = rig.malloc(1000, 0, 1);
    let cached = rig.malloc(4096, 0, 1);
    let waiting = rig.malloc(8192, 0, 1);
    rig.free(cached, 0);
    rig.alloc.record_stream(waiting, s(2)).unwrap();
    rig.free(waiting, 0);
    let mut blocks = rig.alloc.device(0).unwrap().blocks();
    blocks.sort_by_key(|b| b.block_bytes);
    let summary: Vec<_> = blocks
        .iter()
        .map(|b| {
            (
                b.address,
                b.block_bytes,
                b.requested_bytes,
                b.state,
                b.stream,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (live.0, 1024, 1000, State::Live as u32, 1),
            (cached.0, 4096, 0, State::Inactive as u32, 1),
            (waiting.0, 8192, 8192, State::WaitingForStreams as u32, 1),
        ]
    );
    assert!(rig.alloc.device(1).unwrap().blocks().is_empty());
    assert!(rig.alloc.device(2).map(|dev| dev.blocks()).is_err());
    rig.free(live, 0);
    rig.finish();
}

#[test]
fn the_timeline_is_per_allocator_and_survives_concurrent_use() {
    let rig = rig_with(2, 256 * MIB, common::base_config());
    rig.alloc.record_history(true, 1_000_000).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let alloc = &rig.alloc;
            scope.spawn(move || {
                for i in 0..500u64 {
                    let p = alloc
                        .malloc(512 * (1 + i % 7), (t % 2) as i64, s(t))
                        .unwrap();
                    alloc.free(p, (t % 2) as i64).unwrap();
                }
            });
        }
    });
    let (events, _) = rig.alloc.history(usize::MAX);
    let count = |kind: Kind| events.iter().filter(|e| e.kind == kind as u32).count();
    assert_eq!((count(Kind::Alloc), count(Kind::Free)), (2000, 2000));
    rig.finish();
}

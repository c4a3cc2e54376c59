//! The idle release on the CUDA pool backend, over a simulated driver whose pools learn of a
//! completed free only at a synchronisation, as the real driver's do: each device gives its memory
//! back on its own once it has been idle for `STREAMPOOL_IDLE_RELEASE`, without the program
//! calling or synchronising anything.

mod common;
use common::*;
use std::time::{Duration, Instant};
use streampool::Config;

/// Device 1 goes idle while device 0 stays busy: device 1 gives back the memory of a block freed
/// after the program's last synchronisation, device 0 keeps its own.
#[test]
fn an_idle_device_gives_back_pool_memory_freed_after_the_last_synchronisation() {
    let r = idle_rig(2, 512 * MIB);
    for device in 0..2 {
        let block = r.malloc(64 * MIB, device, 0);
        r.free(block, device);
    }
    r.sim.complete_all(); // the GPU finished the work; nobody synchronised
    within_30_s(|| {
        let busy = r.malloc(64 * MIB, 0, 0); // device 0 stays busy
        r.free(busy, 0);
        r.stats(1).reserved_bytes < 64 * MIB
    });
    let (idle, busy) = (r.stats(1), r.stats(0));
    assert_eq!(
        idle.reserved_bytes, 0,
        "device 1 kept its pool memory while idle"
    );
    assert_eq!(idle.num_idle_releases, 1);
    assert!(
        busy.reserved_bytes >= 64 * MIB,
        "busy device 0 gave its memory back ({} B)",
        busy.reserved_bytes
    );
    r.finish();
}

/// While PyTorch routes allocations to a graph pool (it does so before it begins a capture that
/// streampool cannot see yet), the idle release does not synchronise: a synchronisation would
/// break the capture. It does once the route has ended, in the same idle period.
#[test]
fn the_idle_release_does_not_synchronise_while_a_graph_pool_route_is_open() {
    let r = idle_rig(1, 256 * MIB);
    let pool = (1, 7);
    r.device(0).graph_pools().create_or_incref(pool).unwrap();
    r.device(0)
        .graph_pools()
        .begin_allocate_to_pool(pool, std::sync::Arc::new(NoStream))
        .unwrap();
    let block = r.malloc(64 * MIB, 0, 0);
    r.free(block, 0);
    r.sim.complete_all();
    let before = r.sim.calls("cuCtxSynchronize");
    wait_for_the_idle_release(&r);
    assert_eq!(r.stats(0).num_idle_releases, 1);
    assert_eq!(
        r.sim.calls("cuCtxSynchronize"),
        before,
        "synchronised during a route"
    );
    assert!(r.stats(0).reserved_bytes >= 64 * MIB);
    r.device(0)
        .graph_pools()
        .end_allocate_to_pool(pool)
        .unwrap();
    r.device(0).graph_pools().release_pool(pool).unwrap();
    assert!(
        released_within_30_s(&r, 0),
        "the synchronisation put off during the route never came"
    );
    assert_eq!(r.stats(0).num_idle_releases, 1, "one idle period");
    r.finish();
}

/// A block that waited for another stream's work at the idle period's first try (which
/// synchronised for another block) goes back at a later try: that try synchronises again, since
/// the pool learns of its free only then.
#[test]
fn a_block_handed_back_after_the_first_try_is_released_too() {
    let r = idle_rig(1, 256 * MIB);
    let plain = r.malloc(64 * MIB, 0, 1);
    let shared = r.malloc(64 * MIB, 0, 1);
    r.alloc.record_stream(shared, s(2)).unwrap();
    r.free(plain, 0);
    r.free(shared, 0); // waits for stream 2's work
    assert!(
        released_within_30_s(&r, 0),
        "a block handed back late stayed reserved"
    );
    assert_eq!(r.stats(0).num_idle_releases, 1, "one idle period");
    r.finish();
}

/// A device that holds nothing beyond its live blocks has nothing to give back: its idle release
/// does not block on a synchronisation.
#[test]
fn an_idle_device_with_only_live_blocks_does_not_synchronise() {
    let r = idle_rig(1, 256 * MIB);
    let live = r.malloc(64 * MIB, 0, 1);
    let before = r.sim.calls("cuCtxSynchronize");
    wait_for_the_idle_release(&r);
    assert_eq!(r.stats(0).num_idle_releases, 1);
    assert_eq!(r.sim.calls("cuCtxSynchronize"), before);
    r.free(live, 0);
    r.finish();
}

/// `devices` simulated devices of `memory_bytes` whose pools apply frees at a synchronisation,
/// on the pool backend with the background thread and an idle release after 50 ms.
fn idle_rig(devices: usize, memory_bytes: u64) -> Rig {
    let config = Config {
        background: true,
        idle_release_ms: Some(50),
        ..pool_config()
    };
    let r = rig_with(devices, memory_bytes, config);
    for device in 0..devices {
        r.sim.pools_apply_frees_at_sync(device);
    }
    r
}

/// Runs `done` every 10 ms until it says true, for 30 s at most; its last answer.
fn within_30_s(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

fn released_within_30_s(r: &Rig, device: i64) -> bool {
    within_30_s(|| r.stats(device).reserved_bytes == 0)
}

/// Waits for device 0's first idle release, then 200 ms more (for a synchronisation it might make).
fn wait_for_the_idle_release(r: &Rig) {
    within_30_s(|| r.stats(0).num_idle_releases > 0);
    std::thread::sleep(Duration::from_millis(200));
}

struct NoStream;

impl streampool::StreamFilter for NoStream {
    fn claims(&self, _stream: streampool::driver::Stream) -> bool {
        false
    }
}

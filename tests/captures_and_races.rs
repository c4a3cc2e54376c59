//! Races with `empty_cache` and captures, found by a review of the restructured device pipeline
//! and the vmm backend; each test failed before its fix (simulated driver).
//!
//! A `Hooked` driver (tests/common/hooked.rs) wraps the simulator to interleave calls and count
//! queries.

#[path = "common/forward.rs"]
#[macro_use]
mod forward;
#[path = "common/hooked.rs"]
mod hooked;

use hooked::Hooked;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use streampool::config::Backend;
use streampool::driver::sim::{SimDriver, SimFault};
use streampool::driver::*;
use streampool::history::StreampoolBlockState;
use streampool::units::SizeSpec;
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);
const CAPTURING: Stream = Stream(9);

fn waiting(alloc: &Allocator, ptr: DevicePtr) -> bool {
    alloc
        .device(0)
        .unwrap()
        .blocks()
        .iter()
        .any(|b| b.address == ptr.0 && b.state == StreampoolBlockState::WaitingForStreams as u32)
}

const BLOCK_BYTES: u64 = 8 * MIB;

/// A hooked simulator, an allocator on it, and a block of BLOCK_BYTES allocated on S1 and
/// recorded on S2.
fn hooked_block_recorded_on_s2() -> (Arc<Hooked>, Arc<Allocator>, DevicePtr) {
    let h = Hooked::new(SimDriver::new(1, 1 << 30));
    let alloc = Arc::new(
        Allocator::new(
            h.clone() as Arc<dyn Driver>,
            Config {
                backend: streampool::config::Backend::Pool,
                background: false,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let a = alloc.malloc(BLOCK_BYTES, 0, S1).unwrap();
    alloc.record_stream(a, S2).unwrap();
    (h, alloc, a)
}

/// Was: `flush` (empty_cache) treats every waiting block as free after its device
/// synchronisation — also blocks that `free` added to the waits *after* that synchronisation,
/// whose events on the recorded streams have not completed. Such a block goes home at once and
/// its allocation stream can get it back while the recorded stream still uses it.
#[test]
fn empty_cache_does_not_release_a_block_freed_during_its_synchronisation() {
    let (h, alloc, a) = hooked_block_recorded_on_s2();
    let bytes = BLOCK_BYTES;

    // Another thread, right after empty_cache's synchronisation: S2 gets work on `a`, then `a`
    // is freed (it must now wait for S2).
    let (al, sim) = (Arc::clone(&alloc), Arc::clone(&h.sim));
    h.push_sync_hook(
        false,
        Box::new(move || {
            sim.touch(0, 0, a, bytes, S2).unwrap();
            al.free(a, 0).unwrap();
        }),
    );
    // Just before empty_cache's second synchronisation (S2's work on `a` still runs): where is `a`?
    let seen: Arc<Mutex<Option<(bool, DevicePtr)>>> = Arc::new(Mutex::new(None));
    let (al, out) = (Arc::clone(&alloc), Arc::clone(&seen));
    h.push_sync_hook(
        true,
        Box::new(move || {
            let still_waiting = waiting(&al, a);
            let again = al.malloc(bytes, 0, S1).unwrap();
            *out.lock().unwrap() = Some((still_waiting, again));
        }),
    );
    alloc.empty_cache().unwrap();
    let (still_waiting, again) = seen.lock().unwrap().take().expect("both hooks ran");
    alloc.free(again, 0).unwrap();
    eprintln!("still waiting: {still_waiting}; handed out again on S1: {again:#x} (a = {a:#x})");
    assert!(
        still_waiting,
        "{a:#x} left the waits although S2's work on it had not completed"
    );
    assert_ne!(
        again, a,
        "{a:#x} was handed out again while S2 still uses it"
    );
}

/// A block that got neither an event nor a device synchronisation at its free waits without
/// events ("deferred"). If empty_cache cannot record its events either, its own synchronisation
/// still makes the block free: that empty_cache hands it back.
#[test]
fn empty_cache_returns_a_block_that_waited_without_events_before_its_synchronisation() {
    let sim = Arc::new(SimDriver::new(1, 1 << 30));
    let alloc = Allocator::new(
        sim.clone() as Arc<dyn Driver>,
        Config {
            backend: streampool::config::Backend::Pool,
            background: false,
            ..Config::default()
        },
    )
    .unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    alloc.record_stream(a, S2).unwrap();
    sim.touch(0, 0, a, 8 * MIB, S2).unwrap();
    // At the free and again when empty_cache retries; the free's fallback wait fails too.
    sim.inject_fault(SimFault::EventRecord, 2);
    sim.inject_fault(SimFault::Synchronize, 1);
    alloc.free(a, 0).unwrap_err();
    assert!(waiting(&alloc, a), "{a:#x} waits without events");
    alloc.empty_cache().unwrap();
    assert!(
        !sim.take_injected(SimFault::EventRecord),
        "empty_cache tried to record the block's events again"
    );
    assert!(!waiting(&alloc, a), "{a:#x} still waits after empty_cache");
    let stats = alloc.device(0).unwrap().stats().unwrap();
    assert_eq!(stats.pool_used_bytes, 0, "the block is back in its pool");
}

/// The same kind of block, freed by another thread right after empty_cache's synchronisation
/// (its stream's work came after it): that empty_cache must keep it waiting.
#[test]
fn empty_cache_keeps_a_block_that_began_to_wait_without_events_after_its_synchronisation() {
    let (h, alloc, a) = hooked_block_recorded_on_s2();
    let bytes = BLOCK_BYTES;
    let (al, sim) = (Arc::clone(&alloc), Arc::clone(&h.sim));
    h.push_sync_hook(
        false,
        Box::new(move || {
            sim.touch(0, 0, a, bytes, S2).unwrap();
            sim.inject_fault(SimFault::EventRecord, 1);
            sim.inject_fault(SimFault::Synchronize, 1);
            al.free(a, 0).unwrap_err(); // no event, no wait: it waits without events
        }),
    );
    alloc.empty_cache().unwrap();
    assert!(
        waiting(&alloc, a),
        "{a:#x} left the waits although S2's work on it came after the synchronisation"
    );
    h.sim.complete_all();
    alloc.empty_cache().unwrap();
    assert!(!waiting(&alloc, a), "the next empty_cache hands it back");
}

fn vmm(release_threshold: SizeSpec) -> Config {
    Config {
        backend: Backend::Vmm,
        release_threshold,
        background: false,
        ..Config::default()
    }
}

/// The same with the device's background thread, which applies the threshold to memory unused
/// for `VMM_RELEASE_AFTER_MS` (the tests stop the simulator's clock and move it past that).
fn vmm_tended(release_threshold: SizeSpec) -> Config {
    Config {
        background: true,
        ..vmm(release_threshold)
    }
}

/// Waits (up to 30 s, at once when done) for the background thread to release everything.
fn released_in_the_background(sim: &SimDriver) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sim.physical_bytes(0) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    sim.physical_bytes(0) == 0
}

/// Was: a block that the driver's pool served because a capture elsewhere kept the VMM
/// resource from mapping (`Home::Driver`) ignored record_stream: `free` sent it straight back
/// with cuMemFreeAsync on its allocation stream, without waiting for the recorded streams. The
/// resource now maps during a capture (in relaxed mode); its block waits all the same.
#[test]
fn a_block_mapped_during_a_capture_waits_for_its_recorded_streams() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, vmm(SizeSpec::Max)).unwrap();
    sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(4 * MIB, 0, CAPTURING).unwrap(); // the capture is known now
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    assert!(!sim.is_driver_memory(0, a), "served by the vmm resource");
    assert_eq!(sim.calls("unsafe during capture"), 0);
    alloc.record_stream(a, S2).unwrap();
    sim.touch(0, 0, a, 8 * MIB, S2).unwrap(); // S2 uses it, not completed
    alloc.free(a, 0).unwrap();
    let ok = waiting(&alloc, a);
    alloc.free(graph, 0).unwrap();
    sim.end_capture(0, CAPTURING);
    assert!(
        ok,
        "{a:#x} went back to the driver although S2 has not finished with it"
    );
}

/// Was: while a capture is known on the device, the device layer queries no event (waits.rs),
/// but the VMM resource does: a free of a large block on another stream records a fence and polls
/// the fence queues (cuEventQuery), which a global-mode capture forbids.
#[test]
fn no_event_query_during_a_known_capture_on_a_vmm_free() {
    let h = Hooked::new(SimDriver::new(1, 256 * MIB));
    let alloc = Allocator::new(h.clone() as Arc<dyn Driver>, vmm(SizeSpec::Max)).unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    h.sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(4 * MIB, 0, CAPTURING).unwrap(); // the capture is known now
    h.counting.store(true, Ordering::SeqCst);
    alloc.free(a, 0).unwrap(); // a tensor from before the capture, freed inside it
    h.counting.store(false, Ordering::SeqCst);
    alloc.free(graph, 0).unwrap();
    h.sim.end_capture(0, CAPTURING);
    assert_eq!(
        h.queries.load(Ordering::SeqCst),
        0,
        "cuEventQuery called during a capture"
    );
}

/// Was: the background releaser keeps polling fences (cuEventQuery) every 10 ms during a
/// capture the device knows of; under a global-mode capture that invalidates it.
#[test]
fn the_releaser_queries_no_event_during_a_known_capture() {
    let h = Hooked::new(SimDriver::new(1, 256 * MIB));
    let alloc =
        Allocator::new(h.clone() as Arc<dyn Driver>, vmm_tended(SizeSpec::Bytes(0))).unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    h.sim.touch(0, 0, a, 8 * MIB, S1).unwrap(); // S1 still works on it when it is freed
    alloc.free(a, 0).unwrap(); // above the threshold, waiting for S1: the releaser starts
    h.sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(4 * MIB, 0, CAPTURING).unwrap(); // the capture is known now
    h.counting.store(true, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(200));
    h.counting.store(false, Ordering::SeqCst);
    alloc.free(graph, 0).unwrap();
    h.sim.end_capture(0, CAPTURING);
    h.sim.complete_all();
    assert_eq!(
        h.releaser_queries.load(Ordering::SeqCst),
        0,
        "the releaser called cuEventQuery during a capture"
    );
}

/// Was: while a capture is known, blocks the VMM resource could not map came from the driver's
/// pool as `Home::Driver`, which `held_bytes` did not count: ordinary (non-graph) allocations on
/// other streams then bypassed the set_per_process_memory_fraction cap. (The resource now maps
/// them itself, within the cap.)
#[test]
fn the_memory_fraction_caps_eager_blocks_during_a_capture() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, vmm(SizeSpec::Max)).unwrap();
    alloc
        .device(0)
        .unwrap()
        .set_memory_fraction(1.0 / 16.0)
        .unwrap(); // 16 MiB
    sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(2 * MIB, 0, CAPTURING).unwrap();
    let a = alloc.malloc(12 * MIB, 0, S1).unwrap();
    let b = alloc.malloc(12 * MIB, 0, S2);
    let over = b.is_ok();
    alloc.free(a, 0).unwrap();
    if let Ok(b) = b {
        alloc.free(b, 0).unwrap();
    }
    alloc.free(graph, 0).unwrap();
    sim.end_capture(0, CAPTURING);
    assert!(!over, "24 MiB of eager blocks held under a 16 MiB cap");
}

/// Was: the end of a capture reaches the VMM resource (`set_capturing(false)`) only from
/// `collect_waits`, i.e. at the device's next allocation or flush; frees alone never clear it.
/// Until then the resource neither unmaps nor releases, and the releaser polls every 10 ms.
#[test]
fn memory_above_the_threshold_is_released_after_a_capture_ends_without_another_allocation() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    sim.stop_clock();
    let config = vmm_tended(SizeSpec::Bytes(0));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config.clone()).unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(2 * MIB, 0, CAPTURING).unwrap();
    alloc.free(graph, 0).unwrap();
    sim.end_capture(0, CAPTURING);
    alloc.free(a, 0).unwrap();
    sim.complete_all();
    sim.advance_clock_ms(streampool::config::VMM_RELEASE_AFTER_MS);
    assert!(
        released_in_the_background(&sim),
        "memory above a threshold of 0 still held after the GPU finished and it went cold"
    );
}

/// Control for the test above: the same without the capture passes.
#[test]
fn control_memory_above_the_threshold_is_released_without_a_capture() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    sim.stop_clock();
    let config = vmm_tended(SizeSpec::Bytes(0));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config.clone()).unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    alloc.free(a, 0).unwrap();
    sim.complete_all();
    sim.advance_clock_ms(streampool::config::VMM_RELEASE_AFTER_MS);
    assert!(released_in_the_background(&sim));
}

/// vmm: a block used and freed on a stream after `empty_cache`'s synchronisation (too soon after
/// the stream's last fence to get one of its own), and the stream destroyed, all before the trim
/// that follows the synchronisation: its work may still run, so its page goes back only after a
/// synchronisation that began once the destroyed stream was seen. Was: the trim took every
/// pending fence of a destroyed stream as complete (the strict simulator panics at the unmap of a
/// page still in use).
#[test]
fn a_stream_destroyed_between_empty_cache_s_synchronisation_and_its_trim_keeps_its_page_until_done()
{
    let h = Hooked::new(SimDriver::new(1, 256 * MIB).strict());
    h.sim.stop_clock(); // one fence per stream at most: the second free gets none
    let alloc = Arc::new(Allocator::new(h.clone() as Arc<dyn Driver>, vmm(SizeSpec::Max)).unwrap());
    let first = alloc.malloc(8 * MIB, 0, S2).unwrap();
    alloc.free(first, 0).unwrap(); // records S2's fence
    let block = alloc.malloc(8 * MIB, 0, S2).unwrap();
    let (sim, freeing) = (Arc::clone(&h.sim), Arc::clone(&alloc));
    // empty_cache synchronises before it returns the cache, and again before the trims.
    h.push_sync_hook(false, Box::new(|| {}));
    h.push_sync_hook(
        false,
        Box::new(move || {
            sim.touch(0, 0, block, 8 * MIB, S2).unwrap(); // work queued on S2, unfinished
            freeing.free(block, 0).unwrap();
            sim.destroy_stream(0, S2);
        }),
    );
    alloc.empty_cache().unwrap();
    assert_eq!(
        h.sim.physical_bytes(0),
        0,
        "the page went back after the work"
    );
}

/// An allocation on the legacy default stream (PyTorch's default stream), which CUDA never
/// captures, asks the driver nothing about captures; one on another stream asks about its own
/// stream, and gets graph memory while it captures. On both backends.
#[test]
fn an_allocation_on_the_legacy_stream_asks_the_driver_nothing_about_captures() {
    for backend in [Backend::Pool, Backend::Vmm] {
        let h = Hooked::new(SimDriver::new(1, 256 * MIB));
        let config = Config {
            backend,
            background: false,
            ..Config::default()
        };
        let alloc = Allocator::new(h.clone() as Arc<dyn Driver>, config).unwrap();
        let queried = || std::mem::take(&mut *h.capture_queries.lock().unwrap());
        let a = alloc.malloc(MIB, 0, Stream::LEGACY).unwrap();
        assert_eq!(
            queried(),
            [],
            "{backend:?}: an allocation on the legacy stream"
        );
        let b = alloc.malloc(MIB, 0, S1).unwrap();
        assert_eq!(queried(), [S1], "{backend:?}: an allocation on S1");
        h.sim.begin_capture(0, CAPTURING);
        let g = alloc.malloc(MIB, 0, CAPTURING).unwrap();
        assert_eq!(
            queried(),
            [CAPTURING],
            "{backend:?}: an allocation on a capturing stream"
        );
        assert!(
            h.sim.is_driver_memory(0, g),
            "{backend:?}: graph memory while it captures"
        );
        let c = alloc.malloc(MIB, 0, Stream::LEGACY).unwrap();
        // (The device may ask whether the capture it knows of goes on; never about LEGACY.)
        let asked = queried();
        assert!(
            !asked.contains(&Stream::LEGACY),
            "{backend:?}: asked {asked:?}"
        );
        assert!(
            !h.sim.is_driver_memory(0, c),
            "{backend:?}: not graph memory"
        );
        for p in [a, b, g, c] {
            alloc.free(p, 0).unwrap();
        }
        h.sim.end_capture(0, CAPTURING);
    }
}

/// Was: a block used on another stream (`record_stream`) and freed while that stream captures a
/// graph the device had not seen allocate yet (PyTorch opens a route to the graph's pool, begins
/// the capture, and allocates in it after) got its event recorded on the capturing stream — a
/// node of the graph, not a mark of the work queued before it. Now, while a route is open, the
/// capture becomes known at the free, and the event is recorded once the capture has ended.
#[test]
fn a_block_freed_as_its_other_stream_begins_a_capture_gets_its_event_after_the_capture() {
    let sim = Arc::new(SimDriver::new(1, 1 << 30));
    let config = Config {
        background: false,
        ..Config::default()
    };
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    let a = alloc.malloc(BLOCK_BYTES, 0, S1).unwrap();
    alloc.record_stream(a, S2).unwrap();
    let pools = alloc.device(0).unwrap().graph_pools();
    pools
        .begin_allocate_to_pool((0, 1), Arc::new(EveryStream))
        .unwrap();
    sim.begin_capture(0, S2);
    let recorded = sim.calls("cuEventRecord");
    alloc.free(a, 0).unwrap();
    assert_eq!(
        sim.calls("cuEventRecord"),
        recorded,
        "an event was recorded into the capture"
    );
    assert!(
        waiting(&alloc, a),
        "the block went on without waiting for S2"
    );
    sim.end_capture(0, S2);
    // The next allocation looks at the waits: the capture has ended, the event is recorded.
    let b = alloc.malloc(4096, 0, S1).unwrap();
    assert!(
        sim.calls("cuEventRecord") > recorded,
        "no event recorded after the capture"
    );
    assert!(
        waiting(&alloc, a),
        "S2's work on the block has not completed"
    );
    alloc.free(b, 0).unwrap();
    pools.end_allocate_to_pool((0, 1)).unwrap();
}

/// Claims every allocation (PyTorch's NULL filter).
struct EveryStream;

impl streampool::StreamFilter for EveryStream {
    fn claims(&self, _: Stream) -> bool {
        true
    }
}

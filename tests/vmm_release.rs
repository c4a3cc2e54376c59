//! The virtual-memory backend's memory going back, through the whole allocator on a strict
//! simulator (tests/common/vmm.rs): in the background (cold memory above the threshold, an idle
//! device, a block freed during a capture), at a synchronisation above the release threshold,
//! and at a trim; and a device without virtual memory management, on the pool backend.

mod common;
use common::vmm::*;
use streampool::driver::sim::{SimDriver, SimFault};
use streampool::driver::Stream;
use streampool::units::SizeSpec;
use streampool::Config;

/// Whether the device's mapped memory drops to 0 within 30 s (at once when right), with no call
/// into streampool, while the GPU keeps up (the simulator completes work only when told: every
/// 5 ms, all of it, the fences included).
fn released_in_the_background(sim: &SimDriver) -> bool {
    released_down_to(sim, 0)
}

/// Whether device 0's physical memory fell to `bytes` or less within 30 s, streams completing.
fn released_down_to(sim: &SimDriver, bytes: u64) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(30) {
        sim.complete_all();
        if sim.physical_bytes(0) <= bytes {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

/// The device's background thread on, idle release after 100 ms.
fn tended(config: Config) -> Config {
    Config {
        background: true,
        idle_release_ms: Some(100),
        ..config
    }
}

/// Above the release threshold, memory unused for `VMM_RELEASE_AFTER_MS` goes back from the
/// background thread, without another call (the device is not idle: its idle release is off).
#[test]
fn above_the_threshold_cold_memory_goes_back_in_the_background() {
    let config = Config {
        release_threshold: SizeSpec::Bytes(0),
        idle_release_ms: None,
        ..tended(vmm_config())
    };
    let r = rig_with(1, 256 * MIB, config);
    r.sim.stop_clock();
    let a = r.malloc(8 * MIB, 0, S1); // S1's work on it has not completed
    r.alloc.free(a, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    r.sim.complete_all();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(r.sim.physical_bytes(0), 8 * MIB, "not cold yet");
    r.sim
        .advance_clock_ms(streampool::config::VMM_RELEASE_AFTER_MS);
    assert!(
        released_in_the_background(&r.sim),
        "still mapped 30 s after it went cold"
    );
    r.finish();
}

/// With the default threshold (keep everything), an idle device gives back all it does not use:
/// its cache, and every idle page, once its streams are done.
#[test]
fn an_idle_device_gives_back_its_cache_and_idle_pages_in_the_background() {
    let r = rig_with(1, 256 * MIB, tended(vmm_config()));
    let live = r.malloc(4096, 0, S1);
    let a = r.malloc(8 * MIB, 0, S1);
    let cached = r.malloc(64 * 1024, 0, S1);
    r.alloc.free(a, 0).unwrap();
    r.alloc.free(cached, 0).unwrap();
    released_down_to(&r.sim, PAGE);
    let st = r.stats();
    assert_eq!(
        (r.sim.physical_bytes(0), st.cached_bytes),
        (PAGE, 0),
        "down to the page of the live block"
    );
    assert_eq!(st.num_idle_releases, 1);
    r.alloc.free(live, 0).unwrap();
    r.finish();
}

/// The same for a block freed during a capture: it waits for the capture's end, and is
/// released after it, again without another call.
#[test]
fn a_block_freed_during_a_capture_goes_back_after_the_capture_in_the_background() {
    let r = rig_with(1, 256 * MIB, tended(vmm_config()));
    let capturing = Stream(9);
    let a = r.malloc(8 * MIB, 0, S1);
    r.sim.complete_all();
    r.sim.begin_capture(0, capturing);
    let graph = r.alloc.malloc(2 * MIB, 0, capturing).unwrap(); // the capture is known now
    r.alloc.free(a, 0).unwrap(); // waits for the capture's end
    r.alloc.free(graph, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        r.sim.physical_bytes(0),
        8 * MIB,
        "nothing released during the capture"
    );
    r.sim.end_capture(0, capturing);
    assert!(
        released_in_the_background(&r.sim),
        "still mapped 30 s after the capture"
    );
    r.finish();
}

/// A trim keeps what it is asked to keep, spare handles included: handles left over from a
/// failed mapping are released only down to `keep` bytes.
#[test]
fn a_trim_releases_spare_handles_down_to_what_it_keeps_and_no_further() {
    let pages_only = Config {
        vmm_span_bytes: Some(0),
        ..vmm_config()
    };
    let r = rig_with(1, 256 * MIB, pages_only);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    r.alloc.malloc(4 * MIB, 0, S1).unwrap_err(); // two pages made, unmapped again: two spares
    assert_eq!(
        r.stats().reserved_bytes,
        4 * MIB,
        "the spares count as reserved"
    );
    r.device(0).trim(4 * MIB).unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        4 * MIB,
        "already at what the trim keeps"
    );
    r.device(0).trim(2 * MIB).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 2 * MIB);
    r.finish();
}

/// A device without virtual memory management serves from CUDA pools instead (one logged line),
/// while the others map pages: `STREAMPOOL_BACKEND=vmm` never makes such a device unusable, and
/// its cache keeps blocks of every size as the pool backend's does. Failed when the vmm resource
/// refused to be created there (every allocation on the device an error).
#[test]
fn a_device_without_virtual_memory_management_uses_the_pool_backend() {
    let r = rig_with(2, 256 * MIB, vmm_config());
    r.sim.set_vmm_unsupported(1);
    let on_vmm = r.alloc.malloc(8 * MIB, 0, S1).unwrap();
    let on_pool = r.alloc.malloc(8 * MIB, 1, S1).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 8 * MIB);
    assert_eq!(r.sim.physical_bytes(1), 0, "device 1 mapped pages");
    assert!(!r.sim.pool_infos(1).is_empty(), "device 1 has no pool");
    r.alloc.free(on_pool, 1).unwrap();
    assert_eq!(
        r.device(1).stats().unwrap().cached_bytes,
        8 * MIB,
        "an 8 MiB block is cached on the pool backend"
    );
    r.alloc.free(on_vmm, 0).unwrap();
    r.finish();
}

/// A release threshold on the vmm backend means what it means for a CUDA pool (and PyTorch):
/// memory above it goes back at the program's synchronisation (`streampool_synchronized`, which
/// torch.cuda.synchronize() calls under install()), the coldest pages first; without one nothing
/// goes back and the call does not synchronise (what was freed only becomes ready for every
/// stream: tests in src/resource/vmm).
#[test]
fn memory_above_the_release_threshold_goes_back_at_a_synchronisation_the_coldest_first() {
    let r = rig();
    r.sim.stop_clock();
    let cold = r.malloc(4 * MIB, 0, S1);
    let hot = r.malloc(4 * MIB, 0, S1);
    let live = r.malloc(2 * MIB, 0, S1);
    r.alloc.free(cold, 0).unwrap();
    r.sim.advance_clock_ms(50);
    r.alloc.free(hot, 0).unwrap();
    let physical = r.sim.physical_bytes(0);
    let syncs = r.sim.calls("cuCtxSynchronize");
    r.device(0).synchronized().unwrap();
    assert_eq!(r.sim.physical_bytes(0), physical, "no threshold: nothing");
    assert_eq!(
        r.sim.calls("cuCtxSynchronize"),
        syncs,
        "and no synchronisation"
    );
    // 4 MiB above the live block's: the hot block's pages stay.
    r.device(0).set_release_threshold(6 * MIB).unwrap();
    r.device(0).synchronized().unwrap();
    assert_eq!(r.sim.physical_bytes(0), 6 * MIB);
    let again = r.malloc(4 * MIB, 0, S1);
    assert_eq!(again, hot, "the hot pages stayed mapped");
    assert_eq!(r.sim.physical_bytes(0), 6 * MIB);
    r.alloc.free(again, 0).unwrap();
    r.device(0).set_release_threshold(0).unwrap();
    r.device(0).synchronized().unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        2 * MIB,
        "threshold 0: all but the live block"
    );
    r.alloc.free(live, 0).unwrap();
    r.finish();
}

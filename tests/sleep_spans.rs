//! Sleep and wake of spans (one physical handle for several pages) on the vmm backend, on the
//! strict simulated driver: a block on a span sleeps and wakes with its contents, wake maps a run
//! of slept pages as one handle, and a copy or a wait that fails puts a span back to sleep whole
//! (the simulator refuses to unmap part of a mapping, or memory a copy still writes).

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;
use streampool::driver::sim::SimFault;
use streampool::driver::DevicePtr;

/// A span sleeps as its pages: unmapped and released whole, mapped again at wake, contents kept.
#[test]
fn a_block_on_a_span_sleeps_and_wakes_with_its_contents() {
    let r = vmm_rig_with_spans(256 * MIB, 32 * MIB);
    let a = r.malloc(20 * MIB, 0, 1); // one span of ten pages
    let gone = r.malloc(6 * MIB, 0, 1);
    r.free(gone, 0);
    fill(&r, a, 20 * MIB, 7);
    let held = r.sim.physical_bytes(0);
    assert_eq!(r.device(0).sleep(1, &[]).unwrap(), held);
    assert_eq!(r.sim.physical_bytes(0), 0);
    assert_eq!(r.sim.calls("cuMemRelease"), 2, "a release a span");
    assert_eq!(r.device(0).wake().unwrap(), 20 * MIB);
    assert!(holds(&r, a, 20 * MIB, 7));
    r.free(a, 0);
    r.finish();
}

#[test]
fn a_copy_that_fails_into_a_span_at_wake_puts_the_whole_span_back_to_sleep() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(8 * MIB, 0, 1);
    fill(&r, a, 8 * MIB, 7);
    r.device(0).sleep(1, &[]).unwrap();
    let (creates, releases) = (r.sim.calls("cuMemCreate"), r.sim.calls("cuMemRelease"));
    r.sim.inject_fault(SimFault::Copy, 1);
    assert!(r.device(0).wake().is_err());
    assert_eq!(
        r.device(0).sleeping_bytes(),
        8 * MIB,
        "all four pages sleep on"
    );
    assert_eq!(r.sim.physical_bytes(0), 0, "the span released, not kept");
    assert_eq!(
        (
            r.sim.calls("cuMemCreate") - creates,
            r.sim.calls("cuMemRelease") - releases
        ),
        (1, 1)
    );
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 8 * MIB, 7), "restored from the buffer");
    r.free(a, 0);
    r.finish();
}

#[test]
fn a_copy_that_fails_part_way_into_a_span_waits_for_the_copies_before_and_puts_it_to_sleep() {
    let (r, [a, kv, b]) = asleep_with_a_discarded_block_between("span_copy_kv", [1, 2]);
    // One run of six pages, one handle at wake: a's copy back is queued, b's fails. The span
    // goes back to sleep whole once a's copy is done (the strict driver refuses to unmap memory
    // a copy still writes).
    r.sim.inject_fault_after(SimFault::Copy, 1, 1);
    assert!(r.device(0).wake().is_err());
    assert_eq!(r.device(0).sleeping_bytes(), 12 * MIB);
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 4 * MIB, 1) && holds(&r, b, 4 * MIB, 2));
    r.free(a, 0);
    r.free(kv, 0);
    r.free(b, 0);
    r.finish();
}

#[test]
fn a_failed_wait_at_wake_puts_a_span_back_to_sleep_whole() {
    let (r, [a, kv, b]) = asleep_with_a_discarded_block_between("span_wait_kv", [3, 4]);
    // One handle for the six pages; the copies back (a's and b's, not the discarded pages')
    // cannot be waited for: all six sleep on, none half-unmapped.
    r.sim.inject_fault(SimFault::StreamSynchronize, 1);
    assert!(r.device(0).wake().is_err());
    assert_eq!(r.device(0).sleeping_bytes(), 12 * MIB);
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 4 * MIB, 3) && holds(&r, b, 4 * MIB, 4));
    r.free(a, 0);
    r.free(kv, 0);
    r.free(b, 0);
    r.finish();
}

/// Three adjacent blocks of 4 MiB, the outer two filled with `seeds`, the middle one allocated
/// under `tag`, asleep at level 1 discarding `tag`: one run of six pages, two stretches to copy.
fn asleep_with_a_discarded_block_between(tag: &str, seeds: [u8; 2]) -> (Rig, [DevicePtr; 3]) {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    let kv = tagged(&r, Some(tag), 4 * MIB);
    let b = r.malloc(4 * MIB, 0, 1);
    assert!(kv.0 == a.0 + 4 * MIB && b.0 == kv.0 + 4 * MIB, "adjacent");
    fill(&r, a, 4 * MIB, seeds[0]);
    fill(&r, b, 4 * MIB, seeds[1]);
    r.device(0).sleep(1, &[tag]).unwrap();
    (r, [a, kv, b])
}

/// Every handle wake creates is counted in `num_mem_creates`, as growth's are: the simulator's
/// count of create calls and the statistics agree after a wake (none is refused here).
#[test]
fn the_handles_a_wake_creates_are_counted_as_creates() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(8 * MIB, 0, 1);
    fill(&r, a, 8 * MIB, 3);
    r.device(0).sleep(1, &[]).unwrap();
    let before = r.stats(0).num_mem_creates;
    assert_eq!(before, r.sim.calls("cuMemCreate"));
    r.device(0).wake().unwrap();
    assert!(
        r.sim.calls("cuMemCreate") > before,
        "the wake created handles"
    );
    assert_eq!(r.stats(0).num_mem_creates, r.sim.calls("cuMemCreate"));
    assert!(holds(&r, a, 8 * MIB, 3));
    r.free(a, 0);
    r.finish();
}

/// Memory a program maps again after a wake comes in spans, as after `empty_cache()`: the idle
/// memory of the next step goes back at the next sleep in a few handles, not one a page. Also
/// where pages move (here: idle pages cold after 10 ms), whose memory comes a page a handle
/// otherwise.
#[test]
fn memory_mapped_again_after_a_wake_comes_in_spans() {
    let config = streampool::Config {
        backend: streampool::config::Backend::Vmm,
        vmm_cold_after_ms: 10,
        ..base_config()
    };
    let r = rig_with(1, 256 * MIB, config);
    let a = r.malloc(4 * MIB, 0, 1);
    let step = r.malloc(24 * MIB, 0, 1);
    r.free(step, 0);
    assert_eq!(
        r.sim.calls("cuMemCreate"),
        14,
        "a page a handle before any memory went back"
    );
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    let woken = r.sim.calls("cuMemCreate");
    let step = r.malloc(24 * MIB, 0, 1);
    assert_eq!(
        r.sim.calls("cuMemCreate") - woken,
        1,
        "the step's memory in one span"
    );
    r.free(step, 0);
    let releases = r.sim.calls("cuMemRelease");
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(
        r.sim.calls("cuMemRelease") - releases,
        2,
        "a's two pages, restored by the wake as one handle, and the step's span"
    );
    r.free(a, 0);
    r.finish();
}

/// After a wake, memory comes back in spans only up to what the sleep gave back, not up to the
/// most the process ever held: memory mapped ahead of a block never holds more than before.
#[test]
fn after_a_wake_no_more_is_mapped_than_the_sleep_gave_back() {
    let config = streampool::Config {
        backend: streampool::config::Backend::Vmm,
        background: true,
        idle_release_ms: Some(100),
        ..base_config()
    };
    let r = rig_with(1, 256 * MIB, config);
    let big = r.malloc(200 * MIB, 0, 1);
    r.free(big, 0);
    // The idle release gives the 200 MiB back, from the background thread.
    let start = std::time::Instant::now();
    while r.sim.physical_bytes(0) > 0 && start.elapsed() < std::time::Duration::from_secs(30) {
        r.sim.complete_all();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(r.sim.physical_bytes(0), 0, "given back while idle");
    let a = r.malloc(4 * MIB, 0, 1);
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    let step = r.malloc(24 * MIB, 0, 1);
    assert_eq!(
        r.sim.physical_bytes(0),
        28 * MIB,
        "a and the step: nothing mapped ahead past the 4 MiB the sleep gave back"
    );
    r.free(step, 0);
    r.free(a, 0);
    r.finish();
}

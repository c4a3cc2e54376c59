//! The virtual-memory resource over a strict simulator, which checks every mapping rule: blocks
//! are touched (used by "kernels") on their streams, so an early unmap or a missing access is a
//! panic, and dropping leaks nothing.

use super::*;
use crate::config::{Settings, VmmSpec};
use crate::driver::sim::{SimDriver, SimFault};
use crate::driver::StreamDriver;
use crate::history::History;
use crate::resource::{Accessible, CaptureNotice, ReleaseThreshold, Resource, Statistics};
use std::sync::atomic::AtomicU64;

const PAGE: u64 = 2 << 20;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

struct Rig {
    sim: Arc<SimDriver>,
    vmm: Arc<VmmResource>,
}

/// The vmm settings of a device of `memory_bytes` with `settings`.
fn spec(settings: Settings, memory_bytes: u64) -> VmmSpec {
    settings.for_device(memory_bytes).sources.vmm
}

fn rig_with(devices: usize, memory_bytes: u64, threshold: &str) -> Rig {
    let settings = Settings::with_variables(&[("STREAMPOOL_RELEASE_THRESHOLD", threshold)]);
    rig_spec(devices, memory_bytes, spec(settings, memory_bytes))
}

fn rig_spec(devices: usize, memory_bytes: u64, spec: VmmSpec) -> Rig {
    let sim = Arc::new(SimDriver::new(devices, memory_bytes).strict());
    let driver: Arc<dyn Driver> = sim.clone();
    let recorder = Arc::new(Recorder::new(0, Arc::new(History::default())));
    let settings = VmmSettings::resolve(&spec, driver.as_ref(), 0, memory_bytes).unwrap();
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let vmm = VmmResource::create(&driver, 0, &settings, memory_bytes, limit, recorder).unwrap();
    Rig { sim, vmm }
}

fn rig() -> Rig {
    rig_with(2, 64 * PAGE, "max")
}

/// As [`rig`], every handle one page (no spans): for the page-by-page paths (moves, lending,
/// spares).
fn rig_pages() -> Rig {
    let settings = Settings::with_variables(&[("STREAMPOOL_VMM_SPAN_SIZE", "0")]);
    rig_spec(2, 64 * PAGE, spec(settings, 64 * PAGE))
}

/// A rig whose growth moves memory before it grows past `percent` over the most in use.
fn rig_slack(percent: u64) -> Rig {
    let settings = Settings::with_variables(&[
        ("STREAMPOOL_VMM_GROWTH_SLACK", &format!("{percent}%")),
        ("STREAMPOOL_VMM_SPAN_SIZE", "0"),
    ]);
    rig_spec(2, 64 * PAGE, spec(settings, 64 * PAGE))
}

impl Rig {
    /// Stops the clock a second after the process's first reading of it: run alone, a test
    /// starts near 0, where every page would count as unused for a second already.
    fn stop_clock(&self) {
        self.sim.stop_clock();
        self.sim
            .advance_clock_ms(crate::config::VMM_RELEASE_AFTER_MS);
    }

    /// Allocates and uses the block on `stream`, as a kernel would.
    fn alloc(&self, bytes: u64, stream: Stream) -> DevicePtr {
        let ptr = self.vmm.allocate(bytes, stream).unwrap();
        self.sim.touch(0, 0, ptr, bytes, stream).unwrap();
        ptr
    }

    fn free(&self, ptr: DevicePtr, bytes: u64, stream: Stream) {
        self.vmm.deallocate(ptr, bytes, stream).unwrap();
    }

    fn physical(&self) -> u64 {
        self.sim.physical_bytes(0)
    }

    fn reserved(&self) -> u64 {
        self.vmm.usage().unwrap().reserved_bytes
    }
}

#[test]
fn a_freed_block_is_reused_at_once_by_its_stream_and_by_others_after_a_gpu_side_wait() {
    let r = rig();
    let a = r.alloc(3 * PAGE, S1);
    r.free(a, 3 * PAGE, S1);
    assert_eq!(r.alloc(3 * PAGE, S1), a, "same stream: at once");
    r.free(a, 3 * PAGE, S1);
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, 0);
    let b = r.alloc(3 * PAGE, S2);
    assert_eq!(
        b, a,
        "another stream: at once, after waiting for S1's fence on the GPU"
    );
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, 1);
    assert_eq!(r.physical(), 3 * PAGE, "nothing new mapped");
    // The wait is real: S2's work cannot complete before S1's free.
    let fence = r.sim.event_recorded_last(0).expect("S1's fence");
    assert!(!r.sim.event_query(0, fence).unwrap());
    r.sim.complete_stream(0, S2);
    assert!(
        r.sim.event_query(0, fence).unwrap(),
        "completing S2 completed S1"
    );
    r.free(b, 3 * PAGE, S2);
    r.sim.complete_all();
    let s3 = Stream(3);
    let c = r.alloc(6 * PAGE, s3);
    assert_eq!(
        c, a,
        "after the fences the block and its neighbour serve any stream"
    );
    assert_eq!(
        Statistics::driver_counts(&*r.vmm).stream_waits,
        1,
        "no wait once the fence is done"
    );
    r.free(c, 6 * PAGE, s3);
}

#[test]
fn neighbours_coalesce_so_a_larger_block_needs_no_new_memory() {
    let r = rig();
    let a = r.alloc(2 * PAGE, S1);
    let b = r.alloc(2 * PAGE, S1);
    assert_eq!(b, a.offset(2 * PAGE), "packed in one address range");
    let before = r.physical();
    r.free(a, 2 * PAGE, S1);
    r.free(b, 2 * PAGE, S1);
    let c = r.alloc(4 * PAGE, S1);
    assert_eq!((c, r.physical()), (a, before));
    r.free(c, 4 * PAGE, S1);
}

/// Four pages of one-page blocks, the first and third freed (their work done): two holes of a
/// page that no two-page block fits. The live second and fourth blocks.
fn two_holes(r: &Rig) -> (DevicePtr, DevicePtr) {
    let a = r.alloc(PAGE, S1);
    let b = r.alloc(PAGE, S1);
    let c = r.alloc(PAGE, S1);
    let e = r.alloc(PAGE, S1);
    r.free(a, PAGE, S1);
    r.free(c, PAGE, S1);
    r.sim.complete_all();
    (b, e)
}

#[test]
fn hot_holes_stay_mapped_and_the_device_grows_but_cold_holes_back_new_blocks() {
    let spec = VmmSpec {
        growth_slack_percent: None, // hot pages move only beyond the slack: none here
        cold_after_ms: 10,
        ..spec(Settings::default(), 64 * PAGE)
    };
    let cold_after_ms = spec.cold_after_ms;
    let r = rig_spec(2, 64 * PAGE, spec);
    r.stop_clock();
    let (b, e) = two_holes(&r);
    // Two free pages, not adjacent (b is live between them): a 2-page block cannot fit in
    // mapped memory. Just used, they are hot: a loop will want them again, so the device grows
    // instead of moving them (a move costs what a new page costs, and would come back).
    let before = r.physical();
    let d = r.alloc(2 * PAGE, S1);
    assert_eq!(r.physical(), before + 2 * PAGE, "grown, holes kept");
    assert_eq!(Statistics::driver_counts(&*r.vmm).moves, 0);
    r.free(d, 2 * PAGE, S1);
    r.sim.complete_all();
    // Unused for longer than STREAMPOOL_VMM_COLD_AFTER, idle pages are cold: they back a new
    // block before the device grows.
    let f = r.alloc(4 * PAGE, S1); // d's two pages and two more
    r.sim.advance_clock_ms(cold_after_ms + 1);
    r.free(f, 4 * PAGE, S1);
    let g = r.alloc(2 * PAGE, S1); // fits f's old range: no mapping at all
    r.free(g, 2 * PAGE, S1);
    r.sim.complete_all();
    let before = r.physical();
    let h = r.alloc(6 * PAGE, S1); // f's four pages and two more, backed by a's and c's
    assert_eq!(
        r.physical(),
        before,
        "no growth while cold memory sits idle"
    );
    assert!(
        Statistics::driver_counts(&*r.vmm).moves > 0,
        "cold pages moved"
    );
    assert_eq!(Statistics::driver_counts(&*r.vmm).moves, 2);
    for (ptr, bytes) in [(b, PAGE), (e, PAGE), (h, 6 * PAGE)] {
        r.free(ptr, bytes, S1);
    }
}

/// By default no page is ever cold and there is no growth slack: while the device has room, a
/// growth maps new memory and leaves idle pages where they are, however long unused (a page moved
/// in a busy step costs the allocating thread far more than a new one: the defaults' comments).
#[test]
fn by_default_idle_pages_stay_where_they_are_while_the_device_has_room() {
    let r = rig_spec(1, 64 * PAGE, spec(Settings::default(), 64 * PAGE));
    r.stop_clock();
    let (b, e) = two_holes(&r);
    r.sim.advance_clock_ms(3_600_000); // an hour unused
    let before = r.physical();
    let d = r.alloc(2 * PAGE, S1); // fits no mapped range: a's and c's pages are not adjacent
    assert_eq!(
        r.physical(),
        before + 2 * PAGE,
        "grown, the idle pages kept"
    );
    assert_eq!(Statistics::driver_counts(&*r.vmm).moves, 0);
    for (ptr, bytes) in [(b, PAGE), (e, PAGE), (d, 2 * PAGE)] {
        r.free(ptr, bytes, S1);
    }
}

#[test]
fn a_hole_still_in_use_is_not_unmapped() {
    let r = rig();
    let a = r.alloc(PAGE, S1);
    let b = r.alloc(PAGE, S1);
    r.free(a, PAGE, S1);
    // a's fence has not completed: a 2-page request on S2 must not take a's page away (the
    // strict simulator would panic on the unmap) and grows instead.
    let before = r.physical();
    let c = r.alloc(2 * PAGE, S2);
    assert_eq!(r.physical(), before + 2 * PAGE);
    r.free(b, PAGE, S1);
    r.free(c, 2 * PAGE, S2);
}

#[test]
fn above_the_threshold_cold_pages_go_back_when_tended_never_at_frees() {
    let r = rig_with(1, 64 * PAGE, &(2 * PAGE).to_string());
    r.stop_clock();
    let a = r.alloc(4 * PAGE, S1);
    // Live between a and b: b's range, freed on S2, would take a's ready pages in.
    let c = r.alloc(PAGE, S1);
    let b = r.alloc(PAGE, S2);
    r.free(a, 4 * PAGE, S1);
    r.sim.complete_stream(0, S1);
    r.free(b, PAGE, S2);
    assert_eq!(
        r.physical(),
        6 * PAGE,
        "nothing released on the allocating thread"
    );
    assert!(r.vmm.release_above_threshold(), "above the threshold");
    assert_eq!(
        r.physical(),
        6 * PAGE,
        "not cold yet: a loop may want it next step"
    );
    r.sim.advance_clock_ms(crate::config::VMM_RELEASE_AFTER_MS);
    assert!(!r.vmm.release_above_threshold(), "at the threshold now");
    assert_eq!(
        r.physical(),
        2 * PAGE,
        "a's cold pages released; c is live, b's fence is pending and it stays"
    );
    assert_eq!(r.reserved(), 2 * PAGE);
    r.free(c, PAGE, S1);
}

#[test]
fn an_idle_release_gives_back_every_idle_page_once_the_gpu_is_done() {
    let r = rig();
    let a = r.alloc(4 * PAGE, S1);
    let b = r.alloc(PAGE / 8, S1);
    r.free(a, 4 * PAGE, S1);
    assert!(
        r.vmm.release_idle(),
        "the fence is pending: look again later"
    );
    assert_eq!(r.physical(), 5 * PAGE, "memory the GPU may still use stays");
    r.sim.complete_stream(0, S1);
    assert!(!r.vmm.release_idle(), "nothing left for later");
    assert_eq!(r.physical(), PAGE, "all but the page under the live block");
    r.free(b, PAGE / 8, S1);
    r.sim.complete_all();
    r.vmm.release_idle();
    assert_eq!(r.physical(), 0);
}

#[test]
fn the_first_reservation_is_twice_the_device_memory() {
    let r = rig();
    let extents: Vec<(u64, u64)> = r.vmm.state.lock().large.extents().collect();
    assert_eq!(extents.len(), 1);
    assert_eq!(extents[0].1, 2 * 64 * PAGE);
}

#[test]
fn a_new_threshold_applies_at_the_next_look_not_on_the_calling_thread() {
    let r = rig();
    r.sim.stop_clock();
    let a = r.alloc(4 * PAGE, S1);
    r.free(a, 4 * PAGE, S1);
    r.sim.complete_stream(0, S1);
    r.sim.advance_clock_ms(crate::config::VMM_RELEASE_AFTER_MS);
    assert!(
        !r.vmm.release_above_threshold(),
        "the default threshold keeps everything"
    );
    ReleaseThreshold::set_release_threshold(&*r.vmm, 0).unwrap();
    assert_eq!(
        r.physical(),
        4 * PAGE,
        "setting it releases nothing by itself"
    );
    assert!(!r.vmm.release_above_threshold());
    assert_eq!(r.physical(), 0, "the next look does");
}

#[test]
fn trim_keeps_what_it_is_asked_to_and_drop_leaks_nothing() {
    let r = rig_pages();
    let a = r.alloc(6 * PAGE, S1);
    let b = r.alloc(PAGE, S2);
    r.free(a, 6 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.trim(2 * PAGE).unwrap();
    assert_eq!(r.physical(), 2 * PAGE, "b's page and one idle page");
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), PAGE, "b is live");
    r.free(b, PAGE, S2);
    // Dropping the rig drops the resource, then the strict simulator checks for leaks.
}

#[test]
fn peers_get_access_to_every_mapping_present_and_future() {
    let r = rig();
    let a = r.alloc(PAGE, S1);
    assert!(
        r.sim.touch(0, 1, a, PAGE, S1).is_err(),
        "no access before the grant"
    );
    r.vmm.grant_access(1).unwrap();
    r.sim.touch(0, 1, a, PAGE, S1).unwrap();
    let b = r.alloc(3 * PAGE, S1);
    r.sim.touch(0, 1, b, 3 * PAGE, S1).unwrap();
    assert!(r
        .sim
        .mappings(0)
        .iter()
        .all(|(_, _, access)| access == &[0, 1]));
    r.free(a, PAGE, S1);
    r.free(b, 3 * PAGE, S1);
}

#[test]
fn an_address_space_that_no_window_fits_gets_another_reservation() {
    // The resource believes the device has 2 pages: it reserves 4 pages of addresses.
    let sim = Arc::new(SimDriver::new(1, 64 * PAGE).strict());
    let driver: Arc<dyn Driver> = sim.clone();
    let recorder = Arc::new(Recorder::new(0, Arc::new(History::default())));
    let spec = spec(Settings::default(), 2 * PAGE);
    let settings = VmmSettings::resolve(&spec, driver.as_ref(), 0, 2 * PAGE).unwrap();
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let vmm = VmmResource::create(&driver, 0, &settings, 2 * PAGE, limit, recorder).unwrap();
    let r = Rig { sim, vmm };
    let blocks: Vec<DevicePtr> = (0..4).map(|_| r.alloc(PAGE, S1)).collect();
    r.free(blocks[0], PAGE, S1);
    r.free(blocks[2], PAGE, S1);
    r.sim.complete_all();
    // Free pages 0 and 2 with 1 and 3 live: no two adjacent free pages in the first reservation.
    let big = r.alloc(2 * PAGE, S1);
    assert!(
        big.0 > blocks[3].0 + PAGE,
        "served from a second reservation"
    );
    let e = r.vmm.allocate(3 * PAGE, S1).unwrap_err();
    assert!(
        e.is_device_oom(),
        "more than the device has fails at once: {e}"
    );
    r.free(big, 2 * PAGE, S1);
    r.free(blocks[1], PAGE, S1);
    r.free(blocks[3], PAGE, S1);
}

/// The idle release looks again while freed small blocks wait for their fences: first one of two
/// blocks on a carrier page (only the small-block ranges hold freed bytes), then the other (the
/// emptied carrier's page waits too). Failed when the freed bytes of the regions were multiplied
/// or subtracted instead of added (mutation testing).
#[test]
fn an_idle_release_looks_again_while_freed_small_blocks_wait_for_their_fences() {
    let r = rig();
    let a = r.alloc(PAGE / 8, S1);
    let b = r.alloc(PAGE / 8, S1);
    r.free(a, PAGE / 8, S1); // the carrier still holds b
    assert!(
        r.vmm.release_idle(),
        "a's fence is pending: look again later"
    );
    r.free(b, PAGE / 8, S1);
    assert!(
        r.vmm.release_idle(),
        "the emptied carrier's fence is pending"
    );
    r.sim.complete_all();
    assert!(!r.vmm.release_idle(), "nothing left for later");
    assert_eq!(r.physical(), 0);
}

mod capture;
mod carriers;
mod cycles;
mod donors;
mod export;
mod faults;
mod growth;
mod lending;
mod slabs;
mod sleep_buffer;
mod slot;
mod spans;
mod sync;

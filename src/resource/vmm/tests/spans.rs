//! Spans: one handle for a run of new pages, mapped, unmapped and released whole; never moved page
//! by page; given back whole where a growth needs room; on by default only while memory cycles
//! (given back at a synchronisation and mapped again).

use super::cycles::{cycles, step_then_trim_at_sync, trim_at_sync};
use super::*;
use crate::driver::{DeviceDriver, VmmDriver};

/// A rig whose new handles back up to `span_pages` pages each, without a growth slack (only
/// cold pages move before the device grows).
fn rig_spans(span_pages: u64) -> Rig {
    rig_spans_slack(span_pages, "off")
}

/// As [`rig_spans`], memory moved before the device grows past `slack` over the most in use
/// (`STREAMPOOL_VMM_GROWTH_SLACK`), and idle pages cold after 10 ms.
pub(super) fn rig_spans_slack(span_pages: u64, slack: &str) -> Rig {
    let settings = Settings::with_variables(&[
        ("STREAMPOOL_VMM_SPAN_SIZE", &(span_pages * PAGE).to_string()),
        ("STREAMPOOL_VMM_GROWTH_SLACK", slack),
        ("STREAMPOOL_VMM_COLD_AFTER", "10ms"),
    ]);
    rig_spec(1, 64 * PAGE, spec(settings, 64 * PAGE))
}

#[test]
fn a_run_of_new_pages_is_one_handle_and_goes_back_only_whole() {
    let r = rig_spans(8);
    let a = r.alloc(12 * PAGE, S1);
    assert_eq!(
        (r.sim.calls("cuMemCreate"), r.sim.calls("cuMemMap")),
        (2, 2),
        "12 pages: a span of 8 and one of 4"
    );
    assert_eq!(r.physical(), 12 * PAGE);
    assert_eq!(Statistics::driver_counts(&*r.vmm).maps, 12, "pages counted");
    r.free(a, 12 * PAGE, S1);
    r.sim.complete_all();
    // A block on part of one span keeps all of that span, and only that one.
    let b = r.alloc(2 * PAGE, S1);
    let spans = [(a.0, 8 * PAGE), (a.0 + 8 * PAGE, 4 * PAGE)];
    let under_b: u64 = (spans.iter())
        .filter(|&&(at, bytes)| at < b.0 + 2 * PAGE && b.0 < at + bytes)
        .map(|&(_, bytes)| bytes)
        .sum();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), under_b);
    assert_eq!(r.reserved(), under_b);
    r.sim.touch(0, 0, b, 2 * PAGE, S1).unwrap(); // still mapped, with access
    r.free(b, 2 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0);
    assert_eq!(
        r.sim.calls("cuMemRelease"),
        2,
        "one release a span, however many pages"
    );
}

#[test]
fn a_span_that_cannot_get_access_is_released_not_kept_as_spare_pages() {
    let r = rig_spans(8);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    assert!(r.vmm.allocate(4 * PAGE, S1).is_err());
    assert_eq!((r.physical(), r.reserved()), (0, 0));
    let a = r.alloc(4 * PAGE, S1);
    assert_eq!(r.physical(), 4 * PAGE);
    r.free(a, 4 * PAGE, S1);
}

#[test]
fn a_growth_beyond_the_slack_gives_a_whole_idle_span_back_instead_of_moving_its_pages() {
    let r = rig_spans_slack(8, "0%");
    r.stop_clock();
    let a = r.alloc(4 * PAGE, S1);
    let live = r.alloc(PAGE, S1);
    r.free(a, 4 * PAGE, S1);
    r.sim.complete_all();
    // Six pages fit no hole: beyond the slack, a's span goes back to the device (its pages
    // cannot move one by one) and the window is backed by new memory.
    let b = r.alloc(6 * PAGE, S1);
    let counts = Statistics::driver_counts(&*r.vmm);
    assert_eq!(counts.moves, 0, "no page of a span moved");
    assert_eq!(
        r.physical(),
        7 * PAGE,
        "a's span gone, b's six pages and the live one"
    );
    r.free(b, 6 * PAGE, S1);
    r.free(live, PAGE, S1);
}

#[test]
fn near_full_an_idle_span_goes_back_so_that_a_new_block_fits() {
    let spec = VmmSpec {
        headroom_bytes: 0,
        growth_slack_percent: None,
        span_max_bytes: Some(16 * PAGE),
        ..spec(Settings::default(), 64 * PAGE)
    };
    let r = rig_spec(1, 64 * PAGE, spec);
    r.stop_clock();
    let a = r.alloc(16 * PAGE, S1);
    let b = r.alloc(16 * PAGE, S1);
    r.free(a, 16 * PAGE, S1);
    r.sim.complete_all();
    // Another user takes all but 8 pages: 20 pages need a's idle span back first.
    let foreign = r.sim.mem_create(0, 24 * PAGE).unwrap();
    let c = r.alloc(20 * PAGE, S1);
    r.sim.touch(0, 0, c, 20 * PAGE, S1).unwrap();
    assert_eq!(r.physical(), 36 * PAGE + 24 * PAGE);
    assert_eq!(r.sim.mem_info(0).unwrap().free_bytes, 4 * PAGE);
    r.free(c, 20 * PAGE, S1);
    r.free(b, 16 * PAGE, S1);
    r.sim.mem_release(0, foreign).unwrap();
}

/// A span that could neither get access nor be unmapped stays blocked; the next look that can
/// unmap it puts it back whole (found by review: the look read the span's other pages after they
/// had left the page map, and panicked).
#[test]
fn a_blocked_span_is_unmapped_whole_at_the_next_look() {
    let r = rig_spans(8);
    r.sim.inject_fault(SimFault::SetAccess, 2);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    assert!(r.vmm.allocate(4 * PAGE, S1).is_err());
    assert_eq!(r.physical(), 4 * PAGE, "blocked, still mapped");
    r.vmm.trim(0).unwrap(); // access fails again, the unmap works: released
    assert_eq!(r.physical(), 0);
    let a = r.alloc(4 * PAGE, S1);
    r.free(a, 4 * PAGE, S1);
}

/// While a capture is known nothing is unmapped, not even an idle span a growth could use
/// (found by review).
#[test]
fn during_a_capture_a_growth_gives_no_span_back() {
    let r = rig_spans(8);
    r.stop_clock();
    let a = r.alloc(4 * PAGE, S1);
    let live = r.alloc(PAGE, S2);
    r.free(a, 4 * PAGE, S1);
    r.sim.complete_all();
    r.sim.advance_clock_ms(60_000); // a's span is cold
    let capturing = Stream(9);
    r.sim.begin_capture(0, capturing);
    CaptureNotice::capture_started(&*r.vmm, capturing);
    let (unmaps, releases) = (r.sim.calls("cuMemUnmap"), r.sim.calls("cuMemRelease"));
    let b = r.alloc(6 * PAGE, S1);
    assert_eq!(
        (r.sim.calls("cuMemUnmap"), r.sim.calls("cuMemRelease")),
        (unmaps, releases)
    );
    r.sim.end_capture(0, capturing);
    r.free(b, 6 * PAGE, S1);
    r.free(live, PAGE, S2);
}

/// After the device refuses a create, the growth reads the device's free memory again and
/// creates no more than that (found by review: after a refused span the growth went on trying a
/// span and a page for every page).
#[test]
fn after_the_device_refuses_a_span_the_growth_creates_only_what_is_free() {
    let spec = VmmSpec {
        headroom_bytes: 2 * PAGE,
        growth_slack_percent: None,
        span_max_bytes: Some(8 * PAGE),
        ..spec(Settings::default(), 64 * PAGE)
    };
    let r = rig_spec(1, 64 * PAGE, spec);
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    // Another user takes memory the resource's estimate does not know of: 7 pages stay free.
    let foreign = r.sim.mem_create(0, 56 * PAGE).unwrap();
    let before = r.sim.calls("cuMemCreate");
    assert!(r.vmm.allocate(8 * PAGE, S1).is_err());
    assert_eq!(
        r.sim.calls("cuMemCreate") - before,
        2,
        "a refused span, then one of the 5 pages free beyond the headroom"
    );
    assert_eq!(r.physical(), 57 * PAGE, "that span released again");
    r.free(a, PAGE, S1);
    r.sim.mem_release(0, foreign).unwrap();
}

/// While memory cycles, a large block's growth maps free memory after the block too, never
/// beyond the most held before the trim; the blocks that follow fit there, with no driver call.
#[test]
fn while_memory_cycles_a_growth_maps_ahead_for_the_blocks_that_follow() {
    let r = cycled();
    let (creates, maps) = (r.sim.calls("cuMemCreate"), r.sim.calls("cuMemMap"));
    let again: Vec<_> = (0..4).map(|_| r.alloc(3 * PAGE, S1)).collect();
    assert_eq!(
        (
            r.sim.calls("cuMemCreate") - creates,
            r.sim.calls("cuMemMap") - maps
        ),
        (2, 2),
        "for the four blocks: the first block's span and the one ahead of it"
    );
    assert_eq!(r.physical(), 12 * PAGE, "no more than was held before");
    for p in again {
        r.sim.touch(0, 0, p, 3 * PAGE, S1).unwrap();
        r.free(p, 3 * PAGE, S1);
    }
}

/// Where the device has no room for the span ahead, the block alone is mapped.
#[test]
fn while_memory_cycles_a_growth_without_room_ahead_maps_its_block_alone() {
    let spec = VmmSpec {
        headroom_bytes: 0,
        growth_slack_percent: None,
        ..spec(Settings::default(), 64 * PAGE)
    };
    let r = rig_spec(1, 64 * PAGE, spec);
    step_then_trim_at_sync(&r, 32);
    assert!(cycles(&r));
    // Another user takes all but 4 pages.
    let foreign = r.sim.mem_create(0, 60 * PAGE).unwrap();
    let b = r.alloc(4 * PAGE, S1);
    r.sim.touch(0, 0, b, 4 * PAGE, S1).unwrap();
    assert_eq!(
        r.physical(),
        64 * PAGE,
        "the block's 4 pages and the other user's 60"
    );
    r.free(b, 4 * PAGE, S1);
    r.sim.mem_release(0, foreign).unwrap();
}

/// Four blocks of 3 pages, freed and given back at the release threshold's trim at a
/// synchronisation: memory cycles, back to the 12 pages held.
fn cycled() -> Rig {
    let r = rig();
    let blocks: Vec<_> = (0..4).map(|_| r.alloc(3 * PAGE, S1)).collect();
    for p in blocks {
        r.free(p, 3 * PAGE, S1);
    }
    r.sim.complete_all();
    trim_at_sync(&r, 0);
    assert_eq!(r.physical(), 0, "given back at the synchronisation");
    assert!(cycles(&r));
    r
}

/// The memory mapped ahead of a block is a handle of its own: the block, live, does not hold it
/// past a trim (found by review: one span for both held all of it).
#[test]
fn a_live_block_does_not_hold_the_memory_mapped_ahead_of_it() {
    let r = cycled();
    let keep = r.alloc(3 * PAGE, S1);
    assert_eq!(r.physical(), 12 * PAGE, "mapped ahead");
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 3 * PAGE, "only the live block's pages stay");
    r.free(keep, 3 * PAGE, S1);
}

/// Memory ahead comes only from new handles within the budget: no idle page moves for it
/// (found by review: under a memory limit the tail moved a hot idle page).
#[test]
fn memory_ahead_moves_no_idle_page() {
    let r = rig();
    r.stop_clock();
    let a = r.alloc(2 * PAGE, S1);
    let live = r.alloc(PAGE, S1);
    let b = r.alloc(13 * PAGE, S1);
    r.free(a, 2 * PAGE, S1);
    r.free(b, 13 * PAGE, S1);
    r.sim.complete_all();
    trim_at_sync(&r, 8 * PAGE);
    assert!(cycles(&r));
    r.vmm.limit_bytes.store(10 * PAGE, Ordering::Relaxed);
    let moves = Statistics::driver_counts(&*r.vmm).moves;
    let c = r.alloc(6 * PAGE, S1);
    assert_eq!(Statistics::driver_counts(&*r.vmm).moves, moves);
    r.free(c, 6 * PAGE, S1);
    r.free(live, PAGE, S1);
}

/// Memory ahead lies only where the stream may map without waiting for another stream (found by
/// review: a window whose tail covered another stream's freed page made the stream wait for it).
#[test]
fn memory_ahead_makes_no_stream_wait_for_another() {
    let r = rig();
    r.stop_clock();
    let live = r.alloc(PAGE, S1);
    let a = r.alloc(3 * PAGE, S1);
    let z = r.alloc(PAGE, S2);
    let b = r.alloc(11 * PAGE, S1);
    assert_eq!(z.0, a.0 + 3 * PAGE);
    r.free(a, 3 * PAGE, S1);
    r.free(b, 11 * PAGE, S1);
    r.sim.advance_clock_ms(100);
    r.free(z, PAGE, S2);
    r.sim.complete_all();
    trim_at_sync(&r, 2 * PAGE);
    assert!(cycles(&r));
    // S2 takes its page again and frees it: freed on S2, its fence not complete.
    let z2 = r.alloc(PAGE, S2);
    assert_eq!(z2, z);
    r.free(z2, PAGE, S2);
    let waits = Statistics::driver_counts(&*r.vmm).stream_waits;
    let c = r.alloc(3 * PAGE, S1);
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, waits);
    r.free(c, 3 * PAGE, S1);
    r.free(live, PAGE, S1);
}

/// Memory ahead stays within the growth slack over the most in use: a carrier page held
/// beside the blocks does not let it grow past that.
#[test]
fn memory_ahead_stays_within_the_growth_slack() {
    let settings = Settings::with_variables(&[("STREAMPOOL_VMM_GROWTH_SLACK", "0%")]);
    let r = rig_spec(1, 64 * PAGE, spec(settings, 64 * PAGE));
    let small = r.alloc(64 << 10, S1);
    step_then_trim_at_sync(&r, 12);
    assert_eq!(r.physical(), PAGE, "the carrier page stays");
    assert!(cycles(&r));
    // 13 pages were held, 12 pages and 64 KiB the most in use: 11 pages of blocks fit beside
    // the carrier.
    let c = r.alloc(3 * PAGE, S1);
    assert_eq!(r.physical(), 12 * PAGE);
    r.free(c, 3 * PAGE, S1);
    r.free(small, 64 << 10, S1);
}

/// A trim that gives nothing back (a second synchronisation in a row) does not end the cycling:
/// the next step's growth still maps ahead (found on the GPU: a step ending in two
/// synchronisations grew the next one a page a handle).
#[test]
fn a_second_synchronisation_in_a_row_keeps_memory_cycling() {
    let r = cycled();
    trim_at_sync(&r, 0); // nothing left to give back
    r.vmm.trim(0).unwrap(); // nor here: an empty_cache() right after
    let creates = r.sim.calls("cuMemCreate");
    let again: Vec<_> = (0..4).map(|_| r.alloc(3 * PAGE, S1)).collect();
    assert_eq!(
        r.sim.calls("cuMemCreate") - creates,
        2,
        "the block and the memory ahead"
    );
    for p in again {
        r.free(p, 3 * PAGE, S1);
    }
}

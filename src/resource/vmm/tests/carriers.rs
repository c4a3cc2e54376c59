//! Where a new carrier of small blocks comes from: a hole of at most two pages between large
//! blocks before the carriers' region grows, and back to the large blocks once wholly free.

use super::*;
use crate::resource::contract::Rng;

/// 64 KiB: above the slabs' classes, so a small block carved out of a carrier of its own.
const SMALL: u64 = 64 << 10;

/// Large blocks `a`, a hole of `hole_pages` (freed, its fence completed), `b`: the layout
/// `[a][hole][b]`, all of it mapped; returns `(a, hole, b)`.
fn hole_between_blocks(r: &Rig, hole_pages: u64) -> (DevicePtr, DevicePtr, DevicePtr) {
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let hole = r.alloc(hole_pages * PAGE, S1);
    let b = r.alloc(PAGE, S1);
    assert_eq!((hole.0 - a.0, b.0 - hole.0), (PAGE, hole_pages * PAGE));
    r.free(hole, hole_pages * PAGE, S1);
    r.sim.complete_all();
    r.vmm
        .update_ranges(&mut r.vmm.state.lock(), Caller::Program);
    (a, hole, b)
}

/// A small block on `stream` maps a page of the carriers' region: none of `[avoid, avoid +
/// avoid_bytes)` is taken for it.
fn carriers_region_grows(r: &Rig, stream: Stream, avoid: DevicePtr, avoid_bytes: u64) {
    let mapped = r.physical();
    let s = r.alloc(SMALL, stream);
    assert_eq!(
        r.physical(),
        mapped + PAGE,
        "a page of the carriers' region"
    );
    assert!(s.0 + SMALL <= avoid.0 || s.0 >= avoid.0 + avoid_bytes);
}

#[test]
fn a_new_carrier_takes_a_page_of_a_two_page_hole_and_gives_it_back_to_the_large_blocks() {
    let r = rig_pages();
    let (a, hole, b) = hole_between_blocks(&r, 2);
    let mapped = r.physical();
    let s = r.alloc(SMALL, S1);
    assert_eq!(
        (r.physical(), s.0 >= hole.0 && s.0 < hole.0 + 2 * PAGE),
        (mapped, true),
        "the small block lies in the hole, nothing mapped"
    );
    r.free(s, SMALL, S1);
    r.sim.complete_all();
    // The carrier, wholly free, is the large blocks' again: the hole serves a block of its size.
    let again = r.alloc(2 * PAGE, S1);
    assert_eq!((again, r.physical()), (hole, mapped));
    for (p, bytes) in [(a, PAGE), (again, 2 * PAGE), (b, PAGE)] {
        r.free(p, bytes, S1);
    }
}

#[test]
fn a_hole_of_three_pages_stays_whole_and_the_carriers_region_grows() {
    let r = rig_pages();
    let (_, hole, _) = hole_between_blocks(&r, 3);
    carriers_region_grows(&r, S1, hole, 3 * PAGE);
    assert_eq!(r.alloc(3 * PAGE, S1), hole, "the hole is whole");
}

#[test]
fn free_pages_next_to_unmapped_ones_are_no_hole_a_carrier_takes() {
    let r = rig_pages();
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let tail = r.alloc(PAGE, S1);
    r.free(tail, PAGE, S1); // free, and followed by unmapped addresses: a growth extends it
    r.sim.complete_all();
    r.vmm
        .update_ranges(&mut r.vmm.state.lock(), Caller::Program);
    carriers_region_grows(&r, S1, tail, PAGE);
    r.free(a, PAGE, S1);
}

#[test]
fn a_hole_another_stream_freed_is_no_carrier_before_its_fence() {
    let r = rig_pages();
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let hole = r.alloc(2 * PAGE, S1);
    let b = r.alloc(PAGE, S1);
    r.free(hole, 2 * PAGE, S1); // its fence not completed: S2 may not use it yet
    carriers_region_grows(&r, S2, hole, 2 * PAGE);
    let _ = (a, b);
}

#[test]
fn free_pages_after_unmapped_ones_are_no_hole_a_carrier_takes() {
    let r = rig_pages();
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let h = r.alloc(PAGE, S1);
    let b = r.alloc(PAGE, S1);
    r.free(a, PAGE, S1);
    r.sim.complete_all(); // the device synchronises before it trims
    r.vmm.trim(0).unwrap(); // a's page unmapped: the range before h's is unmapped now
    r.free(h, PAGE, S1);
    r.sim.complete_all();
    r.vmm
        .update_ranges(&mut r.vmm.state.lock(), Caller::Program);
    carriers_region_grows(&r, S1, h, PAGE);
    r.free(b, PAGE, S1);
}

#[test]
fn a_hole_whose_pages_share_a_handle_with_others_is_no_carrier() {
    // Spans (the default): the hole's two pages are one handle; a carrier there would keep
    // both at a trim or a sleep.
    let r = rig();
    let (_, hole, _) = hole_between_blocks(&r, 2);
    carriers_region_grows(&r, S1, hole, 2 * PAGE);
}

#[test]
fn a_free_range_beside_another_free_range_is_no_hole() {
    // [a][h1: freed on S1][h2: freed on S2][b]: h1 and h2 stay apart (one waits for S1's
    // fence, the other for S2's), and together they are a run a three-page block will need.
    let r = rig_pages();
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let h1 = r.alloc(PAGE, S1);
    let h2 = r.alloc(2 * PAGE, S2);
    let b = r.alloc(PAGE, S1);
    assert_eq!((h2.0 - h1.0, b.0 - h2.0), (PAGE, 2 * PAGE));
    r.free(h2, 2 * PAGE, S2);
    r.free(h1, PAGE, S1);
    carriers_region_grows(&r, S1, h1, 3 * PAGE);
    let _ = (a, b);
}

#[test]
fn a_hole_ready_only_once_the_ranges_are_updated_serves_the_slow_path() {
    // The hole was freed on S2 and its work has completed, which the ranges learn only when
    // an allocation updates them: S1's fast path cannot use it, the slow path can.
    let r = rig_pages();
    r.stop_clock();
    let a = r.alloc(PAGE, S1);
    let hole = r.alloc(2 * PAGE, S2);
    let b = r.alloc(PAGE, S1);
    r.free(hole, 2 * PAGE, S2);
    r.sim.complete_all();
    let mapped = r.physical();
    let s = r.alloc(SMALL, S1);
    assert_eq!(
        (r.physical(), s.0 >= hole.0 && s.0 < hole.0 + 2 * PAGE),
        (mapped, true),
        "the small block lies in the hole, nothing mapped"
    );
    let _ = (a, b);
}

/// 768 KiB: small, and two of them leave a quarter of a page that a third can span.
const WIDE: u64 = 768 << 10;

#[test]
fn small_blocks_span_the_pages_of_adjacent_carriers() {
    let r = rig_pages();
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..5).map(|_| r.alloc(WIDE, S1)).collect();
    assert_eq!(
        blocks[2].0,
        blocks[0].0 + 2 * WIDE,
        "the third spans two pages"
    );
    assert_eq!(
        r.physical(),
        2 * PAGE,
        "five blocks in two pages, not three"
    );
    for &b in &blocks {
        r.free(b, WIDE, S1);
    }
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0, "every page went back");
    assert!(r.vmm.state.lock().small.snapshot().is_empty());
}

#[test]
fn a_whole_free_page_leaves_a_carrier_whose_other_pages_hold_blocks() {
    let r = rig_pages();
    r.stop_clock();
    // Seven blocks over three pages; the 3rd to the 6th, freed, leave the middle page free.
    let blocks: Vec<DevicePtr> = (0..7).map(|_| r.alloc(WIDE, S1)).collect();
    assert_eq!(r.physical(), 3 * PAGE);
    for &b in &blocks[2..6] {
        r.free(b, WIDE, S1);
    }
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 2 * PAGE, "the middle page went back");
    for &b in [blocks[0], blocks[1], blocks[6]].iter() {
        r.sim.touch(0, 0, b, WIDE, S1).unwrap(); // still mapped
    }
    // The pages around it are carriers still: a small block fits there (best fit: the last
    // page's free quarter), nothing mapped.
    let again = r.alloc(WIDE, S1);
    assert_eq!((again.0, r.physical()), (blocks[6].0 + WIDE, 2 * PAGE));
}

/// The carriers' invariants, over the whole state: every free-range table keeps its own; each
/// carrier's pages are mapped, in the region they came from (a hole's page alone); and no page
/// of a carrier is wholly free (it goes back to its region at once).
fn check_carriers(st: &VmmState) -> Result<(), String> {
    for (name, ranges) in [
        ("small", &st.small),
        ("large", &st.large),
        ("carriers", &st.carriers),
    ] {
        ranges
            .check_invariants()
            .map_err(|e| format!("{name}: {e}"))?;
    }
    let extents: Vec<(u64, u64)> = st.small.extents().collect();
    for &(base, bytes) in &extents {
        for page in (base..base + bytes).step_by(PAGE as usize) {
            let hole = st.hole_carriers.get(page).is_some();
            let region = st.pages.get(&page).map(|p| p.region);
            let want = if hole {
                Region::Large
            } else {
                Region::Carriers
            };
            if region != Some(want) || (hole && (base, bytes) != (page, PAGE)) {
                return Err(format!(
                    "page {page:#x} of carrier {base:#x}+{bytes:#x}: {region:?}"
                ));
            }
        }
    }
    for (start, bytes, state) in st.small.snapshot() {
        let base = extents
            .iter()
            .rev()
            .find(|(b, _)| *b <= start)
            .map_or(0, |e| e.0);
        let page = base + (start - base).div_ceil(PAGE) * PAGE;
        if page + PAGE <= start + bytes {
            return Err(format!(
                "page {page:#x} wholly free in a carrier ({state:?})"
            ));
        }
    }
    Ok(())
}

#[test]
fn a_page_freed_whole_by_two_fences_goes_back_from_its_carrier() {
    // Three pages of blocks; S2's frees end in the middle page, S1's on both sides of them. S2's
    // fence completes first, S1's next: the merges at that promotion take in the earlier ones,
    // and every page wholly free must still leave the carrier.
    const K: u64 = 1 << 10;
    let r = rig_pages();
    r.stop_clock();
    let s1_first = r.alloc(1024 * K, S1);
    let s2: Vec<_> = [512 * K, 512 * K, 952 * K]
        .map(|b| (r.alloc(b, S2), b))
        .into();
    let s1: Vec<_> = [548 * K, 548 * K, 904 * K]
        .map(|b| (r.alloc(b, S1), b))
        .into();
    let kept = [572 * K, 572 * K].map(|b| (r.alloc(b, S1), b));
    assert_eq!(r.physical(), 3 * PAGE);
    r.free(s1_first, 1024 * K, S1);
    for &(p, b) in &s2 {
        r.free(p, b, S2);
    }
    for &(p, b) in &s1 {
        r.free(p, b, S1);
    }
    r.vmm.return_slot(&mut r.vmm.state.lock());
    for stream in [S2, S1] {
        r.sim.complete_stream(0, stream);
        r.vmm
            .update_ranges(&mut r.vmm.state.lock(), Caller::Program);
        check_carriers(&r.vmm.state.lock()).unwrap();
    }
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), PAGE, "only the page the kept blocks lie on");
    for (p, b) in kept {
        r.free(p, b, S1);
    }
}

#[test]
fn carriers_keep_their_invariants_through_random_small_blocks_on_two_streams() {
    const K: u64 = 1 << 10;
    for seed in 1..40u64 {
        let r = rig_pages();
        r.stop_clock();
        let mut rng = Rng::new(seed * 7919 + 1);
        let mut live: Vec<(DevicePtr, u64, Stream)> = Vec::new();
        for step in 0..400 {
            let stream = rng.pick(&[S1, S2]);
            match rng.below(100) {
                op if op < 45 || live.is_empty() => {
                    let bytes = match rng.below(4) {
                        0 => (rng.below(32) as u64 + 1) * 512,
                        1 => (rng.below(2048) as u64 + 1) * 512,
                        2 => rng.pick(&[768 * K, 1024 * K, 640 * K, 900 * K]),
                        _ => (rng.below(64) as u64 + 1) * 16 * K,
                    };
                    live.push((r.alloc(bytes, stream), bytes, stream));
                }
                op if op < 85 => {
                    let (p, bytes, s) = live.swap_remove(rng.below(live.len()));
                    r.free(p, bytes, s);
                }
                op if op < 90 => r.sim.complete_stream(0, stream),
                op if op < 95 => r
                    .vmm
                    .update_ranges(&mut r.vmm.state.lock(), Caller::Program),
                _ => {
                    r.sim.complete_all();
                    r.vmm.trim(0).unwrap();
                }
            }
            let checked = check_carriers(&r.vmm.state.lock());
            checked.unwrap_or_else(|e| panic!("seed {seed}, step {step}: {e}"));
        }
        for (p, bytes, s) in live {
            r.free(p, bytes, s);
        }
        r.sim.complete_all();
        r.vmm.trim(0).unwrap();
        assert_eq!(r.physical(), 0, "seed {seed}: every page went back");
        assert!(r.vmm.state.lock().small.snapshot().is_empty());
    }
}

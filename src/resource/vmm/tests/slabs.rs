//! Slabs in the resource: the smallest blocks share slabs of their class on their stream, are
//! reused without the driver, never serve another stream before its fence, and go back — empty
//! slabs, then their carrier pages — when memory is released.

use super::*;
use crate::resource::vmm::slabs::{class_bytes, class_of, SLAB_MAX_BYTES};

#[test]
fn blocks_of_one_class_share_a_slab_and_its_slots_are_reused_without_the_driver() {
    let r = rig();
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..8).map(|_| r.alloc(1000, S1)).collect();
    for pair in blocks.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 1024, "next slot of the 1 KiB class");
    }
    assert_eq!(r.physical(), PAGE);
    let before = r.sim.calls("cuEventRecord") + r.sim.calls("cuStreamWaitEvent");
    for &b in &blocks[..4] {
        r.free(b, 1000, S1);
    }
    let again: Vec<DevicePtr> = (0..4).map(|_| r.alloc(1000, S1)).collect();
    let mut expected = blocks[..4].to_vec();
    expected.sort();
    let mut got = again.clone();
    got.sort();
    assert_eq!(got, expected, "the freed slots, on their stream");
    let after = r.sim.calls("cuEventRecord") + r.sim.calls("cuStreamWaitEvent");
    assert!(
        after <= before + 1,
        "at most the one fence a free may record"
    );
    for b in again.into_iter().chain(blocks[4..].iter().copied()) {
        r.free(b, 1000, S1);
    }
}

#[test]
fn a_slot_freed_on_one_stream_serves_that_stream_and_not_another() {
    let r = rig();
    let a = r.alloc(4096, S1);
    r.free(a, 4096, S1);
    // The slab is S1's: S2 gets a slot of a slab of its own (the strict simulator would panic on
    // S2 using memory S1's queued work still uses).
    let b = r.alloc(4096, S2);
    assert_ne!(b, a);
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, 0);
    r.free(b, 4096, S2);
    assert_eq!(r.alloc(4096, S1), a, "S1's slot, at once");
    r.free(a, 4096, S1);
}

#[test]
fn every_small_size_gets_a_block_of_its_own_and_a_trim_gives_every_page_back() {
    let r = rig();
    let mut live = Vec::new();
    for bytes in (512..=SLAB_MAX_BYTES).step_by(512).chain([1, 700, 4097]) {
        for stream in [S1, S2] {
            let p = r.alloc(bytes, stream);
            assert_eq!(p.0 % 512, 0);
            live.push((p, bytes, stream));
        }
    }
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|&(p, b, _)| (p.0, p.0 + class_bytes(class_of(b))))
        .collect();
    spans.sort();
    assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "no two blocks overlap"
    );
    for (p, bytes, stream) in live {
        r.free(p, bytes, stream);
    }
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0, "empty slabs and their carriers went back");
}

#[test]
fn a_stream_per_request_keeps_few_empty_slabs_and_the_idle_release_takes_them() {
    let r = rig();
    r.stop_clock();
    for s in (10..60).map(Stream) {
        let b = r.alloc(4096, s);
        r.free(b, 4096, s);
    }
    assert_eq!(r.physical(), PAGE, "fifty streams, one carrier page");
    r.sim.complete_all();
    r.vmm.release_idle();
    assert_eq!(r.physical(), 0);
}

#[test]
fn bad_frees_of_slots_are_refused_and_each_slot_is_handed_out_once() {
    let r = rig();
    let (a, b) = (r.alloc(2048, S1), r.alloc(2048, S1));
    for (ptr, bytes) in [(a.0 + 512, 2048), (a.0, 1024), (b.0 + 2048, 2048)] {
        assert!(r.vmm.deallocate(DevicePtr(ptr), bytes, S1).is_err());
    }
    r.free(a, 2048, S1);
    assert!(r.vmm.deallocate(a, 2048, S1).is_err(), "freed twice");
    r.free(b, 2048, S1); // a goes from the slot back to its slab, b into the slot
    let again: Vec<DevicePtr> = (0..3).map(|_| r.alloc(2048, S1)).collect();
    assert_eq!(
        (again[0], again[1]),
        (b, a),
        "the slot's block, then the slab's free slot"
    );
    assert!(
        again[2] != a && again[2] != b,
        "a third, not one of them twice"
    );
    for p in again {
        r.free(p, 2048, S1);
    }
}

#[test]
fn empty_slabs_go_back_before_a_large_block_maps_so_their_page_can_back_it() {
    // With a slack the emptied carrier's page backs the large block; by default (no slack, no
    // cold age) the device grows while it has room, and the slab stays for the next small block.
    for (r, pages, how) in [
        (rig_slack(1), 1, "the carrier's page backs the large block"),
        (rig_pages(), 2, "by default a new page, the carrier kept"),
    ] {
        r.stop_clock();
        let a = r.alloc(4096, S1);
        r.free(a, 4096, S1);
        r.sim.complete_all();
        let b = r.alloc(PAGE, S1);
        assert_eq!(r.physical(), pages * PAGE, "{how}");
        r.free(b, PAGE, S1);
    }
}

#[test]
fn empty_slabs_go_back_before_a_small_block_maps_a_new_carrier() {
    let r = rig();
    r.stop_clock();
    let half = PAGE / 2;
    let first = r.alloc(half, S1);
    let a = r.alloc(4096, S1);
    r.free(a, 4096, S1);
    // The slab (emptied, kept) lies in the carrier's second half: once it goes back, the second
    // half-page block fits there.
    let second = r.alloc(half, S1);
    assert_eq!(
        (second.0 - first.0, r.physical()),
        (half, PAGE),
        "one carrier"
    );
    r.free(first, half, S1);
    r.free(second, half, S1);
}

#[test]
fn a_slab_emptied_after_its_fence_completed_goes_back_ready_for_every_stream() {
    let r = rig();
    r.stop_clock();
    let a = r.alloc(4096, S1);
    r.free(a, 4096, S1);
    r.sim.complete_all();
    let vmm = &r.vmm;
    let mut st = vmm.state.lock();
    vmm.return_slot(&mut st); // the slab empties, kept, behind S1's fence
    vmm.update_ranges(&mut st, Caller::Program); // which has completed
    assert!(vmm.return_empty_slabs(&mut st));
    assert!(
        st.carriers.best_fit_page(S2).is_some(),
        "its carrier, wholly free, is a page S2 may use at once"
    );
}

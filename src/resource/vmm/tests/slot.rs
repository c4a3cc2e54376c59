//! The slot: the block freed last serves its stream's next request of its size without touching
//! the ranges or the driver, goes back to them before anything else looks at them, and goes back
//! ready if its fence completed meanwhile.

use super::*;

#[test]
fn a_block_freed_and_asked_for_again_asks_the_driver_nothing() {
    let r = rig();
    r.stop_clock();
    let a = r.alloc(3 * PAGE, S1);
    r.free(a, 3 * PAGE, S1);
    let calls = |r: &Rig| {
        [
            "cuEventRecord",
            "cuEventQuery",
            "cuStreamQuery",
            "cuStreamIsCapturing",
        ]
        .map(|c| r.sim.calls(c))
    };
    let before = calls(&r);
    for _ in 0..10 {
        let again = r.alloc(3 * PAGE, S1);
        assert_eq!(again, a);
        r.free(again, 3 * PAGE, S1);
    }
    assert_eq!(calls(&r), before, "no event, stream or capture call");
    // Another size, another stream: the slot's block goes back to the ranges first, and serves
    // them as freed memory does.
    let b = r.alloc(2 * PAGE, S1);
    assert_eq!(b, a, "the slot's block, back in its range, is the best fit");
    r.free(b, 2 * PAGE, S1);
    r.sim.complete_all();
    let c = r.alloc(3 * PAGE, S2);
    assert_eq!(
        (c, r.physical()),
        (a, 3 * PAGE),
        "nothing new mapped for S2"
    );
    r.free(c, 3 * PAGE, S2);
}

#[test]
fn the_slot_goes_back_before_a_trim_and_ready_if_its_fence_completed_meanwhile() {
    let r = rig();
    r.stop_clock();
    let a = r.alloc(2 * PAGE, S1);
    let live = r.alloc(PAGE, S1); // keeps b's range (freed on S2) from taking a's in
    let b = r.alloc(PAGE, S2);
    r.free(a, 2 * PAGE, S1); // in the slot; S1's fence recorded
    r.sim.complete_all();
    // b's free collects S1's completed fence while a is still in the slot; a goes back ready.
    r.free(b, PAGE, S2);
    assert!(r.vmm.release_idle(), "b waits for S2's fence");
    assert_eq!(
        r.physical(),
        2 * PAGE,
        "a's pages went back: nothing waits for S1"
    );
    r.free(live, PAGE, S1);
    r.sim.complete_all(); // the device synchronises before it trims
    r.vmm.trim(0).unwrap();
    assert_eq!(
        r.physical(),
        0,
        "the block in the slot at the trim went back too"
    );
}

#[test]
fn a_stream_per_request_takes_the_carrier_page_the_last_one_freed_behind_a_wait() {
    let r = rig();
    r.stop_clock();
    // Each request on a stream of its own: the small block of the one before (above the slabs'
    // classes) is back in its carrier, the carrier (empty) back among the pages, freed on that
    // stream, still in use.
    let bytes = 64 << 10;
    let mut streams = (10..20).map(Stream);
    let first = streams.next().unwrap();
    let a = r.alloc(bytes, first);
    r.free(a, bytes, first);
    for s in streams {
        let b = r.alloc(bytes, s);
        assert_eq!(b, a, "the same page, after a GPU-side wait");
        r.free(b, bytes, s);
    }
    assert_eq!(r.physical(), PAGE, "one page for all of them");
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, 9);
}

/// A GPU that keeps up with the program (a `torch.empty` + `del` loop queues no kernel): each
/// fence completes before the next free. A free records a fence at most once per interval all the
/// same — the stream's last record time outlives its completed fences (on an H200 a record at
/// every free cost 2 µs a pair).
#[test]
fn a_stream_whose_fences_complete_at_once_records_one_fence_per_interval() {
    for bytes in [64 << 10, 3 * PAGE] {
        let r = rig();
        r.stop_clock();
        r.sim.gpu_keeps_up(0);
        let before = r.sim.calls("cuEventRecord");
        for _ in 0..400 {
            let a = r.alloc(bytes, S1);
            r.free(a, bytes, S1);
            r.sim.advance_clock_us(5);
        }
        // 400 frees over 2 ms: the first records, then one per 1 ms interval.
        let records = r.sim.calls("cuEventRecord") - before;
        assert!(
            records <= 3,
            "{records} fences recorded for 400 frees of {bytes} B"
        );
    }
}

/// A sleep gives every page back: the slot's block goes back to its ranges first, so that after
/// the wake nothing hands out a block whose pages went with the sleep.
#[test]
fn the_slot_goes_back_before_a_sleep() {
    use crate::resource::Sleep;
    let r = rig();
    r.stop_clock();
    let a = r.alloc(2 * PAGE, S1);
    r.free(a, 2 * PAGE, S1);
    assert!(r.vmm.state.lock().slot.is_some(), "kept in the slot");
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap();
    assert!(r.vmm.state.lock().slot.is_none(), "nothing kept asleep");
    assert_eq!(r.physical(), 0);
    r.vmm.wake().unwrap();
    let b = r.alloc(2 * PAGE, S1);
    assert!(r.physical() >= 2 * PAGE, "mapped again for the request");
    r.free(b, 2 * PAGE, S1);
}

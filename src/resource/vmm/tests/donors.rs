//! Growth donors: the idle memory a growth may take before it creates more — a span only when
//! all its pages are idle and outside the growth's window, cold memory before new memory.

use super::spans::rig_spans_slack;
use super::*;

/// Two live blocks of `head_pages` and `tail_pages` that share one span (mapped for a block of
/// both sizes together, then freed).
fn head_and_tail(r: &Rig, head_pages: u64, tail_pages: u64) -> (DevicePtr, DevicePtr) {
    let a = r.alloc((head_pages + tail_pages) * PAGE, S1);
    r.free(a, (head_pages + tail_pages) * PAGE, S1);
    let head = r.alloc(head_pages * PAGE, S1);
    let tail = r.alloc(tail_pages * PAGE, S1);
    assert_eq!(
        (head, tail.0),
        (a, a.0 + head_pages * PAGE),
        "both inside a's span"
    );
    (head, tail)
}

/// A span goes back for a growth only when all its pages are idle: one whose first pages are
/// free but whose last ones hold a live block stays, whatever the growth needs.
#[test]
fn a_span_with_a_live_block_in_it_is_no_donor() {
    let r = rig_spans_slack(8, "0%");
    r.stop_clock();
    let (head, tail) = head_and_tail(&r, 6, 2);
    r.free(head, 6 * PAGE, S1);
    r.sim.complete_all();
    r.sim.advance_clock_ms(60_000); // the span's free pages are cold
    let b = r.alloc(10 * PAGE, S1);
    r.sim.touch(0, 0, tail, 2 * PAGE, S1).unwrap(); // still mapped
    assert_eq!(r.physical(), 18 * PAGE, "a's span kept, ten new pages");
    r.free(b, 10 * PAGE, S1);
    r.free(tail, 2 * PAGE, S1);
}

/// A cold idle span goes back before the device grows, even within the slack: memory the program
/// stopped using is reused first. A hot one stays for the next step, and so does one whose last
/// pages are hot (its first page alone does not say).
#[test]
fn a_cold_idle_span_goes_back_before_new_memory_a_hot_one_stays() {
    // (ms idle, the span's last half used just before the growth, pages then held)
    for (idle_ms, tail_hot, physical_pages) in
        [(60_000, false, 7), (0, false, 11), (60_000, true, 11)]
    {
        let r = rig_spans_slack(4, "1000%");
        r.stop_clock();
        let (head, tail) = head_and_tail(&r, 2, 2);
        let live = r.alloc(PAGE, S1);
        r.free(head, 2 * PAGE, S1);
        r.sim.complete_all();
        r.sim.advance_clock_ms(idle_ms);
        r.free(tail, 2 * PAGE, S1);
        r.sim.complete_all();
        if !tail_hot {
            // Freed as long ago as the head: the tail's pages as cold as the head's.
            r.sim.advance_clock_ms(idle_ms);
        }
        let b = r.alloc(6 * PAGE, S1);
        assert_eq!(
            r.physical(),
            physical_pages * PAGE,
            "a's span idle for {idle_ms} ms, its last half used since: {tail_hot}"
        );
        r.free(b, 6 * PAGE, S1);
        r.free(live, PAGE, S1);
    }
}

/// A span that begins outside a growth's window and reaches into it is part of the window's
/// memory, no donor: giving it back would unmap pages the new block lies on.
#[test]
fn a_span_reaching_into_the_growth_s_window_is_no_donor() {
    let r = rig_spans_slack(4, "1000%");
    r.stop_clock();
    let x = r.alloc(4 * PAGE, S1);
    let a = r.alloc(4 * PAGE, S1);
    let y = r.alloc(2 * PAGE, S1);
    let z = r.alloc(PAGE, S1);
    r.free(x, 4 * PAGE, S1);
    r.free(y, 2 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap(); // x's and y's spans go back: a lies between unmapped holes
    r.free(a, 4 * PAGE, S1);
    r.sim.complete_all();
    r.sim.advance_clock_ms(60_000); // a's span is cold
    let b = r.alloc(5 * PAGE, S1);
    r.sim.touch(0, 0, b, 5 * PAGE, S1).unwrap(); // every page of b mapped, with access
    assert_eq!(r.physical(), 7 * PAGE);
    r.free(b, 5 * PAGE, S1);
    r.free(z, PAGE, S1);
}

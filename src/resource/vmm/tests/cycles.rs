//! When memory cycles (given back and mapped again, so that new memory comes in spans and ahead of
//! large blocks): at once after the release threshold's trim at a synchronisation or a sleep, from
//! the second trim asked for since the device last idled, up to the most held before, until an
//! idle release.

use super::*;
use crate::resource::vmm::spans::GiveBack;

/// The release threshold's trim at a synchronisation, keeping `keep_bytes`: memory given back
/// there cycles at once.
pub(super) fn trim_at_sync(r: &Rig, keep_bytes: u64) {
    r.vmm
        .trim_after_sync(keep_bytes, GiveBack::Threshold)
        .unwrap();
}

/// True while memory cycles: new memory comes in spans.
pub(super) fn cycles(r: &Rig) -> bool {
    r.vmm.span_max_pages(&r.vmm.state.lock()) > 1
}

fn cycle_back_to_pages(r: &Rig) -> u64 {
    r.vmm.state.lock().cycle_back_to_bytes / PAGE
}

/// As [`rig`], with idle pages cold after 10 ms: pages move to where they are needed, so that
/// outside a cycle every handle is one page, and a span says that memory cycles.
fn rig_moving() -> Rig {
    let settings = Settings::with_variables(&[("STREAMPOOL_VMM_COLD_AFTER", "10ms")]);
    rig_spec(2, 64 * PAGE, spec(settings, 64 * PAGE))
}

/// A step of `pages` pages, then the release threshold's trim at a synchronisation (to 0).
pub(super) fn step_then_trim_at_sync(r: &Rig, pages: u64) {
    let step = r.alloc(pages * PAGE, S1);
    r.free(step, pages * PAGE, S1);
    r.sim.complete_all();
    trim_at_sync(r, 0);
}

/// A step of `pages` pages on S1 (allocated, freed, its work done), then a trim asked for
/// (`empty_cache()`): the first since the device last idled starts no cycle.
fn step_then_trim(r: &Rig, pages: u64) {
    let step = r.alloc(pages * PAGE, S1);
    r.free(step, pages * PAGE, S1);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
}

/// The physical memory while a step of `pages` pages on S1 is live (the step freed after).
fn physical_during_step(r: &Rig, pages: u64) -> u64 {
    let step = r.alloc(pages * PAGE, S1);
    let physical = r.physical();
    r.free(step, pages * PAGE, S1);
    physical
}

/// By default pages do not move (no slack, no cold age): new memory comes in spans of 8 MiB, of
/// 256 MiB while memory cycles; where pages move, a page a handle outside a cycle.
#[test]
fn by_default_new_memory_comes_in_8_mib_spans_and_256_mib_while_memory_cycles() {
    let r = rig_with(2, 64 * PAGE, "0");
    let a = r.alloc(40 * PAGE, S1);
    assert_eq!(
        r.sim.calls("cuMemCreate"),
        40u64.div_ceil((8 << 20) / PAGE),
        "8 MiB spans"
    );
    r.free(a, 40 * PAGE, S1);
    r.sim.complete_all();
    crate::resource::Tending::synchronized(&*r.vmm).unwrap(); // the threshold's trim: cycles
    assert_eq!(r.physical(), 0);
    assert_eq!(
        r.vmm.span_max_pages(&r.vmm.state.lock()),
        (256 << 20) / PAGE,
        "256 MiB while memory cycles"
    );
    // Pages move where a cold age or a growth slack is set: each is a handle of its own.
    let slack = Settings::with_variables(&[("STREAMPOOL_VMM_GROWTH_SLACK", "1%")]);
    for moving in [rig_moving(), rig_spec(1, 64 * PAGE, spec(slack, 64 * PAGE))] {
        assert_eq!(moving.vmm.span_max_pages(&moving.vmm.state.lock()), 1);
    }
}

#[test]
fn where_pages_move_spans_back_new_memory_only_while_memory_cycles() {
    let r = rig_moving();
    let a = r.alloc(12 * PAGE, S1);
    assert_eq!(r.sim.calls("cuMemCreate"), 12, "a page a handle");
    r.free(a, 12 * PAGE, S1);
    r.sim.complete_all();
    // One trim that gave memory back (an empty_cache() between two phases) is no loop yet.
    r.vmm.trim(0).unwrap();
    let b = r.alloc(12 * PAGE, S1);
    assert_eq!(r.sim.calls("cuMemCreate"), 24, "still a page a handle");
    r.free(b, 12 * PAGE, S1);
    r.sim.complete_all();
    // The second since the device idled: memory given back at a synchronisation (a release
    // threshold's trim, or empty_cache) is mapped again in spans of up to 256 MiB.
    r.vmm.trim(0).unwrap();
    let c = r.alloc(12 * PAGE, S1);
    assert_eq!(r.sim.calls("cuMemCreate"), 25, "one span");
    // As much as ever is held again: it ends.
    r.vmm.trim(0).unwrap();
    let d = r.alloc(3 * PAGE, S1);
    assert_eq!(r.sim.calls("cuMemCreate"), 28, "a page a handle again");
    for (p, pages) in [(c, 12), (d, 3)] {
        r.free(p, pages * PAGE, S1);
    }
}

/// One trim between two phases of a program (an `empty_cache()` after the first) maps nothing
/// ahead of the second phase's blocks toward the first's peak; an idle release forgets it, so
/// that the next trim is a first one again.
#[test]
fn one_trim_between_phases_maps_nothing_ahead() {
    let r = rig_moving();
    step_then_trim(&r, 40);
    assert_eq!(r.physical(), 0);
    assert!(!cycles(&r));
    assert_eq!(
        physical_during_step(&r, 12),
        12 * PAGE,
        "the second phase's pages alone"
    );
    r.sim.complete_all();
    r.vmm.release_idle();
    step_then_trim(&r, 40);
    assert!(!cycles(&r));
    assert_eq!(
        physical_during_step(&r, 12),
        12 * PAGE,
        "a trim before the idle release and one after: no cycle"
    );
}

/// Asked trims (`empty_cache()`) that make memory cycle bring spans but map nothing ahead of a
/// block: the phase after them may be smaller than the one before (a benchmark's next workload),
/// and memory ahead filled the earlier phase's peak.
#[test]
fn asked_trims_map_nothing_ahead_of_the_next_phase() {
    let r = rig();
    step_then_trim(&r, 40);
    step_then_trim(&r, 40);
    assert!(cycles(&r), "the second asked trim: memory cycles");
    let creates = r.sim.calls("cuMemCreate");
    let a = r.alloc(3 * PAGE, S1);
    assert_eq!(r.physical(), 3 * PAGE, "the block's pages alone");
    assert_eq!(r.sim.calls("cuMemCreate") - creates, 1, "in one span");
    r.free(a, 3 * PAGE, S1);
}

/// The release threshold at a synchronisation starts a cycle at once: it gives memory back at
/// every step of a loop that synchronises.
#[test]
fn the_threshold_at_a_synchronisation_cycles_at_once() {
    let r = rig_with(2, 64 * PAGE, "0");
    let a = r.alloc(12 * PAGE, S1);
    r.free(a, 12 * PAGE, S1);
    r.sim.complete_all();
    crate::resource::Tending::synchronized(&*r.vmm).unwrap();
    assert_eq!(r.physical(), 0, "given back at the synchronisation");
    let creates = r.sim.calls("cuMemCreate");
    let b = r.alloc(12 * PAGE, S1);
    assert_eq!(r.sim.calls("cuMemCreate") - creates, 1, "one span");
    r.free(b, 12 * PAGE, S1);
}

/// A trim that gives nothing back between two asked trims leaves the first one noted; an asked
/// trim during a cycle raises it; the threshold after a first asked trim cycles at its own
/// level, not the earlier phase's.
#[test]
fn asked_trims_count_only_when_they_give_memory_back() {
    let r = rig_moving();
    step_then_trim(&r, 40);
    r.vmm.trim(0).unwrap(); // nothing left to give back
    assert!(!cycles(&r));
    step_then_trim(&r, 12);
    assert_eq!(
        cycle_back_to_pages(&r),
        12,
        "the second asked trim, at its own level"
    );
    step_then_trim(&r, 20);
    assert_eq!(
        cycle_back_to_pages(&r),
        20,
        "a trim during the cycle raises it"
    );
    r.sim.complete_all();
    r.vmm.release_idle();
    assert!(!cycles(&r));
    step_then_trim(&r, 40);
    step_then_trim_at_sync(&r, 12);
    assert_eq!(
        cycle_back_to_pages(&r),
        12,
        "the threshold's cycle, at its level: not the 40 pages of the first asked trim"
    );
    r.sim.complete_all();
    r.vmm.release_idle();
    step_then_trim_at_sync(&r, 12);
    step_then_trim(&r, 20);
    assert_eq!(
        cycle_back_to_pages(&r),
        20,
        "after the threshold's give-back, the first asked trim raises the cycle"
    );
}

/// A sleep starts a cycle at once: sleep and wake repeat, and what is mapped after a wake comes
/// in spans, so that the next sleep gives it back in a few handles — also after an idle release
/// while asleep (however long it slept).
#[test]
fn a_sleep_cycles_at_once() {
    for idle_while_asleep in [false, true] {
        let r = rig_moving();
        let a = r.alloc(12 * PAGE, S1);
        r.free(a, 12 * PAGE, S1);
        let keep = r.alloc(PAGE, S1);
        r.sim.complete_all();
        crate::resource::Sleep::sleep(&*r.vmm, 2, &[]).unwrap();
        if idle_while_asleep {
            r.vmm.release_idle();
        }
        crate::resource::Sleep::wake(&*r.vmm).unwrap();
        let creates = r.sim.calls("cuMemCreate");
        let b = r.alloc(8 * PAGE, S1);
        assert_eq!(
            r.sim.calls("cuMemCreate") - creates,
            2,
            "the block's span and the one ahead of it, not a page a handle \
             (idle while asleep: {idle_while_asleep})"
        );
        r.free(b, 8 * PAGE, S1);
        r.free(keep, PAGE, S1);
    }
}

/// Memory cycles up to what was held when a trim gave memory back, not up to the most ever held:
/// after an idle release gave back a large peak, a trim's cycle maps no more ahead of a block
/// than the program held before the trim.
#[test]
fn a_trim_s_cycle_maps_ahead_only_up_to_what_was_held_before_it() {
    // No growth slack: the cycle alone bounds the memory ahead.
    let settings = Settings::with_variables(&[("STREAMPOOL_VMM_GROWTH_SLACK", "off")]);
    let r = rig_spec(2, 64 * PAGE, spec(settings, 64 * PAGE));
    let big = r.alloc(40 * PAGE, S1);
    r.free(big, 40 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.release_idle();
    assert_eq!(r.physical(), 0, "the peak went back while idle");
    let a = r.alloc(2 * PAGE, S1);
    step_then_trim(&r, 12);
    step_then_trim(&r, 12);
    assert_eq!(r.physical(), 2 * PAGE);
    assert_eq!(
        cycle_back_to_pages(&r),
        14,
        "cycling, up to the 14 pages held"
    );
    assert_eq!(
        physical_during_step(&r, 12),
        14 * PAGE,
        "the 14 pages held before the trim, nothing ahead of the step toward the 40 of the peak"
    );
    r.free(a, 2 * PAGE, S1);
}

/// A cycle keeps the most held at a trim until the device idles: a second trim that gives back
/// less does not end it, an idle release does.
#[test]
fn an_idle_release_ends_a_cycle_a_smaller_trim_does_not() {
    let r = rig_moving();
    let trimmed_at = |pages: u64| {
        step_then_trim_at_sync(&r, pages);
        assert_eq!(r.physical(), 0);
    };
    trimmed_at(40);
    trimmed_at(14);
    assert_eq!(
        physical_during_step(&r, 12),
        40 * PAGE,
        "still cycling up to the 40 pages of the first trim: 28 mapped ahead"
    );
    r.sim.complete_all();
    r.vmm.release_idle();
    assert_eq!(r.physical(), 0);
    assert!(!cycles(&r));
    assert_eq!(
        physical_during_step(&r, 12),
        12 * PAGE,
        "after the idle release, nothing ahead"
    );
}

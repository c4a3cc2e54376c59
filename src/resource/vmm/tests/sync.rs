//! At the program's synchronisation (`torch.cuda.synchronize()`, without a release threshold):
//! what was freed before it becomes ready for every stream, merged, where more than one stream
//! allocated or freed since the last one.

use super::*;
use crate::resource::Tending;

/// Blocks of two streams, side by side, all freed and their work done: `a` (2 pages, S1), `b` (4,
/// S2), `c` (6, S1), the layout a step of two streams leaves.
fn two_streams_freed(r: &Rig) {
    let a = r.alloc(2 * PAGE, S1);
    let b = r.alloc(4 * PAGE, S2);
    let c = r.alloc(6 * PAGE, S1);
    assert_eq!((b.0 - a.0, c.0 - b.0), (2 * PAGE, 4 * PAGE), "side by side");
    r.free(a, 2 * PAGE, S1);
    r.free(b, 4 * PAGE, S2);
    r.free(c, 6 * PAGE, S1);
    r.sim.complete_all();
}

/// The next step asks 4 pages on S1, 4 on S2 and 4 on S1: the 12 pages held serve it if the
/// freed memory is one range; S1 taking its own 6-page range first leaves two 2-page holes.
fn next_step_creates(r: &Rig) -> u64 {
    let creates = r.sim.calls("cuMemCreate");
    let x = r.alloc(4 * PAGE, S1);
    let y = r.alloc(4 * PAGE, S2);
    let z = r.alloc(4 * PAGE, S1);
    let grown = r.sim.calls("cuMemCreate") - creates;
    r.free(x, 4 * PAGE, S1);
    r.free(y, 4 * PAGE, S2);
    r.free(z, 4 * PAGE, S1);
    grown
}

#[test]
fn after_a_synchronisation_freed_memory_serves_every_stream_as_one_range() {
    let r = rig();
    two_streams_freed(&r);
    Tending::synchronized(&*r.vmm).unwrap();
    assert_eq!(next_step_creates(&r), 0, "the 12 pages held serve the step");
    assert_eq!(r.physical(), 12 * PAGE);
}

/// Where one stream alone allocated since the last synchronisation, the next one leaves the
/// ranges as they are (its frees serve it already; settling churn's 200 frees a step cost about
/// 10 us a synchronisation on an H200); once another stream allocated, the next one settles.
#[test]
fn a_synchronisation_settles_only_where_another_stream_allocated() {
    let r = rig();
    let a = r.alloc(2 * PAGE, S1);
    let b = r.alloc(2 * PAGE, S1);
    r.free(a, 2 * PAGE, S1);
    r.free(b, 2 * PAGE, S1);
    r.sim.complete_all();
    Tending::synchronized(&*r.vmm).unwrap();
    assert_eq!(
        r.vmm.state.lock().large.streams_waited_for(),
        vec![S1],
        "left as it was"
    );
    let c = r.alloc(2 * PAGE, S2);
    r.free(c, 2 * PAGE, S2);
    r.sim.complete_all();
    Tending::synchronized(&*r.vmm).unwrap();
    assert!(
        r.vmm.state.lock().large.streams_waited_for().is_empty(),
        "settled"
    );
}

/// A program that synchronises between a step's allocations and its frees: the frees of two
/// streams alone call for the settling at the next synchronisation.
#[test]
fn frees_of_two_streams_alone_call_for_the_settling() {
    let r = rig();
    let a = r.alloc(2 * PAGE, S1);
    let b = r.alloc(4 * PAGE, S2);
    let c = r.alloc(6 * PAGE, S1);
    Tending::synchronized(&*r.vmm).unwrap();
    r.free(a, 2 * PAGE, S1);
    r.free(b, 4 * PAGE, S2);
    r.free(c, 6 * PAGE, S1);
    r.sim.complete_all();
    Tending::synchronized(&*r.vmm).unwrap();
    assert_eq!(next_step_creates(&r), 0, "the 12 pages held serve the step");
}

/// The case above without the synchronisation: the device grows (what the settling is for).
#[test]
fn without_a_synchronisation_the_same_step_grows() {
    let r = rig();
    two_streams_freed(&r);
    assert!(next_step_creates(&r) > 0);
}

/// A block handed back at a synchronisation with every stream's work done (`deallocate_idle`:
/// the device asked the driver) is ready for every stream at once: another stream's fast path
/// takes it, with no wait and no look at the fences. While a capture is known it is a plain free.
#[test]
fn a_block_given_back_idle_serves_another_stream_at_once() {
    let r = rig();
    let x = r.alloc(2 * PAGE, S1);
    let a = r.alloc(4 * PAGE, S1);
    // The first free records S1's fence at once; the next one's (a's) is not due then.
    r.free(x, 2 * PAGE, S1);
    r.sim.complete_all();
    let used = r.vmm.state.lock().used_bytes;
    Resource::deallocate_idle(&*r.vmm, a, 4 * PAGE, S1).unwrap();
    assert_eq!(r.vmm.state.lock().used_bytes, used - 4 * PAGE);
    let b = Resource::try_allocate(&*r.vmm, 4 * PAGE, S2);
    assert_eq!(b, Some(a), "ready for S2 at once");
    r.sim.complete_all();
    // A capture on a third stream: freed on S2, for S2 alone until a fence says otherwise.
    r.sim.begin_capture(0, Stream(3));
    CaptureNotice::capture_started(&*r.vmm, Stream(3));
    Resource::deallocate_idle(&*r.vmm, a, 4 * PAGE, S2).unwrap();
    assert_eq!(
        Resource::try_allocate(&*r.vmm, 4 * PAGE, S1),
        None,
        "not S1's at once during a capture"
    );
    r.sim.end_capture(0, Stream(3));
}

//! Captures: memory freed while a CUDA graph is captured is fenced and released only after the
//! capture; during one, memory is mapped and fences are read in relaxed mode only.

use super::*;

#[test]
fn a_block_freed_during_a_capture_is_released_by_an_idle_release_after_it() {
    let r = rig();
    let a = r.alloc(4 * PAGE, S1);
    r.sim.begin_capture(0, S1);
    r.free(a, 4 * PAGE, S1); // no fence possible: it waits for the capture's end
    assert!(r.vmm.release_idle(), "look again after the capture");
    assert_eq!(r.physical(), 4 * PAGE);
    r.sim.end_capture(0, S1);
    assert!(r.vmm.release_idle(), "fenced now; the GPU is not done");
    r.sim.complete_all();
    assert!(!r.vmm.release_idle());
    assert_eq!(r.physical(), 0, "released after the capture");
}

#[test]
fn a_block_freed_during_a_capture_is_fenced_at_the_next_allocation_after_it() {
    let r = rig();
    let a = r.alloc(2 * PAGE, S1);
    r.sim.begin_capture(0, S1);
    r.free(a, 2 * PAGE, S1);
    r.sim.end_capture(0, S1);
    let b = r.alloc(2 * PAGE, S2); // fences a now, and waits for that fence on the GPU
    assert_eq!(b, a);
    assert_eq!(Statistics::driver_counts(&*r.vmm).stream_waits, 1);
    r.free(b, 2 * PAGE, S2);
    r.sim.complete_all();
    assert_eq!(
        r.alloc(2 * PAGE, Stream(3)),
        a,
        "a is free for every stream once its fences completed"
    );
    r.free(a, 2 * PAGE, Stream(3));
}

/// While a stream captures a graph (in global mode, maybe on another thread), the resource maps
/// memory and looks at the fences of streams that are not capturing, in relaxed capture mode only
/// (PyTorch makes its graph pools' cudaMalloc the same way); it unmaps nothing.
#[test]
fn during_a_capture_memory_is_mapped_and_fences_read_in_relaxed_mode_only() {
    let r = rig();
    let capturing = Stream(9);
    let a = r.alloc(2 * PAGE, S1);
    r.free(a, 2 * PAGE, S1);
    r.sim.begin_capture(0, capturing);
    CaptureNotice::capture_started(&*r.vmm, capturing);
    assert_eq!(r.alloc(2 * PAGE, S1), a, "a mapped fit is still served");
    let b = r.alloc(8 * PAGE, S1);
    assert_eq!(r.physical(), 10 * PAGE, "mapped during the capture");
    r.free(a, 2 * PAGE, S1);
    r.sim.complete_all();
    // S1 is not capturing: its fence is settled (in relaxed mode) and S2 gets a at once.
    assert_eq!(r.alloc(2 * PAGE, S2), a);
    r.free(a, 2 * PAGE, S2);
    r.free(b, 8 * PAGE, S1);
    r.sim.complete_all();
    assert!(r.vmm.release_idle(), "nothing released during the capture");
    assert_eq!(r.physical(), 10 * PAGE);
    assert_eq!(
        r.sim.calls("unsafe during capture"),
        0,
        "every query and mapping in relaxed mode"
    );
    r.sim.end_capture(0, capturing);
    r.vmm.trim(0).unwrap();
    assert_eq!(
        r.physical(),
        0,
        "the end of the capture noticed without being told"
    );
}

#[test]
fn a_free_on_the_capturing_stream_itself_waits_for_the_capture_to_end() {
    let r = rig();
    let a = r.alloc(2 * PAGE, S1);
    r.sim.begin_capture(0, S1);
    r.free(a, 2 * PAGE, S1); // the capture is not known to the resource: only its stream
    r.sim.complete_all();
    let b = r.alloc(2 * PAGE, S2);
    assert_ne!(a, b, "no fence on a capturing stream: not reusable yet");
    r.sim.end_capture(0, S1);
    r.free(b, 2 * PAGE, S2);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0);
}

//! The program's synchronisation under install(): `torch.cuda.synchronize()` tells the library as
//! it begins (`synchronizing`) and once it has returned (`synchronized`). Blocks that waited for
//! other streams (record_stream) before it began go back at its end without a driver query —
//! their streams' work on them was queued before the synchronisation, so it is done — and ready
//! for every stream; blocks freed since wait for their events as before.

mod common;
use common::*;

/// The driver's answers about completion: event and stream queries.
fn queries(r: &Rig) -> u64 {
    r.sim.calls("cuEventQuery") + r.sim.calls("cuStreamQuery")
}

/// A large block: on the vmm backend one freed idle serves every stream.
const BYTES: u64 = 4 << 20;

/// Frees a block that stream 1 allocated and stream 2 used: it waits for stream 2.
fn waiting_block(r: &Rig) -> streampool::driver::DevicePtr {
    let a = r.malloc(BYTES, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.free(a, 0);
    assert_eq!(r.stats(0).active_bytes, BYTES, "waiting for stream 2");
    a
}

#[test]
fn a_block_that_waited_before_the_synchronisation_began_goes_back_unasked() {
    for marked in [false, true] {
        let r = rig(1 << 30);
        let a = waiting_block(&r);
        let device = r.device(0);
        if marked {
            device.synchronizing().unwrap();
        }
        r.sim.complete_all(); // PyTorch's synchronisation
        let before = queries(&r);
        device.synchronized().unwrap();
        assert_eq!(r.stats(0).active_bytes, 0, "back at the synchronisation");
        match marked {
            true => assert_eq!(queries(&r), before, "nothing asked of the driver"),
            false => assert!(queries(&r) > before, "without the mark the driver is asked"),
        }
        // Back ready for every stream (on the vmm backend, whose ranges say so): another
        // stream gets it.
        if base_config().backend == streampool::config::Backend::Vmm {
            let b = r.malloc(BYTES, 0, 3);
            assert_eq!(b, a, "stream 3 reuses the block (marked: {marked})");
            r.free(b, 0);
        }
        r.finish();
    }
}

#[test]
fn a_block_freed_after_the_synchronisation_began_still_waits_for_its_stream() {
    let r = rig(1 << 30);
    let a = r.malloc(BYTES, 0, 1);
    let b = r.malloc(BYTES, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    r.alloc.record_stream(b, s(2)).unwrap();
    r.free(a, 0);
    let device = r.device(0);
    device.synchronizing().unwrap();
    r.free(b, 0); // another thread's free, while the synchronisation runs
    device.synchronized().unwrap();
    assert_eq!(
        r.stats(0).active_bytes,
        BYTES,
        "a went back at the end; b, freed after the beginning, waits for stream 2"
    );
    r.sim.complete_all();
    device.synchronized().unwrap();
    assert_eq!(
        r.stats(0).active_bytes,
        0,
        "b back once its event completed"
    );
    r.finish();
}

#[test]
fn a_mark_belongs_to_the_thread_that_took_it() {
    let r = rig(1 << 30);
    let _a = waiting_block(&r);
    let device = r.device(0);
    // Another thread begins a synchronisation: this thread's end does not use its mark.
    std::thread::scope(|scope| {
        scope.spawn(|| device.synchronizing().unwrap());
    });
    let before = queries(&r);
    device.synchronized().unwrap();
    assert!(
        queries(&r) > before,
        "another thread's mark is not this one's"
    );
    assert_eq!(
        r.stats(0).active_bytes,
        BYTES,
        "its event has not completed"
    );
    // This thread's own mark serves its own end.
    device.synchronizing().unwrap();
    r.sim.complete_all();
    device.synchronized().unwrap();
    assert_eq!(r.stats(0).active_bytes, 0);
    r.finish();
}

#[test]
fn a_wake_does_not_use_a_synchronisation_mark() {
    if base_config().backend != streampool::config::Backend::Vmm {
        return; // only the vmm backend sleeps
    }
    let r = rig(1 << 30);
    let a = r.malloc(BYTES, 0, 1);
    r.alloc.record_stream(a, s(2)).unwrap();
    let device = r.device(0);
    device.sleep(1, &[]).unwrap();
    r.free(a, 0); // freed asleep: it waits for stream 2
    device.synchronizing().unwrap();
    // That synchronisation failed (no end): the wake, which collects the waits whose streams are
    // done, must not take the block as done on the strength of its mark.
    device.wake().unwrap();
    assert_eq!(r.stats(0).active_bytes, BYTES, "still waiting for stream 2");
    r.sim.complete_all();
    device.synchronized().unwrap();
    assert_eq!(r.stats(0).active_bytes, 0);
    r.finish();
}

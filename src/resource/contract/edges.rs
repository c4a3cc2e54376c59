//! The contract's cases at its edges: a graph capture, frees that are wrong, the fast path, and
//! threads.
//!
//! Invariant: as the other cases, each holds for every resource, reading differences from its
//! traits and capabilities only.

use super::rig::{Block, Rig, Rng, S, T, U};
use super::{Factory, ALIGNMENT_BYTES, MEMORY_BYTES};
use crate::driver::{DevicePtr, Stream};
use std::sync::{Arc, Mutex};

/// The stream that captures a graph.
const C: Stream = Stream(0xc0);

pub(super) fn a_capture_sees_no_call_it_forbids(make: Factory) {
    let mut rig = Rig::new(make);
    // Memory S's work still uses when the capture begins.
    let (a, b) = (rig.alloc(4096, S), rig.alloc(3 << 20, S));
    rig.free(a);
    rig.free(b);
    let forbidden = rig.sim.calls("unsafe during capture");
    rig.sim.begin_capture(0, C);
    // What the device does when it sees a capture.
    if let Some(notice) = rig.resource.capabilities().capture_notice {
        notice.capture_started(C);
    }
    // Other streams allocate, free and run out; the capturing stream allocates and frees.
    let blocks = [
        rig.alloc(4096, T),
        rig.alloc(3 << 20, T),
        rig.alloc(4096, C),
        rig.alloc(3 << 20, C),
        rig.alloc(5 << 20, U),
    ];
    rig.free(blocks[0]);
    rig.free(blocks[2]);
    rig.alloc(4096, C);
    rig.alloc(4096, T);
    let label = rig.label();
    let refused = rig.resource.allocate(2 * MEMORY_BYTES, T);
    assert!(refused.is_err_and(|e| e.is_device_oom()), "{label}");
    rig.check_usage();
    assert_eq!(
        rig.sim.calls("unsafe during capture"),
        forbidden,
        "{label}: a call a capture in global mode forbids, outside relaxed mode"
    );
    rig.sim.end_capture(0, C);
    rig.free_all();
    rig.sync();
    rig.resource.trim(0).unwrap();
    rig.finish();
}

pub(super) fn bad_frees_are_refused_and_change_nothing(make: Factory) {
    let mut rig = Rig::new(make);
    let label = rig.label();
    let p = rig.alloc(4096, S);
    let q = rig.alloc(8192, S);
    rig.alloc(3 << 20, T);
    let before = rig.snapshot();
    let never = DevicePtr(0x10_0000_0000);
    for (ptr, bytes) in [
        (DevicePtr::NULL, 4096),
        (never, 4096),
        (p.offset(ALIGNMENT_BYTES), 512),
        (q.offset(4096), 4096),
    ] {
        let refused = rig.resource.deallocate(ptr, bytes, S);
        assert!(
            refused.is_err(),
            "{label}: freeing {ptr:#x}+{bytes} was taken"
        );
        assert_eq!(
            rig.snapshot(),
            before,
            "{label}: a refused free changed something"
        );
    }
    // The wrong size: refused where the resource knows sizes; otherwise the block goes back whole.
    match rig.resource.deallocate(p, 8192, S) {
        Err(_) => assert_eq!(
            rig.snapshot(),
            before,
            "{label}: a refused free changed something"
        ),
        Ok(()) => {
            assert!(
                !rig.traits.checks_free_size,
                "{label}: it checks sizes, yet took {p:#x} back as 8192 B"
            );
            rig.forget(p);
        }
    }
    // Twice the same block.
    rig.free(q);
    let after = rig.snapshot();
    let again = rig.resource.deallocate(q, 8192, S);
    assert!(
        again.is_err(),
        "{label}: a block freed twice was taken twice"
    );
    assert_eq!(
        rig.snapshot(),
        after,
        "{label}: a refused free changed something"
    );
    rig.use_all();
    rig.check_usage();
    rig.finish();
}

pub(super) fn the_fast_path_agrees_with_allocate_and_deallocate(make: Factory) {
    let mut rig = Rig::new(make);
    let label = rig.label();
    if !rig.traits.fast_path {
        // The device never calls it; it must not serve behind the resource's back either.
        assert!(rig.resource.try_allocate(4096, S).is_none(), "{label}");
        let p = rig.alloc(4096, S);
        assert!(rig.resource.try_deallocate(p, 4096, S).is_none(), "{label}");
        rig.finish();
        return;
    }
    for bytes in [4096, 3 << 20] {
        // Blocks from allocate go back through try_deallocate.
        let (p1, p2) = (rig.alloc(bytes, S), rig.alloc(bytes, S));
        for ptr in [p1, p2] {
            rig.use_on_gpu(ptr, bytes, S);
            match rig.resource.try_deallocate(ptr, bytes, S) {
                Some(Ok(())) => rig.forget(ptr),
                Some(Err(e)) => panic!("{label}: try_deallocate of a live block: {e}"),
                None => rig.free(ptr),
            }
        }
        rig.check_usage();
        // S's work still uses both: T may get them only after a GPU-side wait, which the fast
        // path never makes.
        if let Some(ptr) = rig.resource.try_allocate(bytes, T) {
            rig.accept(ptr, bytes, T);
        }
        // What S freed is at hand for S.
        let q = rig.resource.try_allocate(bytes, S);
        let q = q.unwrap_or_else(|| panic!("{label}: {bytes} B freed on S is not at hand for S"));
        rig.accept(q, bytes, S);
        rig.check_usage();
        // A bad free is refused on the fast path as on the other.
        let before = rig.snapshot();
        let inside = q.offset(ALIGNMENT_BYTES);
        if let Some(outcome) = rig.resource.try_deallocate(inside, 512, S) {
            assert!(outcome.is_err(), "{label}: try_deallocate took {inside:#x}");
        }
        assert!(rig.resource.deallocate(inside, 512, S).is_err(), "{label}");
        assert_eq!(
            rig.snapshot(),
            before,
            "{label}: a refused free changed something"
        );
        // And a block the fast path served goes back through deallocate.
        rig.free(q);
        rig.free_all();
        rig.check_usage();
    }
    rig.finish();
}

pub(super) fn threads_on_their_own_streams_share_it_safely(make: Factory) {
    let rig = Rig::new(make);
    let live: Arc<Mutex<Vec<Block>>> = Arc::default();
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let (sim, resource, live) = (rig.sim.clone(), rig.resource.clone(), live.clone());
            std::thread::spawn(move || {
                let stream = Stream(0x100 + i);
                let mut rng = Rng::new(0xfeed + i as u64);
                let mut mine: Vec<Block> = Vec::new();
                for _ in 0..150 {
                    if mine.len() < 6 && rng.below(3) > 0 {
                        let bytes = rng.pick(&[512, 4096, 65536, 1 << 20, 3 << 20]);
                        let Ok(ptr) = resource.allocate(bytes, stream) else {
                            continue;
                        };
                        let block = Block { ptr, bytes, stream };
                        let mut all = live.lock().unwrap();
                        let end = ptr.0 + bytes;
                        let clash = all
                            .iter()
                            .find(|b| b.ptr.0 < end && ptr.0 < b.ptr.0 + b.bytes);
                        assert!(clash.is_none(), "{block:x?} overlaps {clash:x?}");
                        all.push(block);
                        drop(all);
                        sim.touch(0, 0, ptr, bytes, stream).unwrap();
                        mine.push(block);
                    } else if let Some(b) = mine.pop() {
                        sim.touch(0, 0, b.ptr, b.bytes, stream).unwrap();
                        live.lock().unwrap().retain(|l| l.ptr != b.ptr);
                        resource.deallocate(b.ptr, b.bytes, stream).unwrap();
                    }
                }
                for b in mine {
                    live.lock().unwrap().retain(|l| l.ptr != b.ptr);
                    resource.deallocate(b.ptr, b.bytes, stream).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
    assert!(live.lock().unwrap().is_empty());
    rig.check_usage();
    rig.finish();
}

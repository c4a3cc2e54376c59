//! Moves in two halves: a growth takes the handles of idle pages and of pages its own stream
//! freed, maps them at once, and the old addresses are unmapped later, off the allocating
//! thread, once no work can use them there.

use super::*;

#[test]
fn a_growth_takes_the_pages_its_stream_freed_before_their_work_completed() {
    let r = rig_slack(0);
    r.stop_clock();
    let a = r.alloc(4 * PAGE, S1);
    let b = r.alloc(PAGE, S1);
    let c = r.alloc(4 * PAGE, S1);
    // Freed on S1, whose work on them has not completed: S1 may use them at once, but no page
    // can be unmapped yet.
    r.free(a, 4 * PAGE, S1);
    r.free(c, 4 * PAGE, S1);
    let creates = r.sim.calls("cuMemCreate");
    // Fits neither hole: a window over c's hole and 4 pages past it, backed by a's pages.
    let d = r.alloc(8 * PAGE, S1);
    assert_eq!(d, c);
    let counts = Statistics::driver_counts(&*r.vmm);
    assert_eq!(r.sim.calls("cuMemCreate"), creates, "nothing created");
    assert_eq!((counts.moves, counts.lent), (4, 4), "a's pages lent");
    assert_eq!(r.physical(), 9 * PAGE);
    // The old addresses stay mapped while S1's work may still use them there.
    assert!(r.vmm.release_idle(), "pages still retiring");
    assert_eq!(Statistics::driver_counts(&*r.vmm).unmaps, 0);
    // Nor does another stream get their memory meanwhile (the strict simulator refuses S2's
    // touch beside S1's unfinished work on the same physical pages).
    let e = r.alloc(PAGE, S2);
    r.free(e, PAGE, S2);
    r.sim.complete_all();
    r.vmm.release_above_threshold(); // the background's look: releases nothing idle
    assert_eq!(
        Statistics::driver_counts(&*r.vmm).unmaps,
        4,
        "unmapped once S1's fence completed"
    );
    r.free(b, PAGE, S1);
    r.free(d, 8 * PAGE, S1);
}

/// Blocks of [`rig_with_two_retiring`]: two live pages, and the block two idle pages moved into.
struct TwoRetiring {
    kept: [DevicePtr; 2],
    moved: DevicePtr,
}

impl TwoRetiring {
    fn free_all(&self, r: &Rig) {
        for p in self.kept {
            r.free(p, PAGE, S1);
        }
        r.free(self.moved, 2 * PAGE, S2);
    }
}

/// Two idle pages moved into a new block on S2, their old addresses retiring; the background's
/// look is next.
fn rig_with_two_retiring() -> (Rig, TwoRetiring) {
    let r = rig_slack(0);
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..4).map(|_| r.alloc(PAGE, S1)).collect();
    r.free(blocks[0], PAGE, S1);
    r.free(blocks[2], PAGE, S1);
    r.sim.complete_all();
    r.vmm.release_above_threshold(); // collects the fences: the holes are idle
    let moved = r.alloc(2 * PAGE, S2);
    assert_eq!(r.vmm.state.lock().retiring.len(), 2, "two pages retiring");
    let kept = [blocks[1], blocks[3]];
    (r, TwoRetiring { kept, moved })
}

#[test]
fn an_idle_page_moves_without_an_unmap_on_the_allocating_thread() {
    let (r, two) = rig_with_two_retiring();
    let counts = Statistics::driver_counts(&*r.vmm);
    assert_eq!((counts.moves, counts.lent), (2, 0), "two idle pages moved");
    assert_eq!(counts.unmaps, 0, "their unmaps wait for the background");
    assert_eq!(r.physical(), 4 * PAGE);
    r.vmm.release_above_threshold();
    assert_eq!(Statistics::driver_counts(&*r.vmm).unmaps, 2);
    two.free_all(&r);
}

#[test]
fn pages_another_stream_freed_are_never_lent() {
    let r = rig_slack(0);
    r.stop_clock();
    let a = r.alloc(4 * PAGE, S2);
    let b = r.alloc(PAGE, S1);
    r.free(a, 4 * PAGE, S2); // S2's work on it not completed
    let d = r.alloc(6 * PAGE, S1);
    assert_eq!(Statistics::driver_counts(&*r.vmm).lent, 0);
    r.free(b, PAGE, S1);
    r.free(d, 6 * PAGE, S1);
}

/// The part of a lent page a block does not cover is the lending stream's freed memory: another
/// stream gets it only behind that stream's fence (the strict simulator refuses a touch of
/// memory whose other address unfinished work of another stream still uses).
#[test]
fn the_rest_of_a_lent_page_waits_for_the_lenders_fence() {
    let r = rig_slack(0);
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..4).map(|_| r.alloc(PAGE, S1)).collect();
    // Two one-page holes, S1's work on them unfinished.
    r.free(blocks[0], PAGE, S1);
    r.free(blocks[2], PAGE, S1);
    // 1.25 pages fit neither hole: a window of two pages past the last block, both backed by the
    // holes' handles; the second page's last 1.5 MiB stay free.
    let b = r.alloc(PAGE + PAGE / 4, S1);
    assert_eq!(Statistics::driver_counts(&*r.vmm).lent, 2);
    let c = r.alloc(3 * PAGE / 4, S2); // touched by S2: never beside S1's unfinished work
    r.free(c, 3 * PAGE / 4, S2);
    for (p, bytes) in [(blocks[1], PAGE), (blocks[3], PAGE), (b, PAGE + PAGE / 4)] {
        r.free(p, bytes, S1);
    }
}

/// A window that fails after taking the handles of pages its stream freed undoes those moves:
/// the handles go back to their pages, still freed behind the stream's fence, never plain
/// spares that a later growth of another stream would map as ready memory (found by review).
#[test]
fn a_failed_window_undoes_its_moves() {
    let r = rig_slack(0);
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..4).map(|_| r.alloc(PAGE, S1)).collect();
    r.free(blocks[0], PAGE, S1); // S1's work on them unfinished
    r.free(blocks[2], PAGE, S1);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    assert!(r.vmm.allocate(2 * PAGE, S1).is_err());
    assert_eq!(Statistics::driver_counts(&*r.vmm).lent, 2);
    let e = r.alloc(2 * PAGE, S2); // touched by S2: never beside S1's unfinished work
    r.free(e, 2 * PAGE, S2);
    for p in [blocks[1], blocks[3]] {
        r.free(p, PAGE, S1);
    }
}

/// The same when the failed window's pages cannot even be unmapped: blocked, then given
/// access, they are the lending stream's freed memory, not ready memory.
#[test]
fn a_blocked_page_with_a_lent_handle_is_unblocked_as_freed_memory() {
    let r = rig_slack(0);
    r.stop_clock();
    let blocks: Vec<DevicePtr> = (0..4).map(|_| r.alloc(PAGE, S1)).collect();
    r.free(blocks[0], PAGE, S1);
    r.free(blocks[2], PAGE, S1);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    r.sim.inject_fault(SimFault::MemUnmap, 2);
    assert!(r.vmm.allocate(2 * PAGE, S1).is_err());
    let e = r.alloc(PAGE, S2); // the update unblocks the pages first
    r.free(e, PAGE, S2);
    r.sim.complete_all();
    for p in [blocks[1], blocks[3]] {
        r.free(p, PAGE, S1);
    }
}

/// The background thread unmaps retired pages under the lock, as every mapping call, but hands
/// it to a thread waiting for it (an allocation) between two unmaps.
#[test]
fn the_background_hands_the_lock_over_between_two_unmaps() {
    let (r, two) = rig_with_two_retiring();
    let (vmm, sim) = (Arc::downgrade(&r.vmm), Arc::downgrade(&r.sim));
    let waiter = Arc::new(parking_lot::Mutex::new(None));
    let slot = Arc::clone(&waiter);
    let hook = move || {
        let mut slot = slot.lock();
        if slot.is_some() {
            return;
        }
        let (vmm, sim) = (vmm.upgrade().unwrap(), sim.upgrade().unwrap());
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let starting = Arc::clone(&started);
        // Waits for the lock the unmapping thread holds; notes how many unmaps it saw.
        *slot = Some(std::thread::spawn(move || {
            starting.store(true, std::sync::atomic::Ordering::SeqCst);
            let _st = vmm.state.lock();
            sim.calls("cuMemUnmap")
        }));
        // Once it runs, time for it to reach the lock and wait (park) there.
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    r.sim.set_call_hooks(vec![("cuMemUnmap", Arc::new(hook))]);
    let unmaps = r.sim.calls("cuMemUnmap");
    r.vmm.release_above_threshold();
    r.sim.set_call_hooks(Vec::new());
    let seen = waiter.lock().take().expect("waited").join().unwrap();
    assert_eq!(
        seen,
        unmaps + 1,
        "the waiting thread had the lock after the first unmap"
    );
    assert_eq!(Statistics::driver_counts(&*r.vmm).unmaps, 2);
    assert!(r.vmm.state.lock().retiring.is_empty());
    two.free_all(&r);
}

/// Every call that maps, unmaps, gives access to, creates or releases memory is made under the
/// resource's lock: on an H200, unmaps made outside it beside the allocating thread's maps made
/// `cuMemMap` fail (`CUDA_ERROR_UNKNOWN`), twice (docs/reliability.md), which the simulator,
/// serialising every call, cannot show by itself.
#[test]
fn every_mapping_call_is_made_under_the_resources_lock() {
    let (r, two) = rig_with_two_retiring();
    let unlocked = Arc::new(parking_lot::Mutex::new(Vec::<&'static str>::new()));
    let calls = [
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemRelease",
    ];
    let hooks = calls
        .iter()
        .map(|&call| {
            let (vmm, seen) = (Arc::downgrade(&r.vmm), Arc::clone(&unlocked));
            let hook = move || {
                let Some(vmm) = vmm.upgrade() else { return };
                if vmm.state.try_lock().is_some() {
                    seen.lock().push(call);
                }
            };
            (call, Arc::new(hook) as Arc<dyn Fn() + Send + Sync>)
        })
        .collect();
    r.sim.set_call_hooks(hooks);
    let before: u64 = calls.iter().map(|c| r.sim.calls(c)).sum();
    r.vmm.release_above_threshold(); // the background's unmaps
    let e = r.alloc(6 * PAGE, S1); // a growth: creates, maps, access
    r.free(e, 6 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.release_above_threshold();
    assert!(!r.vmm.release_idle(), "all idle memory released"); // unmaps, releases
    let made: u64 = calls.iter().map(|c| r.sim.calls(c)).sum::<u64>() - before;
    r.sim.set_call_hooks(Vec::new());
    assert!(made >= 10, "the calls were made ({made})");
    assert_eq!(
        *unlocked.lock(),
        Vec::<&str>::new(),
        "calls made without the lock"
    );
    two.free_all(&r);
}

/// A look of the background thread above the release threshold unmaps the retired pages before
/// it releases: a page whose handle was mapped at one until then goes back in the same look.
#[test]
fn memory_moved_out_of_retired_pages_goes_back_in_the_same_look() {
    let (r, two) = rig_with_two_retiring();
    r.free(two.moved, 2 * PAGE, S2); // the moved handles' new pages, idle once S2's work is done
    r.sim.complete_all();
    ReleaseThreshold::set_release_threshold(&*r.vmm, 0).unwrap();
    r.sim.advance_clock_ms(60_000); // unused long enough to go back
    r.vmm.release_above_threshold();
    assert_eq!(
        r.physical(),
        2 * PAGE,
        "only the two live blocks' pages are held"
    );
    for p in two.kept {
        r.free(p, PAGE, S1);
    }
}

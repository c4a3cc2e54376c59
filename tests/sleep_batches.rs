//! A sleep gives pages back as their copies complete: the copies go in batches with an event
//! after each, and the pages a batch copied are unmapped and released while the later batches'
//! copies run; a wait that fails part way maps what was given back again with its contents (or,
//! if that fails too, leaves it asleep for `wake()`). The simulator refuses to unmap memory a
//! copy still reads, so a page given back too soon stays mapped and fails these tests.

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use streampool::driver::sim::{SimDriver, SimFault};
use streampool::driver::DevicePtr;

const MIB: u64 = 1 << 20;
/// Blocks enough for several batches of copies (a batch is 64 MiB).
const BLOCKS: usize = 6;
const BLOCK_BYTES: u64 = 32 * MIB;

/// A rig with [`BLOCKS`] live blocks, each filled with its own pattern.
fn filled() -> (Rig, Vec<DevicePtr>) {
    let r = vmm_rig(1024 * MIB);
    let blocks: Vec<DevicePtr> = (0..BLOCKS).map(|_| r.malloc(BLOCK_BYTES, 0, 1)).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(&r, b, BLOCK_BYTES, 20 + i as u8);
    }
    (r, blocks)
}

fn all_hold(r: &Rig, blocks: &[DevicePtr]) -> bool {
    (blocks.iter().enumerate()).all(|(i, &b)| holds(r, b, BLOCK_BYTES, 20 + i as u8))
}

fn end(r: Rig, blocks: Vec<DevicePtr>) {
    for b in blocks {
        r.free(b, 0);
    }
    r.finish();
}

/// The `cuMemUnmap` calls made before each `cuEventSynchronize` call, from now on.
fn unmaps_at_each_wait(sim: &Arc<SimDriver>) -> Arc<std::sync::Mutex<Vec<u64>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (log, weak) = (Arc::clone(&seen), Arc::downgrade(sim));
    let hook = move || {
        if let Some(sim) = weak.upgrade() {
            log.lock().unwrap().push(sim.calls("cuMemUnmap"));
        }
    };
    sim.set_call_hooks(vec![("cuEventSynchronize", Arc::new(hook))]);
    seen
}

#[test]
fn pages_go_back_while_later_copies_run_and_every_one_wakes_with_its_contents() {
    let (r, blocks) = filled();
    let seen = unmaps_at_each_wait(&r.sim);
    let unmaps_before = r.sim.calls("cuMemUnmap");
    r.device(0).sleep(1, &[]).unwrap();
    r.sim.set_call_hooks(Vec::new());
    let waits = seen.lock().unwrap().clone();
    assert!(waits.len() >= 3, "a wait per batch: {waits:?}");
    assert!(
        waits[1] > waits[0],
        "the first batch's pages went back before the second batch was waited for: {waits:?}"
    );
    let last = *waits.last().unwrap();
    assert!(
        last > unmaps_before,
        "pages were given back before the last batch's copies completed: {waits:?}"
    );
    assert!(r.sim.calls("cuMemUnmap") > last, "and after it");
    assert_eq!(r.sim.physical_bytes(0), 0, "every page given back");
    assert!(!r.sim.work_in_flight(0));
    assert_eq!(r.sim.events_alive(0), 0, "no event left behind");
    r.device(0).wake().unwrap();
    assert!(all_hold(&r, &blocks));
    end(r, blocks);
}

/// Mappings that straddle batches (32 MiB spans, blocks of 40 and 24 MiB) and blocks of a
/// discarded tag between kept ones: a mapping goes back only once every batch copying a page of
/// it completed (the simulator refuses to unmap memory a pending copy reads: the page would stay
/// mapped), and every kept block wakes with its contents.
#[test]
fn mappings_across_batch_boundaries_wait_for_their_last_batch() {
    let r = vmm_rig_with_spans(1024 * MIB, 32 * MIB);
    let mut kept = Vec::new();
    let mut discarded = Vec::new();
    for i in 0..4u8 {
        let k = r.malloc(40 * MIB, 0, 1);
        fill(&r, k, 40 * MIB, 40 + i);
        kept.push(k);
        discarded.push(tagged(&r, Some("batches_kv"), 24 * MIB));
    }
    let seen = unmaps_at_each_wait(&r.sim);
    r.device(0).sleep(1, &["batches_kv"]).unwrap();
    r.sim.set_call_hooks(Vec::new());
    let waits = seen.lock().unwrap().clone();
    assert!(waits.len() >= 2 && waits[1] > waits[0], "{waits:?}");
    assert_eq!(r.sim.physical_bytes(0), 0, "every page given back");
    assert_eq!(r.sim.events_alive(0), 0);
    r.device(0).wake().unwrap();
    for (i, &k) in kept.iter().enumerate() {
        assert!(holds(&r, k, 40 * MIB, 40 + i as u8), "kept block {i}");
    }
    for p in kept.into_iter().chain(discarded) {
        r.free(p, 0);
    }
    r.finish();
}

#[test]
fn a_failed_wait_part_way_maps_back_what_was_given_back_with_its_contents() {
    let (r, blocks) = filled();
    let held = r.sim.physical_bytes(0);
    let (unmaps, maps) = (r.sim.calls("cuMemUnmap"), r.sim.calls("cuMemMap"));
    // The first batch's wait succeeds and its pages go back; the second's fails.
    r.sim.inject_fault_after(SimFault::StreamSynchronize, 1, 1);
    assert!(r.device(0).sleep(1, &[]).is_err());
    assert!(r.sim.calls("cuMemUnmap") > unmaps, "pages had gone back");
    assert!(r.sim.calls("cuMemMap") > maps, "and were mapped again");
    assert_eq!(r.device(0).sleeping_bytes(), 0, "awake");
    assert_eq!(r.sim.physical_bytes(0), held);
    assert!(!r.sim.work_in_flight(0));
    assert_eq!(r.sim.events_alive(0), 0);
    assert!(all_hold(&r, &blocks));
    awake_and_sleeps_again(&r);
    assert!(all_hold(&r, &blocks));
    end(r, blocks);
}

#[test]
fn pages_that_cannot_be_mapped_back_after_a_failed_wait_sleep_until_a_wake() {
    let (r, blocks) = filled();
    let calls = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    let weak = Arc::downgrade(&r.sim);
    // The second wait fails, and the first page created after it (mapping back what went) too.
    r.sim.inject_fault_after(SimFault::StreamSynchronize, 1, 1);
    let hook = move || {
        if counted.fetch_add(1, Ordering::SeqCst) == 1 {
            if let Some(sim) = weak.upgrade() {
                sim.inject_fault(SimFault::MemCreate, 1);
            }
        }
    };
    r.sim
        .set_call_hooks(vec![("cuEventSynchronize", Arc::new(hook))]);
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    r.sim.set_call_hooks(Vec::new());
    assert!(e.contains("failed part way") && e.contains("wake()"), "{e}");
    assert!(
        r.device(0).sleeping_bytes() > 0,
        "asleep with what went back"
    );
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("asleep already"), "{e}");
    r.device(0).wake().unwrap();
    assert_eq!(r.device(0).sleeping_bytes(), 0);
    assert!(all_hold(&r, &blocks));
    end(r, blocks);
}

#[test]
fn an_event_that_cannot_be_made_or_recorded_fails_the_sleep_before_anything_goes_back() {
    let (r, blocks) = filled();
    let held = r.sim.physical_bytes(0);
    // The second batch's event: the first batch's copies are queued, its event recorded.
    for fault in [SimFault::EventCreate, SimFault::EventRecord] {
        let unmaps = r.sim.calls("cuMemUnmap");
        r.sim.inject_fault_after(fault, 1, 1);
        assert!(r.device(0).sleep(1, &[]).is_err(), "{fault:?}");
        assert_eq!(
            r.sim.calls("cuMemUnmap"),
            unmaps,
            "{fault:?}: nothing went back"
        );
        assert_eq!(r.sim.physical_bytes(0), held, "{fault:?}");
        assert_eq!(r.device(0).sleeping_bytes(), 0, "{fault:?}: awake");
        assert!(!r.sim.work_in_flight(0), "{fault:?}");
        assert_eq!(r.sim.events_alive(0), 0, "{fault:?}: no event left behind");
        assert!(all_hold(&r, &blocks), "{fault:?}");
    }
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    assert!(all_hold(&r, &blocks));
    end(r, blocks);
}

//! The shared pieces of stream ordering on the simulator, whose events complete only when a test
//! completes their stream.

use super::*;
use crate::driver::sim::{SimDriver, SimFault};
use crate::driver::{Driver, Stream};

const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

#[test]
fn items_leave_oldest_first_and_only_once_all_their_events_completed() {
    let sim = SimDriver::new(1, 1 << 30);
    let (mut pool, mut queue) = (EventPool::default(), InOrder::default());
    let both = pool.record_each(&sim, 0, &[S1, S2]).unwrap();
    queue.push("both", both);
    let one = pool.record_each(&sim, 0, &[S1]).unwrap();
    queue.push("s1 only", one);
    let popped = |queue: &mut InOrder<&'static str>, pool: &mut EventPool| {
        let mut out = Vec::new();
        queue.pop_completed(&sim, 0, pool, |item| out.push(item));
        out
    };
    sim.complete_stream(0, S1);
    // "s1 only" is complete, but the older item still waits for S2: nothing leaves.
    assert!(popped(&mut queue, &mut pool).is_empty());
    sim.complete_stream(0, S2);
    assert_eq!(popped(&mut queue, &mut pool), ["both", "s1 only"]);
    assert!(queue.is_empty());
    // Their three events are spares now: recording three more creates none.
    let created = sim.calls("cuEventCreate");
    pool.record_each(&sim, 0, &[S1, S2, S1]).unwrap();
    assert_eq!(sim.calls("cuEventCreate"), created);
}

#[test]
fn items_taken_after_a_synchronisation_give_their_events_back_and_keep_the_rest_in_order() {
    let sim = SimDriver::new(1, 1 << 30);
    let (mut pool, mut queue) = (EventPool::default(), InOrder::default());
    for n in 0..4u64 {
        let events = pool.record_each(&sim, 0, &[S1]).unwrap();
        queue.push(n, events);
    }
    assert_eq!(queue.take_where(|&n| n % 2 == 0, &mut pool), [0, 2]);
    let left: Vec<u64> = queue.iter().map(|(&n, _)| n).collect();
    assert_eq!(left, [1, 3]);
    let created = sim.calls("cuEventCreate");
    pool.record_each(&sim, 0, &[S1, S2]).unwrap();
    assert_eq!(
        sim.calls("cuEventCreate"),
        created,
        "both taken items' events are reused"
    );
}

#[test]
fn items_taken_off_the_front_after_a_synchronisation_leave_the_rest_queued_in_order() {
    // The usual case: the GPU is past the oldest items, a run at the front.
    let sim = SimDriver::new(1, 1 << 30);
    let (mut pool, mut queue) = (EventPool::default(), InOrder::default());
    for n in 0..5u64 {
        let events = pool.record_each(&sim, 0, &[S1]).unwrap();
        queue.push(n, events);
    }
    assert_eq!(queue.take_where(|&n| n < 3, &mut pool), [0, 1, 2]);
    let left: Vec<u64> = queue.iter().map(|(&n, _)| n).collect();
    assert_eq!(left, [3, 4]);
    assert!(queue.take_where(|&n| n < 3, &mut pool).is_empty());
    assert_eq!(queue.take_where(|_| true, &mut pool), [3, 4]);
    assert!(queue.is_empty());
    let created = sim.calls("cuEventCreate");
    pool.record_each(&sim, 0, &[S1, S2, S1, S2, S1]).unwrap();
    assert_eq!(
        sim.calls("cuEventCreate"),
        created,
        "every taken item's events are reused"
    );
}

#[test]
fn a_failed_record_gives_every_event_taken_back() {
    let sim = SimDriver::new(1, 1 << 30);
    let mut pool = EventPool::default();
    sim.inject_fault(SimFault::EventRecord, 1);
    assert!(pool.record(&sim, 0, S1).is_err());
    let created = sim.calls("cuEventCreate");
    let event = pool.record(&sim, 0, S1).unwrap();
    assert_eq!(
        sim.calls("cuEventCreate"),
        created,
        "the event whose record failed is reused"
    );
    pool.give_back([event]);
    // The second record fails (its stream is gone): the first event, recorded, goes back too.
    sim.destroy_stream(0, S2);
    assert!(pool.record_each(&sim, 0, &[S1, S2]).is_err());
    let created = sim.calls("cuEventCreate");
    let events = pool.record_each(&sim, 0, &[S1, S1]).unwrap();
    assert_eq!(
        sim.calls("cuEventCreate"),
        created,
        "both events taken are reused"
    );
    pool.give_back(events);
    pool.destroy(&sim, 0);
}

#[test]
fn the_capture_watch_forgets_ended_and_destroyed_streams_and_asks_only_while_one_is_known() {
    let sim = SimDriver::new(1, 1 << 30);
    let driver: &dyn Driver = &sim;
    let mut watch = CaptureWatch::default();
    assert!(!watch.refresh(driver, 0));
    sim.begin_capture(0, S1);
    sim.begin_capture(0, S2);
    assert!(watch.note(S1));
    assert!(!watch.note(S1), "already known");
    assert!(watch.note(S2));
    sim.end_capture(0, S1);
    assert!(watch.refresh(driver, 0), "S2 still captures");
    sim.destroy_stream(0, S2);
    assert!(
        !watch.refresh(driver, 0),
        "a destroyed stream does not capture"
    );
    assert!(!watch.any_known());
}

#[test]
fn a_poll_queries_a_bounded_number_of_streams_and_polls_take_them_in_turn() {
    let sim = SimDriver::new(1, 1 << 30);
    let mut fences = Fences::default();
    let streams: Vec<Stream> = (0..200).map(|i| Stream(0x100 + i)).collect();
    for &stream in &streams {
        fences.free_on(stream, 0, 0);
        fences.record_pending(&sim, 0, stream).unwrap();
    }
    // The first half's work goes on; the second half's completed. A poll that always began at
    // the first stream would query only unfinished ones and never see the others.
    for &stream in &streams[100..] {
        sim.complete_stream(0, stream);
    }
    let mut seen = Vec::new();
    for _ in 0..200usize.div_ceil(fences::POLLED_STREAMS_MAX) {
        let queried = sim.calls("cuEventQuery");
        seen.extend(fences.poll_some(&sim, 0).into_iter().map(|(s, _)| s));
        assert!(sim.calls("cuEventQuery") - queried <= fences::POLLED_STREAMS_MAX as u64);
    }
    seen.sort();
    assert_eq!(seen, streams[100..]);
    assert!(fences.any_outstanding(), "the first half's fences stay");
    // A full poll queries them all.
    for &stream in &streams[..100] {
        sim.complete_stream(0, stream);
    }
    assert_eq!(fences.poll(&sim, 0).len(), 100);
    assert!(!fences.any_outstanding());
}

#[test]
fn after_a_synchronisation_with_nothing_freed_or_recorded_since_every_fence_completes_unasked() {
    let sim = SimDriver::new(1, 1 << 30);
    let mut fences = Fences::default();
    // S1: a recorded fence and a pending one behind it; S2: a pending one only.
    let (recorded, _) = fences.free_on(S1, 0, 0);
    fences.record_pending(&sim, 0, S1).unwrap();
    let (pending, _) = fences.free_on(S1, 0, 0);
    let (s2, _) = fences.free_on(S2, 0, 0);
    assert!(recorded < pending);
    let mark = fences.mark();
    sim.complete_all(); // the synchronisation
    let queries = sim.calls("cuEventQuery") + sim.calls("cuStreamQuery");
    let mut done = fences.complete_all_unchanged_since(mark).unwrap();
    done.sort();
    assert_eq!(
        done,
        [(S1, pending), (S2, s2)],
        "each stream's newest fence"
    );
    assert!(!fences.any_outstanding());
    let asked = sim.calls("cuEventQuery") + sim.calls("cuStreamQuery") - queries;
    assert_eq!(asked, 0, "nothing asked of the driver");
    // The recorded fence's event is a spare again: the next record creates none.
    let created = sim.calls("cuEventCreate");
    fences.free_on(S1, 0, 0);
    fences.record_pending(&sim, 0, S1).unwrap();
    assert_eq!(sim.calls("cuEventCreate"), created);
}

#[test]
fn a_free_or_a_record_after_the_synchronisation_began_leaves_the_fences_to_the_driver() {
    let sim = SimDriver::new(1, 1 << 30);
    // A free after the mark may join the pending fence of a free before it: its work was queued
    // after the synchronisation began, and may still run.
    let mut fences = Fences::default();
    fences.free_on(S1, 0, 0);
    let mark = fences.mark();
    fences.free_on(S1, 0, 0);
    assert_eq!(fences.complete_all_unchanged_since(mark), None);
    assert!(fences.any_outstanding(), "nothing completed");
    // A record after the mark: its event may still be queued behind later work, and is not
    // reused before it is seen complete.
    let mut fences = Fences::default();
    fences.free_on(S1, 0, 0);
    let mark = fences.mark();
    fences.record_pending(&sim, 0, S1).unwrap();
    assert_eq!(fences.complete_all_unchanged_since(mark), None);
    assert!(fences.any_outstanding());
}

#[test]
fn the_background_look_never_queries_a_stream_that_captures() {
    let sim = SimDriver::new(1, 1 << 30);
    let mut fences = Fences::default();
    // Pending fences on two idle streams; S1 begins a capture nobody told the fences of.
    let (s1, _) = fences.free_on(S1, 0, 0);
    let (s2, _) = fences.free_on(S2, 0, 0);
    sim.begin_capture(0, S1);
    let queries = sim.calls("cuStreamQuery");
    let done = fences.complete_pending_of_idle_streams(&sim, 0);
    assert_eq!(done, [(S2, s2)], "only the stream that does not capture");
    assert_eq!(
        sim.calls("cuStreamQuery") - queries,
        1,
        "a query of a capturing stream would end its capture"
    );
    // Once the capture has ended, its stream's pending fence completes as the others did.
    sim.end_capture(0, S1);
    assert_eq!(fences.complete_pending_of_idle_streams(&sim, 0), [(S1, s1)]);
}

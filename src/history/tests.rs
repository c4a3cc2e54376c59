use super::*;

fn record(h: &History, bytes: u64) {
    h.record(
        StreampoolEventKind::Alloc,
        0,
        Stream(0),
        DevicePtr(0x1000),
        bytes,
        Gauges::default,
    );
}

#[test]
fn off_records_nothing_and_never_evaluates_the_gauges() {
    let h = History::default();
    h.record(
        StreampoolEventKind::Alloc,
        0,
        Stream(0),
        DevicePtr(1),
        1,
        || panic!("gauges read while off"),
    );
    assert!(h.is_empty());
}

#[test]
fn events_are_in_time_order_across_threads() {
    let h = Arc::new(History::default());
    h.start(100_000).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let h = Arc::clone(&h);
            std::thread::spawn(move || (0..5_000).for_each(|i| record(&h, i)))
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let (events, _) = h.newest(usize::MAX);
    assert_eq!(events.len(), 20_000);
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
}

#[test]
fn a_recorder_notes_growth_and_trims_with_the_device_gauges() {
    let h = Arc::new(History::default());
    let r = Recorder::new(1, Arc::clone(&h));
    r.note_reserved(100, Stream(0), Gauges::default);
    assert!(h.is_empty(), "off: nothing");
    h.start(10).unwrap();
    let g = || Gauges {
        allocated_bytes: 7,
        ..Gauges::default()
    };
    r.note_reserved(300, Stream(2), g);
    r.note_reserved(300, Stream(2), g);
    r.note_trim(300, 50, Stream(0), g);
    r.note_resource(StreampoolEventKind::Map, DevicePtr(0x2000), 64, 114);
    let (events, _) = h.newest(usize::MAX);
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.kind, e.bytes, e.reserved_bytes, e.allocated_bytes))
        .collect();
    let (grow, trim, map) = (
        StreampoolEventKind::PoolGrow as u32,
        StreampoolEventKind::PoolTrim as u32,
        StreampoolEventKind::Map as u32,
    );
    assert_eq!(
        seen,
        [(grow, 200, 300, 7), (trim, 250, 50, 7), (map, 64, 114, 7)]
    );
    assert!(events.iter().all(|e| e.device == 1));
}

#[test]
fn a_full_ring_drops_its_oldest_and_counts_them() {
    let h = History::default();
    h.start(3).unwrap();
    for bytes in 1..=5 {
        record(&h, bytes);
    }
    let (events, dropped) = h.newest(usize::MAX);
    assert_eq!(
        events.iter().map(|e| e.bytes).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert_eq!(dropped, 2);
    let (newest, _) = h.newest(2);
    assert_eq!(newest.iter().map(|e| e.bytes).collect::<Vec<_>>(), [4, 5]);
}

#[test]
fn stop_keeps_the_events_and_start_clears_them() {
    let h = History::default();
    h.start(10).unwrap();
    record(&h, 1);
    h.stop();
    record(&h, 2);
    assert_eq!(h.len(), 1);
    h.start(10).unwrap();
    assert!(h.is_empty());
    assert!(h.start(0).is_err());
}

unsafe extern "C" fn gather_site(kind: std::ffi::c_int) -> u64 {
    100 + kind as u64
}

#[test]
fn events_carry_the_context_of_their_entry_and_live_blocks_keep_theirs() {
    let h = History::default();
    h.start(2).unwrap();
    let at = |kind, address| h.record(kind, 0, Stream(0), DevicePtr(address), 64, Gauges::default);
    {
        let _outside = contexts::enter(contexts::GATHER_ALLOC);
        at(StreampoolEventKind::Alloc, 0x1000); // no gatherer: no context
    }
    contexts::set_gatherer(Some(gather_site), contexts::GATHER_ALLOC);
    {
        let _alloc = contexts::enter(contexts::GATHER_ALLOC);
        at(StreampoolEventKind::Alloc, 0x2000);
        at(StreampoolEventKind::PoolAlloc, 0x2000);
    }
    {
        let _free = contexts::enter(contexts::GATHER_FREE); // not asked for at frees
        at(StreampoolEventKind::Free, 0x1000);
    }
    contexts::set_gatherer(None, 0);
    at(StreampoolEventKind::Alloc, 0x3000);
    let (events, ids, dropped) = h.newest_with_contexts(usize::MAX);
    assert_eq!(events.len(), 2, "the ring keeps its newest two");
    assert_eq!(
        ids,
        [0, 0],
        "the free had no context, nor the allocation after the gatherer went"
    );
    assert_eq!(dropped, 3);
    assert_eq!(contexts::current(), 0, "a scope's context ends with it");
    let mut live = h.live_contexts(0);
    live.sort();
    assert_eq!(
        live,
        [(0x2000, 101)],
        "kept though the ring dropped its event"
    );
    at(StreampoolEventKind::Free, 0x2000);
    let (_, ids, _) = h.newest_with_contexts(usize::MAX);
    assert_eq!(
        ids,
        [0, 101],
        "a free without a context carries its allocation's"
    );
    assert!(h.live_contexts(0).is_empty());
    h.start(4).unwrap();
    assert!(h.live_contexts(0).is_empty(), "a new start forgets them");
}

/// The process-wide switch counts the timelines that record, each once, through restarts, repeated
/// stops, drops while recording and racing threads (the switches are the process's: the check runs
/// alone, in a child process of this test binary).
#[test]
fn the_recordings_switch_counts_each_recording_timeline_once() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "history::tests::recordings_alone", "--ignored"])
        .args(["--test-threads=1", "--nocapture"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
}

#[test]
#[ignore = "run alone, in a process of its own, by the test above"]
fn recordings_alone() {
    use crate::switches::SWITCHES;
    let count = || SWITCHES.recordings.load(Ordering::Relaxed);
    assert_eq!(count(), 0);
    let (a, b) = (History::default(), History::default());
    a.start(4).unwrap();
    a.start(4).unwrap();
    assert_eq!(count(), 1, "a restart is not a second timeline");
    b.start(4).unwrap();
    assert_eq!(count(), 2);
    b.stop();
    b.stop();
    assert_eq!(count(), 1, "a second stop takes nothing");
    drop(b);
    assert_eq!(count(), 1, "dropped while off");
    drop(a);
    assert_eq!(count(), 0, "dropped while recording");
    let h = Arc::new(History::default());
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let h = Arc::clone(&h);
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    match i % 2 {
                        0 => h.start(1).unwrap(),
                        _ => h.stop(),
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(count(), usize::from(h.enabled.load(Ordering::Relaxed)));
    drop(h);
    assert_eq!(count(), 0);
}

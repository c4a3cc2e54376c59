//! The kept blocks on their own: a block serves its size once, the newest first; the oldest goes
//! back when the ring comes round; and the blocks stay only while requests reuse recent sizes.

use super::*;

fn slot(start: u64, bytes: u64, stream: usize) -> Slot {
    Slot {
        start,
        bytes,
        stream: Stream(stream),
        seq: start,
        freed_ms: 0,
    }
}

/// Every kept block, the oldest first.
fn all(kept: &mut Kept) -> Vec<Slot> {
    std::iter::from_fn(|| kept.take_oldest()).collect()
}

fn start(found: Found) -> u64 {
    match found {
        Found::Kept(slot) => slot.start,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_block_serves_its_size_once_newest_first_and_the_stream_is_the_callers() {
    let mut kept = Kept::default();
    assert!(!kept.holds_other_than(Stream(1)), "nothing kept");
    assert_eq!(kept.keep(slot(0x1000, 512, 1)), None);
    assert_eq!(kept.keep(slot(0x2000, 512, 1)), None);
    assert_eq!(kept.keep(slot(0x4000, 1024, 1)), None);
    assert!(kept.holds_other_than(Stream(2)) && !kept.holds_other_than(Stream(1)));
    assert!(!matches!(kept.take(1536), Found::Kept(_)), "another size");
    assert_eq!(start(kept.take(512)), 0x2000, "the newest");
    assert_eq!(start(kept.take(512)), 0x1000);
    assert!(!matches!(kept.take(512), Found::Kept(_)), "taken once");
    assert_eq!(all(&mut kept), [slot(0x4000, 1024, 1)]);
    assert!(!kept.holds_other_than(Stream(2)), "none kept");
    assert!(!matches!(kept.take(1024), Found::Kept(_)), "given back");
    assert_eq!(
        kept.keep(slot(0x3000, 512, 2)),
        None,
        "another stream once none is kept"
    );
    match kept.take(512) {
        Found::Kept(s) => assert_eq!((s.start, s.stream), (0x3000, Stream(2))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_oldest_goes_back_when_more_come_and_all_go_back_oldest_first() {
    let mut kept = Kept::default();
    let n = KEPT_BLOCKS as u64;
    for i in 0..n {
        assert_eq!(kept.keep(slot(0x1000 * (i + 1), 512 * (i + 1), 1)), None);
    }
    // A reuse leaves a hole: the free that reaches it displaces nothing.
    assert_eq!(start(kept.take(512)), 0x1000);
    assert_eq!(kept.keep(slot(0x100_0000, 512, 1)), None);
    let displaced = kept.keep(slot(0x200_0000, 512, 1)).unwrap();
    assert_eq!(displaced, slot(0x2000, 1024, 1), "the oldest left");
    assert!(!matches!(kept.take(1024), Found::Kept(_)), "no longer kept");
    let starts: Vec<u64> = all(&mut kept).iter().map(|s| s.start).collect();
    let mut want: Vec<u64> = (3..=n).map(|i| 0x1000 * i).collect();
    want.extend([0x100_0000, 0x200_0000]);
    assert_eq!(starts, want, "oldest first");
    assert!(kept.take_oldest().is_none());
}

/// Requests of the sizes just freed keep the blocks; requests of other sizes give them back at
/// each miss (blocks of random sizes held out of the ranges cost the replayed churn 20% more
/// page maps). A block given back early counts as a reuse the ring would have served.
#[test]
fn blocks_stay_while_requests_reuse_recent_sizes_and_go_back_while_they_do_not() {
    let mut kept = Kept::default();
    assert_eq!(kept.take(512), Found::GiveBack, "nothing reused yet");
    // A loop over a few sizes, the blocks given back at each miss: every request finds its
    // size among the recent frees, so the blocks soon stay.
    let sizes = [512, 1024, 4096];
    let mut answers = Vec::new();
    for round in 0..8u64 {
        for (k, &bytes) in sizes.iter().enumerate() {
            kept.keep(slot(0x1000 * (round * 3 + k as u64 + 1), bytes, 1));
        }
        all(&mut kept); // as a miss that gives back would
        answers.push(kept.take(sizes[0]));
    }
    assert_eq!(answers[0], Found::GiveBack, "one reuse is not enough");
    assert_eq!(*answers.last().unwrap(), Found::Keep, "{answers:?}");
    // Then sizes never freed: the blocks go back at each miss again.
    let mut last = Found::Keep;
    for bytes in (1..40).map(|i| 100_000 + 512 * i) {
        last = kept.take(bytes);
    }
    assert_eq!(last, Found::GiveBack);
}

//! The free-range bookkeeping on its own: fitting, merging, readiness, pages, windows.

use super::*;

const PAGE: u64 = 2 << 20;
const BASE: u64 = 0x1000_0000;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

/// An extent of `pages` pages, the first `mapped` of them mapped and ready.
fn ranges(pages: u64, mapped: u64) -> FreeRanges {
    let mut r = FreeRanges::new(PAGE);
    r.add_extent(BASE, pages * PAGE);
    for i in 0..mapped {
        r.retag(BASE + i * PAGE, State::Unmapped, State::Ready);
    }
    r
}

#[test]
fn mapped_pages_merge_into_one_ready_range_and_fit_by_best_size() {
    let mut r = ranges(8, 3);
    assert_eq!(
        r.snapshot(),
        [
            (BASE, 3 * PAGE, State::Ready),
            (BASE + 3 * PAGE, 5 * PAGE, State::Unmapped)
        ]
    );
    assert_eq!(r.best_fit(3 * PAGE, S1), Some(BASE));
    assert_eq!(
        r.best_fit(3 * PAGE + 512, S1),
        None,
        "unmapped memory does not fit"
    );
    r.take(BASE + PAGE, PAGE);
    // Two ready holes: 1 page and 1 page; a half-page request takes the first by address.
    assert_eq!(r.best_fit(PAGE / 2, S2), Some(BASE));
    r.give(BASE + PAGE, PAGE, State::Ready);
    assert_eq!(
        r.snapshot()[0],
        (BASE, 3 * PAGE, State::Ready),
        "coalesced again"
    );
}

#[test]
fn a_freed_range_serves_its_stream_at_once_and_others_after_its_fence() {
    let mut r = ranges(4, 2);
    r.take(BASE, 2 * PAGE);
    r.give(BASE, PAGE, State::Freed { stream: S1, seq: 5 });
    assert_eq!(r.best_fit(PAGE, S1), Some(BASE));
    assert_eq!(r.best_fit(PAGE, S2), None, "not before the fence");
    assert_eq!(r.streams_waited_for(), [S1]);
    r.promote(S1, 4);
    assert_eq!(r.best_fit(PAGE, S2), None, "fence 5 has not completed");
    r.promote(S1, 5);
    assert_eq!(r.best_fit(PAGE, S2), Some(BASE));
    assert!(r.streams_waited_for().is_empty());
    assert_eq!(r.freed_bytes(), 0);
}

#[test]
fn neighbours_merge_only_when_ready_for_the_same_streams() {
    let mut r = ranges(4, 4);
    r.take(BASE, 4 * PAGE);
    r.give(BASE, PAGE, State::Freed { stream: S1, seq: 1 });
    r.give(BASE + PAGE, PAGE, State::Freed { stream: S1, seq: 3 });
    r.give(BASE + 2 * PAGE, PAGE, State::Freed { stream: S2, seq: 2 });
    r.give(BASE + 3 * PAGE, PAGE, State::Ready);
    assert_eq!(
        r.snapshot(),
        [
            (BASE, 2 * PAGE, State::Freed { stream: S1, seq: 3 }),
            (BASE + 2 * PAGE, PAGE, State::Freed { stream: S2, seq: 2 }),
            (BASE + 3 * PAGE, PAGE, State::Ready),
        ],
        "the merged range waits for the later fence"
    );
    r.promote(S2, 2);
    r.promote(S1, 3);
    assert_eq!(r.snapshot(), [(BASE, 4 * PAGE, State::Ready)]);
}

#[test]
fn ranges_never_merge_across_extents() {
    let mut r = ranges(2, 2);
    r.add_extent(BASE + 2 * PAGE, 4 * PAGE);
    r.retag(BASE + 2 * PAGE, State::Unmapped, State::Ready);
    assert_eq!(r.snapshot().len(), 3);
    assert_eq!(r.best_fit(2 * PAGE + 512, S1), None);
    let w = r
        .window(3 * PAGE, S1, false)
        .expect("the second extent has room");
    assert_eq!(
        w.start,
        BASE + 2 * PAGE,
        "a window never spans two reservations"
    );
}

#[test]
fn idle_pages_are_whole_ready_pages_outside_the_kept_window() {
    let mut r = ranges(6, 6);
    // Live: [0.5p, 1.5p) and [3p, 3.25p). Free: [0, .5p), [1.5p, 3p), [3.25p, 6p).
    r.take(BASE + PAGE / 2, PAGE);
    r.take(BASE + 3 * PAGE, PAGE / 4);
    let mut idle = r.idle_pages(0, 0);
    idle.sort();
    assert_eq!(idle, [BASE + 2 * PAGE, BASE + 4 * PAGE, BASE + 5 * PAGE]);
    let kept = r.idle_pages(BASE + 4 * PAGE, BASE + 5 * PAGE);
    assert!(!kept.contains(&(BASE + 4 * PAGE)));
    r.mark_unmapped(BASE + 4 * PAGE);
    assert!(r
        .snapshot()
        .contains(&(BASE + 4 * PAGE, PAGE, State::Unmapped)));
    assert!(!r.idle_pages(0, 0).contains(&(BASE + 4 * PAGE)));
}

#[test]
fn a_window_maps_the_fewest_pages_and_may_use_the_streams_own_freed_memory() {
    let mut r = ranges(8, 4);
    // Live [0, 1p); freed by S1 [1p, 3p); ready [3p, 4p); unmapped [4p, 8p).
    r.take(BASE, 4 * PAGE);
    r.give(BASE + PAGE, 2 * PAGE, State::Freed { stream: S1, seq: 1 });
    r.give(BASE + 3 * PAGE, PAGE, State::Ready);
    let w = r.window(4 * PAGE, S1, false).unwrap();
    assert_eq!(
        w,
        Window {
            start: BASE + PAGE,
            pages: vec![BASE + 4 * PAGE],
            waits: vec![]
        }
    );
    let w = r.window(4 * PAGE, S2, false).unwrap();
    assert_eq!(
        w,
        Window {
            start: BASE + 3 * PAGE,
            pages: vec![BASE + 4 * PAGE, BASE + 5 * PAGE, BASE + 6 * PAGE],
            waits: vec![]
        },
        "S2 may not use S1's freed memory without waiting"
    );
    assert_eq!(
        r.window(4 * PAGE, S2, true).unwrap(),
        Window {
            start: BASE + PAGE,
            pages: vec![BASE + 4 * PAGE],
            waits: vec![(S1, 1)]
        },
        "or after waiting for S1's fence: one page to map instead of three"
    );
    assert_eq!(
        r.window(8 * PAGE, S1, false),
        None,
        "live memory is in the way"
    );
}

#[test]
fn an_unaligned_window_maps_every_page_it_touches() {
    let mut r = ranges(4, 1);
    r.take(BASE, PAGE - 512);
    let w = r.window(PAGE, S1, false).unwrap();
    assert_eq!(w.start, BASE + PAGE - 512);
    assert_eq!(w.pages, [BASE + PAGE]);
    r.retag(BASE + PAGE, State::Unmapped, State::Ready);
    assert_eq!(r.best_fit(PAGE, S1), Some(BASE + PAGE - 512));
    r.take(w.start, PAGE);
    assert_eq!(
        r.snapshot(),
        [
            (BASE + 2 * PAGE - 512, 512, State::Ready),
            (BASE + 2 * PAGE, 2 * PAGE, State::Unmapped)
        ]
    );
}

#[test]
fn of_two_windows_the_one_with_fewer_pages_to_map_wins_even_at_a_higher_address() {
    let mut r = ranges(8, 8);
    // Unmapped [0, 3p); live [3p, 4p); ready [4p, 6p); unmapped [6p, 7p); live [7p, 8p).
    r.take(BASE + 3 * PAGE, PAGE);
    r.take(BASE + 7 * PAGE, PAGE);
    for page in [0, 1, 2, 6] {
        r.mark_unmapped(BASE + page * PAGE);
    }
    assert_eq!(r.cover(BASE, BASE + 3 * PAGE, S1, None).pages, 3);
    assert_eq!(r.cover(BASE + 4 * PAGE, BASE + 7 * PAGE, S1, None).pages, 1);
    let w = r.window(3 * PAGE, S1, false).unwrap();
    assert_eq!(
        w,
        Window {
            start: BASE + 4 * PAGE,
            pages: vec![BASE + 6 * PAGE],
            waits: vec![]
        },
        "one page to map, not three"
    );
}

#[test]
fn unmapped_and_blocked_neighbours_merge_into_one_range_each() {
    let mut r = ranges(4, 4);
    r.mark_unmapped(BASE);
    r.mark_unmapped(BASE + PAGE);
    r.mark_unmapped(BASE + 2 * PAGE);
    r.retag(BASE + PAGE, State::Unmapped, State::Blocked);
    r.retag(BASE + 2 * PAGE, State::Unmapped, State::Blocked);
    assert_eq!(
        r.snapshot(),
        [
            (BASE, PAGE, State::Unmapped),
            (BASE + PAGE, 2 * PAGE, State::Blocked),
            (BASE + 3 * PAGE, PAGE, State::Ready)
        ]
    );
    r.retag(BASE + PAGE, State::Blocked, State::Unmapped);
    r.retag(BASE + 2 * PAGE, State::Blocked, State::Unmapped);
    assert_eq!(
        r.snapshot(),
        [
            (BASE, 3 * PAGE, State::Unmapped),
            (BASE + 3 * PAGE, PAGE, State::Ready)
        ]
    );
}

#[test]
fn memory_freed_on_a_stream_absorbs_ready_neighbours_and_serves_it_as_one_block() {
    let mut r = ranges(6, 6);
    r.take(BASE, 6 * PAGE);
    r.give(BASE, PAGE, State::Ready);
    r.give(BASE + 2 * PAGE, 4 * PAGE, State::Ready);
    // Freed on S1 between ready memory: one range, which S1 may use at once as one block (best
    // fit sees its whole size), and S2 after the fence.
    let freed = State::Freed { stream: S1, seq: 4 };
    r.give(BASE + PAGE, PAGE, freed);
    assert_eq!(r.snapshot(), [(BASE, 6 * PAGE, freed)]);
    assert_eq!(r.best_fit(6 * PAGE, S1), Some(BASE));
    assert_eq!(r.best_fit(PAGE, S2), None, "not before S1's fence");
    r.promote(S1, 4);
    assert_eq!(r.snapshot(), [(BASE, 6 * PAGE, State::Ready)]);
    // Ready memory given back beside memory that still waits for a fence stays apart: it is
    // ready for every stream, the other only for its own.
    r.take(BASE, 2 * PAGE);
    r.give(BASE, PAGE, State::Freed { stream: S2, seq: 5 });
    r.give(BASE + PAGE, PAGE, State::Ready);
    assert_eq!(
        r.snapshot(),
        [
            (BASE, PAGE, State::Freed { stream: S2, seq: 5 }),
            (BASE + PAGE, 5 * PAGE, State::Ready)
        ]
    );
}

/// The free ranges as a plain model would keep them: one ordered map, neighbours found by
/// address, every change written at once. The bookkeeping must agree with it after any sequence.
#[derive(Default)]
struct Model {
    extents: Vec<u64>,
    ranges: BTreeMap<u64, (u64, State)>,
}

impl Model {
    fn give(&mut self, start: u64, bytes: u64, state: State) {
        let (mut start, mut bytes, mut state) = (start, bytes, state);
        loop {
            let left = self.ranges.range(..start).next_back();
            let left =
                left.filter(|(&s, &(b, _))| s + b == start && !self.extents.contains(&start));
            if let Some((&s, &(b, st))) = left {
                if let Some(merged) = state.absorbs(st) {
                    self.ranges.remove(&s);
                    (start, bytes, state) = (s, b + bytes, merged);
                    continue;
                }
            }
            let end = start + bytes;
            if let Some(&(b, st)) = self
                .ranges
                .get(&end)
                .filter(|_| !self.extents.contains(&end))
            {
                if let Some(merged) = state.absorbs(st) {
                    self.ranges.remove(&end);
                    (bytes, state) = (bytes + b, merged);
                    continue;
                }
            }
            self.ranges.insert(start, (bytes, state));
            return;
        }
    }

    fn take(&mut self, start: u64, bytes: u64) {
        let (b, st) = self.ranges.remove(&start).expect("a range at the start");
        if b > bytes {
            self.ranges.insert(start + bytes, (b - bytes, st));
        }
    }

    fn promote(&mut self, stream: Stream, completed_seq: u64) {
        let mut done: Vec<(u64, u64)> = (self.ranges.iter())
            .filter(|(_, (_, st))| {
                matches!(st, State::Freed { stream: s, seq } if *s == stream && *seq <= completed_seq)
            })
            .map(|(&s, &(b, _))| (b, s))
            .collect();
        done.sort_unstable();
        for (bytes, start) in done {
            self.ranges.remove(&start);
            self.give(start, bytes, State::Ready);
        }
    }

    fn retag(&mut self, page: u64, from: State, to: State) {
        let (&s, &(b, _)) = self.ranges.range(..=page).next_back().expect("a range");
        self.ranges.remove(&s);
        if s < page {
            self.ranges.insert(s, (page - s, from));
        }
        if page + PAGE < s + b {
            self.ranges.insert(page + PAGE, (s + b - page - PAGE, from));
        }
        self.give(page, PAGE, to);
    }

    fn snapshot(&self) -> Vec<(u64, u64, State)> {
        self.ranges
            .iter()
            .map(|(&s, &(b, st))| (s, b, st))
            .collect()
    }
}

/// Every range has its end entry and its size entry, and nothing else is there.
fn assert_consistent(r: &FreeRanges) {
    assert_eq!(
        r.by_end.len(),
        r.ranges.len(),
        "an end entry without its range"
    );
    let mut ready = Vec::new();
    let mut freed: BTreeMap<Stream, Vec<(u64, u64)>> = BTreeMap::new();
    for (start, range) in r.ranges.iter() {
        assert_eq!(
            r.by_end.get(start + range.bytes),
            Some(&start),
            "end of {start:#x}"
        );
        match range.state {
            State::Ready => ready.push((range.bytes, start)),
            State::Freed { stream, .. } => {
                freed.entry(stream).or_default().push((range.bytes, start))
            }
            _ => {}
        }
    }
    ready.sort_unstable();
    assert_eq!(
        r.ready_by_size.iter().collect::<Vec<_>>(),
        ready,
        "the ready size index"
    );
    for (stream, index) in r.freed_by_size.iter() {
        let mut want = freed.remove(&stream).unwrap_or_default();
        want.sort_unstable();
        assert_eq!(
            index.iter().collect::<Vec<_>>(),
            want,
            "the size index of {stream:?}"
        );
    }
    assert!(
        freed.is_empty(),
        "freed ranges of a stream without a size index: {freed:?}"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Take(usize, u64),
    Give(usize, u8),
    Promote(bool, u64),
    Map(usize),
    Unmap(usize),
    /// An unmapped page mapped with memory a stream freed (a lent or moved page keeps its
    /// state): it may merge twice to the left while the order is kept.
    MapFreed(usize, bool),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (any::<usize>(), 1..3 * PAGE).prop_map(|(i, b)| Op::Take(i, b)),
        4 => (any::<usize>(), 0..3u8).prop_map(|(i, s)| Op::Give(i, s)),
        1 => (any::<bool>(), 0..4u64).prop_map(|(s, back)| Op::Promote(s, back)),
        1 => any::<usize>().prop_map(Op::Map),
        1 => any::<usize>().prop_map(Op::Unmap),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, s)| Op::MapFreed(i, s)),
    ]
}

proptest::proptest! {
    #[test]
    fn takes_gives_promotions_and_page_changes_agree_with_a_plain_model(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        let (mut r, mut model) = (FreeRanges::new(PAGE), Model::default());
        for (base, pages) in [(BASE, 8), (BASE + 8 * PAGE, 4)] {
            r.add_extent(base, pages * PAGE);
            model.extents.push(base);
            model.ranges.insert(base, (pages * PAGE, State::Unmapped));
        }
        let (mut live, mut seq) = (Vec::new(), 0u64);
        let pages = |m: &Model, want: State| -> Vec<u64> {
            let whole = m.ranges.iter().filter(|(_, (_, st))| *st == want);
            whole.flat_map(|(&s, &(b, _))| {
                let first = BASE + (s - BASE).div_ceil(PAGE) * PAGE;
                (first..).step_by(PAGE as usize).take_while(move |p| p + PAGE <= s + b)
            }).collect()
        };
        for op in ops {
            match op {
                Op::Take(i, bytes) => {
                    let usable: Vec<_> = model.snapshot().into_iter()
                        .filter(|(_, _, st)| st.is_mapped_free()).collect();
                    if usable.is_empty() { continue; }
                    let (start, len, _) = usable[i % usable.len()];
                    let bytes = bytes.min(len);
                    r.take(start, bytes);
                    model.take(start, bytes);
                    live.push((start, bytes));
                }
                Op::Give(i, s) if !live.is_empty() => {
                    let (start, bytes) = live.swap_remove(i % live.len());
                    seq += 1;
                    let state = match s {
                        0 => State::Ready,
                        1 => State::Freed { stream: S1, seq },
                        _ => State::Freed { stream: S2, seq },
                    };
                    r.give(start, bytes, state);
                    model.give(start, bytes, state);
                }
                Op::Give(..) => continue,
                Op::Promote(first, back) => {
                    let stream = if first { S1 } else { S2 };
                    r.promote(stream, seq.saturating_sub(back));
                    model.promote(stream, seq.saturating_sub(back));
                }
                Op::Map(i) | Op::Unmap(i) | Op::MapFreed(i, _) => {
                    let (from, to) = match op {
                        Op::Map(_) => (State::Unmapped, State::Ready),
                        Op::MapFreed(_, first) => {
                            let stream = if first { S1 } else { S2 };
                            (State::Unmapped, State::Freed { stream, seq })
                        }
                        _ => (State::Ready, State::Unmapped),
                    };
                    let candidates = pages(&model, from);
                    if candidates.is_empty() { continue; }
                    let page = candidates[i % candidates.len()];
                    r.retag(page, from, to);
                    model.retag(page, from, to);
                }
            }
            proptest::prop_assert_eq!(r.snapshot(), model.snapshot());
            assert_consistent(&r);
        }
    }
}

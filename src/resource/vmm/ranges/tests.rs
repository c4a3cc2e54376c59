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

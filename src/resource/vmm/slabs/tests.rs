//! The slabs on their own: the classes, and slots handed out and taken back against a plain
//! model of which slot is live.

use super::*;
use std::collections::BTreeMap;

const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

#[test]
fn every_size_gets_the_smallest_class_that_holds_it_and_a_rounded_one_loses_a_quarter_at_most() {
    assert_eq!(class_of(SLAB_MAX_BYTES), CLASSES - 1);
    assert_eq!(class_bytes(CLASSES - 1), SLAB_MAX_BYTES);
    for bytes in 0..=SLAB_MAX_BYTES {
        let class = class_of(bytes);
        let held = class_bytes(class);
        assert!(held >= bytes.max(1), "{bytes} B in a class of {held} B");
        if class > 0 {
            assert!(
                class_bytes(class - 1) < bytes,
                "{bytes} B fits class {}",
                class - 1
            );
        }
        // The device rounds every request to 512 bytes: those lose at most a quarter.
        if bytes > 0 && bytes % FINE_STEP_BYTES == 0 {
            assert!(4 * held <= 5 * bytes, "{bytes} B in {held} B");
        }
    }
    for class in 0..CLASSES {
        assert_eq!(class_bytes(class) % FINE_STEP_BYTES, 0, "class {class}");
        assert!(slab_bytes(class) <= SLAB_BYTES && slots_of(class) <= MAX_SLOTS);
        assert!(slots_of(class) >= 4, "class {class}: a slab of few slots");
    }
}

#[test]
fn a_slot_freed_serves_its_stream_and_class_again_and_no_other() {
    let mut s = Slabs::default();
    let a = s.add(0x10_0000, 1024, S1);
    assert_eq!(a, 0x10_0000, "the slab's first slot");
    let b = s.take(1000, S1).expect("a second slot of the 1 KiB slab");
    assert_eq!(b, a + 1024);
    assert_eq!(s.take(1024, S2), None, "another stream has no slab");
    assert_eq!(s.take(2048, S1), None, "another class has no slab");
    assert_eq!(
        s.give(a, State::Ready, 5),
        Some(None),
        "not empty: b is live"
    );
    assert_eq!(
        s.take(512 + 1, S1),
        Some(a),
        "the freed slot, first free bit"
    );
    assert_eq!(
        s.give(a + 512, State::Ready, 5),
        None,
        "no slot starts there"
    );
}

#[test]
fn a_slab_that_empties_beside_another_goes_back_behind_the_latest_fence_its_frees_took() {
    let mut s = Slabs::default();
    let (bytes, class) = (SLAB_MAX_BYTES, class_of(SLAB_MAX_BYTES));
    let first = s.add(0x10_0000, bytes, S1);
    let mut live: Vec<u64> = (1..slots_of(class))
        .map(|_| s.take(bytes, S1).unwrap())
        .collect();
    assert_eq!(s.take(bytes, S1), None, "full");
    let second = s.add(0x20_0000, bytes, S1);
    live.push(first);
    let freed = |seq| State::Freed { stream: S1, seq };
    let last = live.pop().unwrap();
    // The frees' fences out of order: the slab keeps the latest (seq 5), not the last given.
    for (i, &slot) in live.iter().enumerate() {
        assert_eq!(s.give(slot, freed([5, 1, 2][i % 3]), 7), Some(None));
    }
    let emptied = s
        .give(last, freed(3), 9)
        .unwrap()
        .expect("empty beside an open slab");
    assert_eq!(
        emptied,
        Emptied {
            start: 0x10_0000,
            bytes: slab_bytes(class),
            stream: S1,
            state: freed(5),
            freed_ms: 9
        }
    );
    assert_eq!(s.give(first, State::Ready, 9), None, "its slots are gone");
    // The only open slab is kept empty, then given back by take_empty.
    assert_eq!(s.give(second, freed(4), 10), Some(None));
    assert_eq!(s.take_empty().len(), 1);
    assert!(s.open.is_empty() && s.slot_owner.is_empty());
}

#[test]
fn a_free_on_another_stream_than_the_slabs_is_refused_and_the_slot_stays_out() {
    let mut s = Slabs::default();
    let a = s.add(0x10_0000, 2048, S1);
    let other = State::Freed { stream: S2, seq: 4 };
    assert_eq!(s.give(a, other, 1), None, "S1's slot freed on S2");
    assert_ne!(
        s.take(2048, S1),
        Some(a),
        "not handed to S1 before S2's work is done"
    );
    assert_eq!(
        s.give(a, State::Ready, 1),
        Some(None),
        "once its work is done it comes back"
    );
}

#[test]
fn empty_slabs_are_kept_for_a_few_streams_only() {
    let mut s = Slabs::default();
    let mut emptied = 0;
    for i in 0..(KEPT_EMPTY as u64 + 10) {
        let stream = Stream(100 + i as usize);
        let a = s.add(0x100_0000 + i * SLAB_BYTES, 4096, stream);
        emptied += s.give(a, State::Ready, 1).unwrap().is_some() as usize;
    }
    assert_eq!(emptied, 10, "past the kept ones, an emptied slab goes back");
    assert_eq!(s.take_empty().len(), KEPT_EMPTY);
    assert!(s.open.is_empty(), "no stream keeps an entry");
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    /// A block of these bytes on stream 1 or 2.
    Take(u64, bool),
    /// Frees the i-th live block (modulo their count).
    Give(usize),
    TakeEmpty,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (1..=SLAB_MAX_BYTES, any::<bool>()).prop_map(|(b, s)| Op::Take(b, s)),
        3 => any::<usize>().prop_map(Op::Give),
        1 => Just(Op::TakeEmpty),
    ]
}

proptest::proptest! {
    /// Slots never overlap a live one and lie inside a slab of their stream and class; every
    /// slab comes back exactly once, whole; at the end nothing is left.
    #[test]
    fn slots_and_slabs_agree_with_a_plain_model(ops in proptest::collection::vec(op(), 1..300)) {
        let mut s = Slabs::default();
        // slab start -> (end, stream, class); live slot start -> (bytes, stream, class).
        let mut slabs: BTreeMap<u64, (u64, Stream, usize)> = BTreeMap::new();
        let mut live: BTreeMap<u64, (u64, Stream, usize)> = BTreeMap::new();
        let mut next_slab = 0x1000_0000u64;
        let gone = |slabs: &mut BTreeMap<u64, (u64, Stream, usize)>, e: Emptied| {
            let (end, stream, class) = slabs.remove(&e.start).expect("a slab given back twice");
            proptest::prop_assert_eq!((e.bytes, e.stream), (end - e.start, stream));
            proptest::prop_assert_eq!(e.bytes, slab_bytes(class));
            Ok(())
        };
        for op in ops {
            match op {
                Op::Take(bytes, two) => {
                    let stream = if two { S2 } else { S1 };
                    let class = class_of(bytes);
                    let start = match s.take(bytes, stream) {
                        Some(start) => start,
                        None => {
                            let start = next_slab;
                            next_slab += SLAB_BYTES;
                            slabs.insert(start, (start + slab_bytes(class), stream, class));
                            s.add(start, bytes, stream)
                        }
                    };
                    let (&base, &(end, owner, c)) =
                        slabs.range(..=start).next_back().expect("inside a slab");
                    proptest::prop_assert!(start + class_bytes(class) <= end);
                    proptest::prop_assert_eq!((owner, c), (stream, class));
                    proptest::prop_assert_eq!((start - base) % class_bytes(class), 0);
                    proptest::prop_assert!(live.insert(start, (bytes, stream, class)).is_none());
                }
                Op::Give(i) => {
                    if live.is_empty() { continue; }
                    let start = *live.keys().nth(i % live.len()).unwrap();
                    live.remove(&start);
                    if let Some(e) = s.give(start, State::Ready, 1).expect("a live slot") {
                        gone(&mut slabs, e)?;
                        proptest::prop_assert!(!live.keys().any(|&l| l >= e.start && l < e.start + e.bytes));
                    }
                }
                Op::TakeEmpty => {
                    for e in s.take_empty() {
                        gone(&mut slabs, e)?;
                    }
                }
            }
            // The slabs with no live slot are exactly the empty ones kept.
            let empty = slabs.iter().filter(|(&b, &(e, _, _))| live.range(b..e).next().is_none());
            proptest::prop_assert_eq!(empty.count(), s.kept_empty);
            proptest::prop_assert!(s.kept_empty <= KEPT_EMPTY);
        }
        for start in std::mem::take(&mut live).into_keys() {
            if let Some(e) = s.give(start, State::Ready, 1).unwrap() {
                gone(&mut slabs, e)?;
            }
        }
        for e in s.take_empty() {
            gone(&mut slabs, e)?;
        }
        proptest::prop_assert!(slabs.is_empty(), "slabs never given back: {:?}", slabs);
        proptest::prop_assert!(s.slot_owner.is_empty() && s.open.is_empty());
    }
}

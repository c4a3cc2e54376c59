//! The word table against std's map, and its layout invariant (every entry between its home slot
//! and the next empty slot) after every change.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

/// Every entry is reachable: no empty slot lies between its home and its slot, and `len` counts
/// the entries.
fn check_layout<V: Copy + Default>(t: &WordTable<V>) {
    let mut entries = 0;
    for (i, slot) in t.slots.iter().enumerate() {
        if slot.key == EMPTY {
            continue;
        }
        entries += 1;
        let mut j = t.home(slot.key);
        while j != i {
            assert_ne!(
                t.slots[j].key, EMPTY,
                "an empty slot before {:#x}",
                slot.key
            );
            j = (j + 1) & t.mask;
        }
    }
    assert_eq!(entries, t.len);
    assert!(2 * t.len <= t.slots.len().max(1), "more than half full");
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u32),
    Remove(u64),
    Get(u64),
}

/// Keys from a few hundred 512-byte aligned addresses (long runs, removals that shift across the
/// end of the table), sometimes from anywhere.
fn key() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (1u64..300).prop_map(|k| 0x7f00_0000_0000 + 512 * k),
        1 => any::<u64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => key().prop_map(Op::Remove),
        1 => key().prop_map(Op::Get),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 1..600)) {
        let mut table: WordTable<u32> = WordTable::default();
        let mut reference: HashMap<u64, u32> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) if k != EMPTY => {
                    prop_assert_eq!(table.insert(k, v), reference.insert(k, v));
                }
                Op::Insert(..) => {}
                Op::Remove(k) => prop_assert_eq!(table.remove(k), reference.remove(&k)),
                Op::Get(k) => prop_assert_eq!(table.get(k), reference.get(&k)),
            }
            check_layout(&table);
        }
        let mut entries: Vec<(u64, u32)> = table.iter().map(|(k, &v)| (k, v)).collect();
        let mut expected: Vec<(u64, u32)> = reference.into_iter().collect();
        entries.sort_unstable();
        expected.sort_unstable();
        prop_assert_eq!(entries, expected);
    }
}

/// Keys that share the last slot as their home, in a run that wraps around the end of the table:
/// removing the one in the last slot must move the later ones back across the end, or they
/// cannot be found.
#[test]
fn a_removal_in_a_wrapping_run_keeps_the_rest_findable() {
    let mut table: WordTable<u64> = WordTable::default();
    table.insert(1, 1);
    let last = table.mask;
    let keys: Vec<u64> = (1..u64::MAX)
        .filter(|&k| table.home(k) == last)
        .take(5)
        .collect();
    table.remove(1);
    for &k in &keys {
        table.insert(k, k);
    }
    check_layout(&table);
    table.remove(keys[0]);
    check_layout(&table);
    for &k in keys.iter().filter(|&&k| k != keys[0]) {
        assert_eq!(
            table.get(k),
            Some(&k),
            "{k:#x} lost after a removal before it"
        );
    }
    assert_eq!(table.get(keys[0]), None);
}

#[test]
fn null_is_not_a_key() {
    let mut table: WordTable<u32> = WordTable::default();
    assert_eq!(table.get(EMPTY), None);
    table.insert(512, 7);
    assert_eq!(table.get(EMPTY), None, "an empty slot is not NULL's entry");
    assert_eq!(table.remove(EMPTY), None);
    assert_eq!(table.len, 1);
}

//! The table of sources: ids, routing by size, and removal while blocks are held.

use super::*;
use crate::resource::test_source::TestSource;
use crate::resource::Own;

fn named(label: &'static str) -> Arc<dyn Resource> {
    TestSource::new(label, true)
}

fn label(sources: &Sources, id: SourceId) -> &'static str {
    sources.traits(id).unwrap().label
}

fn table() -> Sources {
    let small = Some((named("small"), 1 << 20));
    Sources::new(named("large"), small, named("graph"))
}

#[test]
fn own_sources_serve_by_size_and_the_standing_roles_have_their_own_ids() {
    let sources = table();
    assert_eq!(label(&sources, sources.for_size(512)), "small");
    assert_eq!(label(&sources, sources.for_size(1 << 20)), "small");
    assert_eq!(label(&sources, sources.for_size((1 << 20) + 512)), "large");
    assert_eq!(label(&sources, sources.graph()), "graph");
    let own: Vec<&str> = sources.own().iter().map(|r| r.traits().label).collect();
    assert_eq!(own, ["large", "small"]);
    let one = Sources::new(named("all"), None, named("graph"));
    assert_eq!(label(&one, one.for_size(512)), "all");
}

#[test]
fn a_removed_source_keeps_its_id_until_its_last_block_is_back() {
    let mut sources = table();
    let added = sources.add(named("added"));
    sources.begin_allocation(added).unwrap();
    sources.begin_allocation(added).unwrap();
    sources.allocation_failed(added);
    // One block held: removed, it stays, and serves no new allocation.
    assert!(sources.remove(added).unwrap().is_none());
    assert!(sources.begin_allocation(added).is_err());
    assert_eq!(label(&sources, added), "added", "still there for its block");
    let other = sources.add(named("other"));
    assert_ne!(
        other, added,
        "the id of a source with a held block is not reused"
    );
    sources.returned(added);
    assert!(sources.traits(added).is_err(), "gone with its last block");
    let again = sources.add(named("again"));
    assert_eq!(again, added, "a free id is reused");
    assert_eq!(label(&sources, other), "other");
}

#[test]
fn a_source_without_blocks_leaves_at_once_and_standing_sources_cannot_be_removed() {
    let mut sources = table();
    let added = sources.add(named("added"));
    let gone = sources.remove(added).unwrap();
    assert_eq!(gone.map(|r| r.traits().label), Some("added"));
    assert!(sources.get(added).is_err());
    for id in [
        sources.for_size(0),
        sources.for_size(u64::MAX),
        sources.graph(),
    ] {
        assert!(sources.remove(id).is_err());
        assert!(sources.get(id).is_ok());
    }
    let shareable = sources.add(named("shareable"));
    sources.set_shareable(shareable);
    assert!(sources.remove(shareable).is_err());
}

/// Only the virtual-memory resource, by its own type, is a fast own source (provisioned, it is:
/// `super::super::tests`): a resource with a fast path in the table is not, whatever its traits.
#[test]
fn a_table_of_resources_by_their_interface_has_no_fast_own_source() {
    let fast = |label| -> Arc<dyn Resource> { TestSource::with_fast_path(label, false, true) };
    assert!(Sources::new(fast("all"), None, named("graph"))
        .fast_own()
        .is_none());
    let split = Own::Split {
        large: fast("large"),
        small: Some((fast("small"), 1 << 20)),
    };
    assert!(Sources::of(split, named("graph")).fast_own().is_none());
}

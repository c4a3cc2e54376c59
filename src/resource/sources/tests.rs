//! The table of sources: ids, routing by size, and removal while blocks are held.

use super::*;
use crate::resource::test_source::TestSource;

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

#[test]
fn the_fast_own_source_is_the_one_own_source_with_a_fast_path_and_uncached_blocks() {
    let fast = |label| -> Arc<dyn Resource> { TestSource::with_fast_path(label, false, true) };
    let one = Sources::new(fast("all"), None, named("graph"));
    let own = one.fast_own().expect("one own source with a fast path");
    assert_eq!(own.id, one.for_size(1));
    assert_eq!(own.id, one.for_size(u64::MAX));
    assert_eq!(own.resource.traits().label, "all");
    assert!(own.held);
    // Not with a source for small blocks apart, nor a cacheable or slow one.
    let split = Sources::new(
        fast("large"),
        Some((fast("small"), 1 << 20)),
        named("graph"),
    );
    assert!(split.fast_own().is_none());
    let cached: Arc<dyn Resource> = TestSource::with_fast_path("cached", true, true);
    assert!(Sources::new(cached, None, named("graph"))
        .fast_own()
        .is_none());
    assert!(Sources::new(named("slow"), None, named("graph"))
        .fast_own()
        .is_none());
}

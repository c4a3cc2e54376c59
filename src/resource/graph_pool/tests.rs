//! The graph pool's books: carving, reuse per stream, merging, restore and segment release.

use super::*;

const MIB: u64 = 1 << 20;
const S1: Stream = Stream(0x100);
const S2: Stream = Stream(0x200);

fn segment(start: u64, bytes: u64) -> Segment {
    Segment {
        ptr: DevicePtr(start),
        bytes,
    }
}

fn pool_with_segment(start: u64, bytes: u64) -> GraphPool {
    let mut pool = GraphPool::default();
    pool.add_segment(segment(start, bytes));
    pool
}

#[test]
fn blocks_are_carved_best_fit_and_never_overlap() {
    let mut pool = pool_with_segment(0x1000_0000, 4 * MIB);
    pool.add_segment(segment(0x2000_0000, 2 * MIB));
    let a = pool.take(MIB, S1).unwrap();
    // The smallest range that fits: the 2 MiB segment, not the 4 MiB one.
    assert_eq!(a.ptr, DevicePtr(0x2000_0000));
    let b = pool.take(MIB, S1).unwrap();
    assert_eq!(b.ptr, DevicePtr(0x2000_0000 + MIB));
    let c = pool.take(3 * MIB, S1).unwrap();
    assert_eq!(c.ptr, DevicePtr(0x1000_0000));
    assert!(pool.take(2 * MIB, S1).is_none(), "1 MiB is left");
    assert_eq!(pool.live_blocks().count(), 3);
}

#[test]
fn a_freed_range_serves_its_own_stream_only_until_it_merges_back() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    let a = pool.take(MIB, S1).unwrap();
    let b = pool.take(MIB, S1).unwrap();
    pool.give(a.ptr, a.bytes).unwrap();
    assert!(pool.take(MIB, S2).is_none(), "freed on S1: not for S2");
    let again = pool.take(MIB, S1).unwrap();
    assert_eq!(again.ptr, a.ptr);
    pool.give(again.ptr, again.bytes).unwrap();
    pool.give(b.ptr, b.bytes).unwrap();
    // Both halves freed on S1 merged into the whole segment.
    assert_eq!(pool.largest_free_bytes(), 2 * MIB);
}

#[test]
fn ranges_freed_on_different_streams_do_not_merge_yet_the_segment_is_released() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    let a = pool.take(MIB, S1).unwrap();
    let b = pool.take(MIB, S2).unwrap();
    pool.give(a.ptr, a.bytes).unwrap();
    pool.give(b.ptr, b.bytes).unwrap();
    assert_eq!(pool.largest_free_bytes(), MIB);
    assert_eq!(
        pool.take_free_segments(),
        vec![segment(0x1000_0000, 2 * MIB)]
    );
    assert_eq!(pool.reserved_bytes(), 0);
    assert!(pool.take(512, S1).is_none());
}

#[test]
fn a_segment_with_a_live_block_stays() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    pool.add_segment(segment(0x2000_0000, 2 * MIB));
    let a = pool.take(2 * MIB, S1).unwrap();
    let released = pool.take_free_segments();
    assert_eq!(released.len(), 1);
    assert_ne!(released[0].ptr, a.ptr);
    assert_eq!(pool.reserved_bytes(), 2 * MIB);
}

#[test]
fn ranges_do_not_merge_across_segments() {
    // Two segments that happen to be adjacent in the address space.
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    pool.add_segment(segment(0x1000_0000 + 2 * MIB, 2 * MIB));
    assert_eq!(pool.largest_free_bytes(), 2 * MIB);
    let a = pool.take(2 * MIB, S1).unwrap();
    pool.give(a.ptr, a.bytes).unwrap();
    assert_eq!(pool.largest_free_bytes(), 2 * MIB);
    assert!(pool.take(3 * MIB, S1).is_none());
}

#[test]
fn restore_makes_a_freed_block_live_at_its_old_address_only_if_free() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    let a = pool.take(4096, S1).unwrap();
    let b = pool.take(4096, S1).unwrap();
    pool.give(a.ptr, a.bytes).unwrap();
    assert!(pool.restore(b.ptr, 4096, S1).is_err(), "b is live");
    pool.give(b.ptr, b.bytes).unwrap();
    pool.restore(b.ptr, 4096, S1).unwrap();
    assert!(pool
        .live_blocks()
        .any(|x| x.ptr == b.ptr && x.bytes == 4096));
    // What is around it stayed free: a fits again before it.
    assert_eq!(pool.take(4096, S1).unwrap().ptr, a.ptr);
    // A range straddling a live block cannot be restored.
    assert!(pool.restore(DevicePtr(a.ptr.0 + 512), 8192, S1).is_err());
    assert!(
        pool.restore(DevicePtr(0x3000_0000), 512, S1).is_err(),
        "outside the pool"
    );
    assert!(pool.restore(b.ptr, 0, S1).is_err());
}

#[test]
fn no_split_hands_out_whole_ranges() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    pool.set_no_split();
    let a = pool.take(4096, S1).unwrap();
    assert_eq!(a.bytes, 2 * MIB);
    assert!(pool.take(4096, S1).is_none());
}

#[test]
fn use_counts_never_go_below_zero_and_a_pool_is_unused_only_without_live_blocks() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    assert!(pool.decref().is_err());
    pool.incref();
    let a = pool.take(4096, S1).unwrap();
    assert_eq!(pool.decref().unwrap(), 0);
    assert!(!pool.is_unused(), "a block is still live");
    pool.give(a.ptr, a.bytes).unwrap();
    assert!(pool.is_unused());
    assert!(pool.give(a.ptr, a.bytes).is_err(), "double free");
}

#[test]
fn segment_sizes() {
    assert_eq!(GraphPool::segment_bytes_for(512).unwrap(), 2 * MIB);
    assert_eq!(GraphPool::segment_bytes_for(MIB).unwrap(), 2 * MIB);
    assert_eq!(GraphPool::segment_bytes_for(MIB + 512).unwrap(), 2 * MIB);
    assert_eq!(GraphPool::segment_bytes_for(5 * MIB).unwrap(), 6 * MIB);
    let huge = GraphPool::segment_bytes_for(u64::MAX - 10).unwrap_err();
    assert!(
        huge.is_device_oom(),
        "a size no device holds is out of memory: {huge}"
    );
}

#[test]
fn a_free_of_the_wrong_size_is_refused_and_changes_nothing() {
    let mut pool = pool_with_segment(0x1000_0000, 2 * MIB);
    let a = pool.take(4096, S1).unwrap();
    assert!(pool.give(a.ptr, 8192).is_err());
    assert_eq!(pool.live_blocks().count(), 1, "the block is still live");
    assert!(pool.take(2 * MIB - 4096, S1).is_some(), "nothing was freed");
    pool.give(a.ptr, 4096).unwrap();
}

use super::*;

fn block(ptr: u64, bytes: u64, stream: usize) -> CachedBlock {
    CachedBlock {
        ptr: DevicePtr(ptr),
        block_bytes: bytes,
        stream: Stream(stream),
        source: SourceId::default(),
    }
}

/// Puts `b`, which must be kept; the blocks evicted for it.
fn put(c: &mut Cache, b: CachedBlock) -> Vec<CachedBlock> {
    let mut evicted = Vec::new();
    c.put(b, &mut evicted).unwrap();
    evicted
}

/// Checks the books: `cached_bytes` and `occupied` against the blocks themselves.
fn check(c: &Cache) {
    assert_eq!(
        c.cached_bytes,
        c.blocks().map(|b| b.block_bytes).sum::<u64>()
    );
    let occupied = c.slots.iter().filter(|(_, b)| b.blocks > 0).count();
    assert_eq!(c.occupied, occupied);
    assert_eq!(c.index.len(), c.slots.len());
    for (i, (stream, bins)) in c.slots.iter().enumerate() {
        assert_eq!(c.index[stream], i);
        let n: usize = bins.by_size.iter().map(|bin| bin.ptrs.len()).sum();
        assert_eq!(bins.blocks, n);
    }
    assert!(c.cached_bytes <= c.limit_bytes);
    // Every stream holding blocks can be evicted: it has its live entry in the queue.
    for (stream, bins) in c.slots.iter().filter(|(_, b)| b.blocks > 0) {
        assert!(
            c.queue.contains(&(*stream, bins.queued_at)),
            "{stream:?} holds blocks but has no live queue entry"
        );
    }
}

#[test]
fn reuses_only_on_the_same_stream_and_close_sizes() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, block(0x1000, 4096, 1));
    assert_eq!(c.take(Stream(2), 4096), None, "another stream");
    assert_eq!(c.take(Stream(1), 1024), None, "4x too big for 1 KiB");
    assert_eq!(c.take(Stream(1), 3700), Some(block(0x1000, 4096, 1)));
    assert_eq!(c.cached_bytes(), 0);
    check(&c);
}

#[test]
fn respects_the_limit() {
    let mut c = Cache::new(8192, 4096);
    let mut evicted = Vec::new();
    put(&mut c, block(0x1000, 4096, 1));
    assert_eq!(
        c.put(block(0x2000, 4608, 1), &mut evicted),
        Err(block(0x2000, 4608, 1)),
        "block too large"
    );
    put(&mut c, block(0x3000, 4096, 1));
    assert_eq!(
        put(&mut c, block(0x4000, 512, 2)),
        vec![block(0x3000, 4096, 1)],
        "full: the oldest stream's largest block makes room"
    );
    assert_eq!(c.cached_bytes(), 4096 + 512);
    check(&c);
    let mut small = Cache::new(1024, u64::MAX);
    assert_eq!(
        small.put(block(0x1000, 2048, 1), &mut evicted),
        Err(block(0x1000, 2048, 1)),
        "larger than the whole budget"
    );
    assert!(evicted.is_empty());
    check(&c);
}

/// The budget goes to the streams that freed last: the blocks of a stream no longer used leave
/// first, and those of a stream that keeps freeing stay.
#[test]
fn a_full_cache_evicts_the_stream_that_put_longest_ago() {
    let mut c = Cache::new(4 * 4096, u64::MAX);
    put(&mut c, block(0x1000, 4096, 1));
    put(&mut c, block(0x2000, 4096, 2));
    put(&mut c, block(0x3000, 4096, 1)); // stream 1 is now the newer
    put(&mut c, block(0x4000, 4096, 3));
    assert_eq!(
        put(&mut c, block(0x5000, 4096, 4)),
        vec![block(0x2000, 4096, 2)]
    );
    let evicted = put(&mut c, block(0x6000, 8192, 4));
    assert_eq!(evicted.len(), 2, "{evicted:?}");
    assert!(evicted.iter().all(|b| b.stream == Stream(1)), "{evicted:?}");
    assert_eq!(c.take(Stream(3), 4096), Some(block(0x4000, 4096, 3)));
    check(&c);
}

/// A stream that puts while its entry is the newest keeps it; once the budget evicted all its
/// blocks and that entry left the queue, its next put must give it an entry again, or its blocks
/// could never be evicted and the next put would overrun the budget.
#[test]
fn a_stream_whose_entry_left_the_queue_joins_it_again() {
    let mut c = Cache::new(4096, u64::MAX);
    put(&mut c, block(0x1000, 4096, 1));
    assert_eq!(
        put(&mut c, block(0x2000, 4096, 1)),
        vec![block(0x1000, 4096, 1)]
    );
    check(&c);
    assert_eq!(
        put(&mut c, block(0x3000, 4096, 1)),
        vec![block(0x2000, 4096, 1)]
    );
    assert_eq!(c.cached_bytes(), 4096);
    check(&c);
}

#[test]
fn evicts_preferred_stream_largest_first_then_the_oldest_and_drains() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, block(0x1000, 512, 1));
    put(&mut c, block(0x2000, 8192, 1));
    put(&mut c, block(0x9000, 65536, 2));
    let out = c.evict(4096, Stream(1));
    assert_eq!(out, vec![block(0x2000, 8192, 1)]);
    assert_eq!(c.cached_bytes(), 512 + 65536);
    put(&mut c, block(0xa000, 1024, 3));
    put(&mut c, block(0xb000, 512, 2)); // stream 2 put last: stream 3 goes before it
    let out = c.evict(1024 + 512 + 1, Stream(1));
    assert_eq!(
        out,
        vec![
            block(0x1000, 512, 1),
            block(0xa000, 1024, 3),
            block(0x9000, 65536, 2)
        ]
    );
    check(&c);
    assert_eq!(c.drain().len(), 1);
    assert_eq!(c.cached_bytes(), 0);
    check(&c);
}

/// The hot path's promise: a size that recurs reuses its bin (no insertion, no growth).
#[test]
fn a_size_that_recurs_keeps_one_bin() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    for _ in 0..3 {
        put(&mut c, block(0x1000, 4096, 1));
        put(&mut c, block(0x2000, 4096, 1));
        assert_eq!(c.take(Stream(1), 4096), Some(block(0x2000, 4096, 1)));
        assert_eq!(c.take(Stream(1), 4096), Some(block(0x1000, 4096, 1)));
    }
    assert_eq!(c.slots.len(), 1);
    assert_eq!(c.slots[0].1.by_size.len(), 1, "{:?}", c.slots);
    assert_eq!(
        c.queue.len(),
        1,
        "one stream: one queue entry, kept while it is the newest"
    );
    check(&c);
}

fn of_source(b: CachedBlock, source: u32) -> CachedBlock {
    CachedBlock {
        source: SourceId::for_test(source),
        ..b
    }
}

#[test]
fn drains_one_sources_blocks_of_every_stream() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, of_source(block(0x1000, 512, 1), 1));
    put(&mut c, of_source(block(0x2000, 8192, 1), 2));
    put(&mut c, of_source(block(0x3000, 8192, 1), 1));
    put(&mut c, of_source(block(0x9000, 4096, 2), 1));
    put(&mut c, of_source(block(0xa000, 65536, 2), 2));
    let mut one = c.drain_source(SourceId::for_test(1));
    one.sort_by_key(|b| b.ptr);
    let expected = [(0x1000, 512, 1), (0x3000, 8192, 1), (0x9000, 4096, 2)];
    let expected: Vec<CachedBlock> = expected
        .iter()
        .map(|&(ptr, bytes, stream)| of_source(block(ptr, bytes, stream), 1))
        .collect();
    assert_eq!(one, expected);
    assert_eq!(c.cached_bytes(), 8192 + 65536);
    check(&c);
    let two = c.drain_source(SourceId::for_test(2));
    assert!(two.iter().all(|b| b.source == SourceId::for_test(2)));
    assert_eq!(two.len(), 2);
    assert_eq!(c.cached_bytes(), 0);
    check(&c);
    put(&mut c, block(0x1000, 512, 1));
    assert_eq!(
        c.take(Stream(1), 512),
        Some(block(0x1000, 512, 1)),
        "bins still work"
    );
}

#[test]
fn a_block_keeps_its_source_and_equal_sizes_of_two_sources_stay_apart() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, of_source(block(0x1000, 4096, 1), 3));
    put(&mut c, of_source(block(0x2000, 4096, 1), 5));
    let mut taken = vec![
        c.take(Stream(1), 4096).unwrap(),
        c.take(Stream(1), 4096).unwrap(),
    ];
    taken.sort_by_key(|b| b.ptr);
    assert_eq!(
        taken,
        [
            of_source(block(0x1000, 4096, 1), 3),
            of_source(block(0x2000, 4096, 1), 5)
        ]
    );
    put(&mut c, of_source(block(0x1000, 4096, 1), 3));
    put(&mut c, of_source(block(0x2000, 4096, 1), 5));
    let evicted = c.evict(u64::MAX, Stream(1));
    assert_eq!(evicted.len(), 2);
    for b in evicted {
        let source = if b.ptr.0 == 0x1000 { 3 } else { 5 };
        assert_eq!(b.source, SourceId::for_test(source));
    }
    check(&c);
}

/// A stream per request, 100,000 of them: the entries kept stay bounded (twice the streams
/// holding blocks plus `IDLE_PUTS`), and the newest streams' blocks are the ones kept. The entries of each stream were kept until an empty_cache, and every take
/// and put scanned them all.
#[test]
fn a_hundred_thousand_streams_leave_bounded_entries() {
    let mut c = Cache::new(1 << 20, u64::MAX); // room for 256 blocks of 4 KiB
    let mut evicted = Vec::new();
    for i in 0..100_000u64 {
        let s = Stream(0x100 + i as usize);
        // Each stream takes back what it freed, and leaves one block in the cache.
        for _ in 0..2 {
            let b = c
                .take(s, 4096)
                .unwrap_or(block(0x1_0000 + i * 4096, 4096, s.0));
            c.put(b, &mut evicted).unwrap();
        }
        assert!(
            c.slots.len() <= 2 * (c.occupied + IDLE_PUTS as usize),
            "{} entries for {} streams with blocks",
            c.slots.len(),
            c.occupied
        );
        assert!(c.queue.len() <= 2 * c.occupied + QUEUE_SLACK + 1);
    }
    assert_eq!(c.occupied, 256, "the newest 256 streams hold the budget");
    assert_eq!(evicted.len(), 100_000 - 256);
    assert!(c.slots.capacity() <= 8 * (c.occupied + IDLE_PUTS as usize) + 64);
    assert!(c.index.capacity() <= 8 * (c.occupied + IDLE_PUTS as usize) + 64);
    check(&c);
    // The newest streams' blocks are the ones kept.
    assert!(c.take(Stream(0x100 + 99_999), 4096).is_some());
    assert!(c.take(Stream(0x100), 4096).is_none());
}

/// Streams that take turns put while the budget has room, so nothing pops stale queue entries
/// at the front: each put of a stream that did not put last adds one. Compaction keeps the queue
/// within twice the streams holding blocks plus a constant, and gives back the memory of a burst.
#[test]
fn streams_taking_turns_keep_the_eviction_queue_short() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    for i in 0..10_000u64 {
        put(&mut c, block(0x100_0000 + i * 4096, 4096, 100 + i as usize));
    }
    assert_eq!(c.queue.len(), 10_000, "one live entry per stream");
    for i in 0..10_000u64 {
        assert!(c.take(Stream(100 + i as usize), 4096).is_some());
    }
    assert_eq!(c.occupied, 0);
    // Eight streams keep a block each; two take turns with another.
    for s in 1..=8 {
        put(&mut c, block(0x1000 * s as u64, 512, s));
    }
    for k in 0..100_000u64 {
        let s = 20 + (k % 2) as usize;
        put(&mut c, block(0x10_0000 + k % 2 * 4096, 4096, s));
        assert!(
            c.queue.len() <= 2 * c.occupied + QUEUE_SLACK,
            "{} queue entries for {} streams holding blocks",
            c.queue.len(),
            c.occupied
        );
        assert!(c.take(Stream(s), 4096).is_some());
    }
    assert!(
        c.queue.capacity() <= 4 * (c.queue.len() + QUEUE_SLACK),
        "the burst's {} entries of room stay",
        c.queue.capacity()
    );
    check(&c);
    // The eight are still the ones evicted first, oldest first.
    let mut small = Cache::new(8 * 512 + 4096, u64::MAX);
    for s in 1..=8 {
        put(&mut small, block(0x1000 * s as u64, 512, s));
    }
    for k in 0..1_000u64 {
        let s = 20 + (k % 2) as usize;
        put(&mut small, block(0x10_0000 + k % 2 * 4096, 4096, s));
        assert!(small.take(Stream(s), 4096).is_some());
    }
    let evicted = put(&mut small, block(0x20_0000, 5120, 30));
    assert_eq!(evicted, vec![block(0x1000, 512, 1), block(0x2000, 512, 2)]);
    check(&small);
}

/// A sweep drops exactly the streams without blocks whose last put is `IDLE_PUTS` puts old or
/// more, keeps those with blocks however old, and gives back the room of a burst.
#[test]
fn a_sweep_drops_only_streams_idle_and_empty_and_shrinks() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, block(0x1000, 512, 1)); // keeps its block
    put(&mut c, block(0x2000, 512, 2)); // empties at once
    assert!(c.take(Stream(2), 512).is_some());
    for i in 0..IDLE_PUTS - 2 {
        put(&mut c, block(0x10_0000 + i * 512, 512, 1000 + i as usize));
        assert!(c.take(Stream(1000 + i as usize), 512).is_some());
    }
    put(&mut c, block(0x3000, 512, 3)); // the last put before the sweep
    assert!(c.take(Stream(3), 512).is_some());
    assert_eq!(c.puts, IDLE_PUTS + 1);
    c.sweep();
    let kept = |c: &Cache, s: usize| c.index.contains_key(&Stream(s));
    // Stream 2's last put is put 2, one younger than the bound (puts - IDLE_PUTS = 1): kept,
    // like every stream put since.
    assert_eq!(c.slots.len(), IDLE_PUTS as usize + 1, "every stream so far");
    assert!(kept(&c, 1) && kept(&c, 2) && kept(&c, 3) && kept(&c, 1000));
    check(&c);
    // One put later stream 2 is as old as the bound: dropped; stream 1000 (put 3) is not yet.
    put(&mut c, block(0x4000, 512, 4));
    c.sweep();
    assert!(kept(&c, 1) && !kept(&c, 2) && kept(&c, 1000) && kept(&c, 4));
    assert_eq!(c.slots.len(), IDLE_PUTS as usize + 1);
    check(&c);
    // Long after, only the streams holding blocks stay, in little room.
    for i in 0..2 * IDLE_PUTS {
        put(&mut c, block(0x20_0000, 512, 5));
        assert!(c.take(Stream(5), 512).is_some() || i == u64::MAX);
    }
    assert!(c.take(Stream(4), 512).is_some());
    c.puts += IDLE_PUTS;
    c.sweep();
    let left: Vec<usize> = c.slots.iter().map(|(s, _)| s.0).collect();
    assert_eq!(left, vec![1], "only the stream holding a block");
    assert!(
        c.slots.capacity() <= 4 * c.slots.len() + 64,
        "{}",
        c.slots.capacity()
    );
    assert!(
        c.index.capacity() <= 4 * c.index.len() + 64,
        "{}",
        c.index.capacity()
    );
    assert_eq!(c.take(Stream(1), 512), Some(block(0x1000, 512, 1)));
    check(&c);
}

/// A memory-limit eviction takes no more than it was asked for, across streams.
#[test]
fn an_eviction_across_streams_takes_only_what_is_missing() {
    let mut c = Cache::new(u64::MAX, u64::MAX);
    put(&mut c, block(0x1000, 512, 1));
    put(&mut c, block(0x2000, 512, 2));
    put(&mut c, block(0x3000, 512, 2));
    let out = c.evict(1000, Stream(1));
    assert_eq!(
        out.len(),
        2,
        "512 of stream 1, then one 512 of stream 2: {out:?}"
    );
    assert_eq!(c.cached_bytes(), 512);
    check(&c);
}

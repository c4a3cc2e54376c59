//! The virtual-memory backend (`STREAMPOOL_BACKEND=vmm`) through the whole allocator, on a strict
//! simulator (tests/common/vmm.rs): where blocks go (pages shared by small and large blocks, holes
//! remapped, stream-ordered reuse, captures, peers, the memory fraction, batched mapping and the
//! pool's cap), and what it counts and shows. Release (background, thresholds, trims) is in
//! tests/vmm_release.rs.

mod common;
use common::vmm::*;
use streampool::config::PeerAccess;
use streampool::driver::{DevicePtr, Stream, StreamDriver};
use streampool::history::StreampoolEventKind as Kind;
use streampool::units::SizeSpec;
use streampool::Config;

/// Nothing is cached in front of the resource: it reuses a block freed on a stream on that
/// stream at once itself, and a cached small block would pin its carrier page (replayed
/// llama_decode held 1.07x its live bytes with the cache, 1.02x without).
#[test]
fn small_blocks_share_the_pages_of_large_ones_and_nothing_is_cached() {
    let r = rig();
    let small = r.malloc(64 * 1024, 0, S1);
    let large = r.malloc(5 * MIB, 0, S1);
    assert_eq!(
        r.sim.physical_bytes(0),
        4 * PAGE,
        "5 MiB on 2 MiB pages, and one page for small blocks"
    );
    assert_eq!(r.stats().reserved_bytes, 4 * PAGE, "no CUDA pool beside it");
    assert_eq!(r.sim.outstanding_bytes(), 0, "nothing from a CUDA pool");
    r.alloc.free(small, 0).unwrap();
    r.alloc.free(large, 0).unwrap();
    assert_eq!(r.stats().cached_bytes, 0, "both blocks went home");
    let creates = r.stats().num_mem_creates;
    assert_eq!(
        (r.malloc(5 * MIB, 0, S1), r.malloc(64 * 1024, 0, S1)),
        (large, small),
        "its own stream reuses them at once"
    );
    assert_eq!(r.stats().num_mem_creates, creates, "nothing new");
    r.alloc.free(large, 0).unwrap();
    r.alloc.free(small, 0).unwrap();
    r.finish();
}

/// Small blocks are carved out of whole pages: one live 4 KiB block keeps one page, and a page
/// whose blocks are all free is an idle page again, released like any other.
#[test]
fn one_live_small_block_holds_one_page_and_an_emptied_page_is_idle_again() {
    let config = Config {
        cache_limit: SizeSpec::Bytes(0), // every free reaches the resource
        ..cold_config()
    };
    let r = rig_with(1, 256 * MIB, config);
    let blocks: Vec<DevicePtr> = (0..600).map(|_| r.malloc(4096, 0, S1)).collect();
    assert_eq!(
        r.sim.physical_bytes(0),
        2 * PAGE,
        "600 x 4 KiB on two pages"
    );
    for &b in &blocks[1..] {
        r.alloc.free(b, 0).unwrap();
    }
    r.sim.complete_all();
    r.device(0).trim(0).unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        PAGE,
        "one live 4 KiB block holds one page; the emptied page went back"
    );
    r.sim.stop_clock();
    r.alloc.free(blocks[0], 0).unwrap();
    r.sim.complete_all();
    r.alloc.tend(); // collects the fence of the last free (its stream is idle)
    r.sim.advance_clock_ms(COLD_AFTER_MS);
    let before = r.sim.physical_bytes(0);
    let again = r.malloc(PAGE, 0, S2);
    assert_eq!(
        r.sim.physical_bytes(0),
        before,
        "the small blocks' page, empty and cold now, backs a large block: no growth"
    );
    r.alloc.free(again, 0).unwrap();
    r.finish();
}

#[test]
fn record_stream_blocks_wait_for_their_streams_before_going_home() {
    let r = rig();
    let a = r.malloc(4 * MIB, 0, S1);
    r.alloc.record_stream(a, S2).unwrap();
    r.sim.touch(0, 0, a, 4 * MIB, S2).unwrap();
    r.alloc.free(a, 0).unwrap();
    let b = r.malloc(4 * MIB, 0, S1);
    assert_ne!(a, b, "S2 may still use a");
    r.sim.complete_stream(0, S2);
    r.alloc.free(b, 0).unwrap();
    assert_eq!(
        r.malloc(4 * MIB, 0, S1),
        a,
        "after S2: a is home and S1 reuses it"
    );
    r.alloc.free(a, 0).unwrap();
    r.sim.complete_all();
    r.finish();
}

#[test]
fn a_block_freed_on_one_stream_serves_another_at_once_and_empty_cache_releases_it() {
    let r = rig_with(1, 32 * MIB, vmm_config());
    let a = r.malloc(20 * MIB, 0, S1);
    let e = r.alloc.malloc(20 * MIB, 0, S2).unwrap_err().to_string();
    assert!(e.starts_with("CUDA out of memory."), "{e}");
    assert_eq!(r.stats().num_alloc_retries, 1);
    r.alloc.free(a, 0).unwrap();
    // S1's work on a may still run: S2 gets it at once, after a GPU-side wait for S1's free.
    let b = r.malloc(20 * MIB, 0, S2);
    assert_eq!(b, a);
    let st = r.stats();
    assert_eq!((st.num_alloc_retries, st.num_stream_waits), (1, 1));
    r.alloc.free(b, 0).unwrap();
    r.alloc.empty_cache().unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.finish();
}

#[test]
fn memory_left_unused_in_holes_is_remapped_instead_of_growing() {
    let r = rig_with(1, 256 * MIB, cold_config());
    r.sim.stop_clock();
    let blocks: Vec<DevicePtr> = (0..6).map(|_| r.malloc(PAGE, 0, S1)).collect();
    for &b in blocks.iter().step_by(2) {
        r.alloc.free(b, 0).unwrap();
        r.sim.advance_clock_ms(1); // a fence per free: one per millisecond
    }
    r.sim.complete_all();
    r.sim.advance_clock_ms(COLD_AFTER_MS);
    let before = r.sim.physical_bytes(0);
    let big = r.malloc(3 * PAGE, 0, S1);
    assert_eq!(
        r.sim.physical_bytes(0),
        before,
        "three cold holes back one new block"
    );
    r.alloc.free(big, 0).unwrap();
    for &b in blocks.iter().skip(1).step_by(2) {
        r.alloc.free(b, 0).unwrap();
    }
    r.finish();
}

#[test]
fn the_memory_fraction_caps_mapped_blocks_too() {
    let r = rig_with(1, 64 * MIB, vmm_config());
    r.device(0).set_memory_fraction(0.25).unwrap();
    let a = r.malloc(12 * MIB, 0, S1);
    let e = r.alloc.malloc(6 * MIB, 0, S1).unwrap_err().to_string();
    assert!(e.contains("set_per_process_memory_fraction"), "{e}");
    r.alloc.free(a, 0).unwrap();
    r.finish();
}

/// A capture elsewhere on the device does not stop the vmm resource: it maps what an allocation
/// on another stream needs (in relaxed capture mode), and never the driver's own pool.
#[test]
fn a_capture_elsewhere_maps_in_relaxed_mode_and_the_driver_serves_nothing() {
    let r = rig();
    let capturing = Stream(9);
    r.sim.begin_capture(0, capturing);
    let graph = r.malloc(4 * MIB, 0, capturing);
    let mapped_before = r.sim.mappings(0).len();
    let other = r.malloc(8 * MIB, 0, S1);
    assert!(
        !r.sim.is_driver_memory(0, other),
        "the vmm resource served it"
    );
    assert!(
        r.sim.mappings(0).len() > mapped_before,
        "mapped during the capture"
    );
    assert_eq!(r.sim.calls("unsafe during capture"), 0, "in relaxed mode");
    r.alloc.free(other, 0).unwrap();
    r.alloc.free(graph, 0).unwrap();
    r.sim.end_capture(0, capturing);
    r.finish();
}

/// The background thread's look at the device never asks a stream that captures whether it has
/// finished (the query would end the capture), though the device does not know of the capture
/// yet (nothing allocated in it so far, as in the moment after PyTorch begins one) and the stream
/// has a fence pending; and its other calls are made in relaxed capture mode.
#[test]
fn the_background_look_never_queries_a_capturing_stream_the_device_does_not_know_of() {
    let r = rig();
    r.sim.stop_clock();
    let (a, b) = (r.malloc(4 * MIB, 0, S1), r.malloc(4 * MIB, 0, S1));
    let c = r.malloc(4 * MIB, 0, S2);
    // S1's first fence, recorded, completes and is collected.
    r.alloc.free(a, 0).unwrap();
    r.sim.complete_all();
    r.alloc.tend();
    // S2's fence, recorded and not completed: the look polls it. S1's next one is left pending
    // (the clock stands still: no record is due), with no recorded one before it.
    r.alloc.free(c, 0).unwrap();
    r.alloc.free(b, 0).unwrap();
    r.sim.begin_capture(0, S1);
    let queries = r.sim.calls("cuStreamQuery");
    let polls = r.sim.calls("cuEventQuery");
    r.alloc.tend();
    assert_eq!(
        r.sim.calls("cuStreamQuery"),
        queries,
        "S1 was asked during its capture"
    );
    assert!(
        r.sim.calls("cuEventQuery") > polls,
        "S2's fence was not polled"
    );
    // Each call the look makes is made in relaxed capture mode (as the CUDA driver makes its
    // queries and mappings), so the capture forbids none of them.
    assert_eq!(r.sim.calls("unsafe during capture"), 0);
    // Once the capture has ended, the look asks it, and its pending fence completes.
    r.sim.end_capture(0, S1);
    r.alloc.tend();
    assert!(
        r.sim.calls("cuStreamQuery") > queries,
        "S1 never asked: the test shows nothing"
    );
    r.finish();
}

#[test]
fn peers_can_use_every_mapping_including_new_ones_after_growth() {
    let config = Config {
        peer_access: PeerAccess::Auto,
        ..vmm_config()
    };
    let r = rig_with(2, 256 * MIB, config);
    let a = r.malloc(4 * MIB, 0, S1);
    let b = r.malloc(4 * MIB, 1, S1);
    r.sim.touch(0, 1, a, 4 * MIB, S1).unwrap();
    r.sim.touch(1, 0, b, 4 * MIB, S1).unwrap();
    let grown = r.malloc(40 * MIB, 0, S1);
    r.sim.touch(0, 1, grown, 40 * MIB, S1).unwrap();
    for ptr in [a, grown] {
        r.alloc.free(ptr, 0).unwrap();
    }
    r.sim.complete_all();
    let remapped = r.malloc(44 * MIB, 0, S2);
    r.sim.touch(0, 1, remapped, 44 * MIB, S2).unwrap();
    r.alloc.free(remapped, 0).unwrap();
    r.alloc.free(b, 1).unwrap();
    r.finish();
}

#[test]
fn the_timeline_shows_mappings_and_unmappings() {
    let r = rig();
    r.alloc.record_history(true, 1000).unwrap();
    let a = r.malloc(4 * MIB, 0, S1);
    r.alloc.free(a, 0).unwrap();
    r.alloc.empty_cache().unwrap();
    let (events, _) = r.alloc.history(usize::MAX);
    let count = |k: Kind| events.iter().filter(|e| e.kind == k as u32).count();
    assert_eq!((count(Kind::Map), count(Kind::Unmap)), (2, 2));
    let s = r.stats();
    assert_eq!(
        (s.num_maps, s.num_unmaps),
        (2, 2),
        "the statistics count them too"
    );
    let last_unmap = events
        .iter()
        .rev()
        .find(|e| e.kind == Kind::Unmap as u32)
        .unwrap();
    assert_eq!(last_unmap.reserved_bytes, 0);
    r.finish();
}

#[test]
fn four_streams_with_record_stream_and_a_low_threshold_never_unmap_memory_in_use() {
    // On a stopped clock moved on by a fixed step an operation, so that every run takes the same
    // path (page moves depend on time: fences are recorded at most once a millisecond, pages go
    // cold): the steps span a fence per operation to none for many.
    for seed in [0x9E37_79B9_7F4A_7C15, 12345, 777] {
        for step_us in [0, 100, 500, 700, 1000, 3000, 100_000] {
            four_streams_with_record_stream(seed, step_us);
        }
    }
}

/// Random allocations on four streams, record_stream onto others, frees and completions, with a
/// release threshold of 8 MiB: the strict simulator fails an unmap of memory in use, and any
/// stream's work on memory another stream's unfinished work uses at another address (a page
/// moved too early). A block used on another stream is first waited for there, as PyTorch
/// requires (`wait_stream` before `record_stream`): without it, the program itself races with
/// the block's previous use on its allocating stream, moved or not.
fn four_streams_with_record_stream(seed: u64, step_us: u64) {
    let config = Config {
        release_threshold: SizeSpec::Bytes(8 * MIB),
        ..vmm_config()
    };
    let r = rig_with(1, 96 * MIB, config);
    r.sim.stop_clock();
    let streams = [Stream(1), Stream(2), Stream(3), Stream(4)];
    let mut seed = seed;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut live: Vec<(DevicePtr, u64, Vec<Stream>)> = Vec::new();
    for _ in 0..3000 {
        r.sim.advance_clock_us(step_us);
        match next(10) {
            0..=4 if live.len() < 12 => {
                let bytes = (1 + next(6)) * MIB + next(4) * 512;
                let stream = streams[next(4) as usize];
                let Ok(ptr) = r.alloc.malloc(bytes, 0, stream) else {
                    continue; // out of memory with everything live: allowed
                };
                r.sim.touch(0, 0, ptr, bytes, stream).unwrap();
                for (other, other_bytes, _) in &live {
                    assert!(
                        ptr.0 + bytes <= other.0 || other.0 + other_bytes <= ptr.0,
                        "overlap"
                    );
                }
                live.push((ptr, bytes, vec![stream]));
            }
            5 if !live.is_empty() => {
                let i = next(live.len() as u64) as usize;
                let stream = streams[next(4) as usize];
                let ready = r.sim.event_create(0).unwrap();
                r.sim.event_record(0, ready, live[i].2[0]).unwrap();
                r.sim.stream_wait_event(0, stream, ready).unwrap();
                r.sim.event_destroy(0, ready);
                r.alloc.record_stream(live[i].0, stream).unwrap();
                r.sim.touch(0, 0, live[i].0, live[i].1, stream).unwrap();
                live[i].2.push(stream);
            }
            6..=8 if !live.is_empty() => {
                let (ptr, _, _) = live.swap_remove(next(live.len() as u64) as usize);
                r.alloc.free(ptr, 0).unwrap();
            }
            _ => r.sim.complete_stream(0, streams[next(4) as usize]),
        }
    }
    for (ptr, _, _) in live {
        r.alloc.free(ptr, 0).unwrap();
    }
    r.sim.complete_all();
    r.finish();
}

#[test]
fn a_peer_that_cannot_access_the_device_is_named_with_the_resource() {
    let config = Config {
        peer_access: PeerAccess::Off,
        ..vmm_config()
    };
    let r = rig_with(2, 256 * MIB, config);
    r.sim.set_peer_incapable(0, 1);
    let a = r.malloc(4 * MIB, 0, S1);
    let e = r.alloc.enable_peer_access(0).unwrap_err().to_string();
    assert!(
        e.contains("device 1 cannot access memory on device 0"),
        "{e}"
    );
    assert!(e.contains("virtual memory resource"), "{e}");
    r.alloc.free(a, 0).unwrap();
    r.finish();
}

/// The vmm resource's share of the statistics: a large block is used bytes while live and after
/// its free until empty_cache takes it back; a peak reset brings the reserved peak down to what
/// is mapped now.
#[test]
fn used_bytes_and_the_reserved_peak_follow_the_vmm_resource() {
    let r = rig();
    let a = r.malloc(8 * MIB, 0, S1);
    let live = r.stats();
    assert_eq!(
        (live.pool_used_bytes, live.reserved_bytes),
        (8 * MIB, 8 * MIB)
    );
    r.alloc.free(a, 0).unwrap();
    r.alloc.empty_cache().unwrap();
    let emptied = r.stats();
    assert_eq!(
        (emptied.pool_used_bytes, emptied.reserved_bytes),
        (0, 0),
        "nothing used or mapped after empty_cache"
    );
    assert_eq!(
        emptied.reserved_bytes_peak,
        8 * MIB,
        "the peak stays until reset"
    );
    r.device(0).reset_peak_stats().unwrap();
    assert_eq!(
        r.stats().reserved_bytes_peak,
        0,
        "reset to what is mapped now"
    );
    r.finish();
}

/// Mapping is batched: the pages of one block are one span (one create, one map), or, with
/// spans off, get their access in one cuMemSetAccess call (it behaves synchronously); the pool's
/// cap (`STREAMPOOL_MAX_POOL_SIZE`) holds to the page either way.
#[test]
fn a_block_s_pages_get_access_in_one_call_and_the_cap_holds_to_the_page() {
    for (span_bytes, calls) in [(32 * MIB, 1), (0, 4)] {
        let config = Config {
            max_pool_size: SizeSpec::Bytes(8 * MIB),
            vmm_span_bytes: Some(span_bytes),
            ..vmm_config()
        };
        let r = rig_with(1, 256 * MIB, config);
        let a = r.malloc(8 * MIB, 0, S1); // four pages: exactly the cap
        assert_eq!(
            (r.sim.calls("cuMemCreate"), r.sim.calls("cuMemMap")),
            (calls, calls),
            "span {span_bytes}"
        );
        assert_eq!(
            r.sim.calls("cuMemSetAccess"),
            1,
            "one call for four contiguous pages"
        );
        let e = r.alloc.malloc(2 * MIB, 0, S1).unwrap_err().to_string();
        assert!(e.starts_with("CUDA out of memory."), "{e}");
        r.alloc.free(a, 0).unwrap();
        r.finish();
    }
}

//! Model checks of one device's lock sections: with `--cfg loom` the device allocator's locks are
//! loom's (src/sync.rs), and loom runs each model below under every interleaving of those lock
//! sections with at most 3 preemptions per run, against the simulated driver. Threads switch only
//! at those locks (and at spawn/join): the driver calls a thread makes between two of them run as
//! one step, since the simulator's own locks are not loom's.
//!
//! - `first_allocations_create_the_pools_once`: two first allocations at once;
//! - `cache_hits_and_misses_keep_the_books`: alloc/free loops on one stream, cache hits and misses;
//! - `frees_flush_and_growth_drain_the_cache_together`: frees into the cache while `empty_cache`
//!   and a growing allocation drain it;
//! - `record_stream_blocks_wait_then_are_reused`: a block used on another stream, freed while
//!   another thread allocates;
//! - `the_memory_fraction_is_a_hard_cap_for_concurrent_allocations`: two threads allocate at
//!   once under a cap that fits one block (the defect: the check and the reservation were in
//!   different lock sections, and both passed).
//!
//! Every model checks that no two live blocks overlap (a block counts as live from malloc's
//! return until its `free` has been called: it leaves the overlap set only after `free`
//! returned, so a block handed out twice, or before its owner freed it, is caught), that the statistics agree with the pool
//! (`num_allocs` = cache hits + device allocations; once the streams completed, the pool's used
//! bytes = live + cached + waiting blocks), and that nothing is left cached or in the pools after
//! `empty_cache`.
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom -- --nocapture
//! ```
//!
//! (`--nocapture` shows how many interleavings each model explored; the separate target dir keeps
//! the normal build's artefacts; `LOOM_MAX_PREEMPTIONS=N` sets another bound.)
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::{Allocator, Config, Error, StreampoolStats};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Every model allocates on device 0; stream 1 unless said otherwise.
const STREAM: Stream = Stream(1);

/// Where a block the model allocated stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Returned by malloc, `free` not called yet: nothing else may overlap it.
    Live,
    /// `free` has been called and has not returned: the allocator may hand it out again.
    Freeing,
}

/// An allocator over a strict simulated device, with the blocks the model holds.
struct Rig {
    sim: std::sync::Arc<SimDriver>,
    alloc: Allocator,
    /// Blocks the model allocated and has not finished freeing (address, bytes, state), to
    /// check that no live block overlaps another. A std mutex: loom never switches threads while
    /// it is held, since nothing under it is a loom operation.
    live: std::sync::Mutex<Vec<(DevicePtr, u64, State)>>,
}

impl Rig {
    fn new() -> Rig {
        let sim = std::sync::Arc::new(SimDriver::new(1, 1 << 30).strict());
        let alloc = Allocator::new(
            sim.clone() as std::sync::Arc<dyn Driver>,
            Config {
                backend: streampool::config::Backend::Pool,
                background: false,
                ..Config::default()
            },
        );
        Rig {
            sim,
            alloc: alloc.unwrap(),
            live: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn malloc(&self, bytes: u64, stream: Stream) -> DevicePtr {
        self.try_malloc(bytes, stream).unwrap()
    }

    fn try_malloc(&self, bytes: u64, stream: Stream) -> Result<DevicePtr, Error> {
        let ptr = self.alloc.malloc(bytes, 0, stream)?;
        let mut live = self.live.lock().unwrap();
        for &(other, other_bytes, state) in live.iter() {
            let overlap = ptr.0 < other.0 + other_bytes && other.0 < ptr.0 + bytes;
            assert!(
                !overlap || state == State::Freeing,
                "{ptr:#x}+{bytes} overlaps live {other:#x}+{other_bytes}"
            );
        }
        live.push((ptr, bytes, State::Live));
        Ok(ptr)
    }

    /// Marks the block as being freed, frees it, and only then forgets it.
    fn free(&self, ptr: DevicePtr) {
        self.set_state(ptr, State::Live, Some(State::Freeing));
        self.alloc.free(ptr, 0).unwrap();
        self.set_state(ptr, State::Freeing, None);
    }

    /// Moves the model's block at `ptr` from `from` to `to` (None: forgotten).
    fn set_state(&self, ptr: DevicePtr, from: State, to: Option<State>) {
        let mut live = self.live.lock().unwrap();
        let i = live
            .iter()
            .position(|&(p, _, state)| p == ptr && state == from)
            .unwrap_or_else(|| panic!("{ptr:#x} is not {from:?}"));
        match to {
            Some(state) => live[i].2 = state,
            None => {
                live.swap_remove(i);
            }
        }
    }

    /// Bytes of the blocks callers own (malloc returned, free not called yet).
    fn live_bytes(&self) -> u64 {
        let live = self.live.lock().unwrap();
        live.iter()
            .filter(|(_, _, state)| *state == State::Live)
            .map(|(_, bytes, _)| bytes)
            .sum()
    }

    fn stats(&self) -> StreampoolStats {
        self.alloc.device(0).unwrap().stats().unwrap()
    }

    /// Creates the pools (a block allocated, freed and flushed), so a model starts past that.
    fn with_pools() -> Rig {
        let r = Rig::new();
        let p = r.malloc(4 * KIB, STREAM);
        r.free(p);
        r.alloc.empty_cache().unwrap();
        r
    }

    /// The books agree with the pool: every allocation was a cache hit or a device allocation,
    /// and once the streams completed, the pool's used bytes are the live, cached and waiting
    /// (freed after record_stream) blocks. Sizes are multiples of 512 B: requested = block bytes.
    fn check_books(&self) {
        let s = self.stats();
        assert_eq!(s.num_allocs, s.num_cache_hits + s.num_device_allocs);
        let live_bytes = self.live_bytes();
        assert_eq!(s.allocated_bytes, live_bytes);
        self.sim.complete_all();
        let s = self.stats();
        let waiting_bytes = s.active_bytes - s.allocated_bytes;
        assert_eq!(
            s.pool_used_bytes,
            live_bytes + s.cached_bytes + waiting_bytes
        );
    }

    /// Nothing live; after `empty_cache` nothing cached, and nothing left in the pools.
    fn finish(&self) {
        assert!(self.live.lock().unwrap().is_empty());
        self.check_books();
        self.alloc.empty_cache().unwrap();
        let s = self.stats();
        assert_eq!((s.allocated_bytes, s.cached_bytes), (0, 0));
        self.sim.complete_all();
        assert_eq!(self.sim.outstanding_bytes(), 0, "leaked device memory");
    }
}

/// Runs `model` under every interleaving loom explores with at most 3 preemptions per run
/// (`LOOM_MAX_PREEMPTIONS` overrides), and prints how many there were and how long they took.
fn check(name: &str, model: fn()) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(3));
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    let start = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        model();
    });
    println!(
        "loom {name}: {} interleavings (preemption bound {:?}) in {:.1} s",
        runs.load(Ordering::Relaxed),
        builder.preemption_bound,
        start.elapsed().as_secs_f64()
    );
}

/// Two threads make the device's first allocation at once: the pools are created once and both
/// get distinct memory.
#[test]
fn first_allocations_create_the_pools_once() {
    check("first_allocations_create_the_pools_once", || {
        let r = Arc::new(Rig::new());
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let r = Arc::clone(&r);
                thread::spawn(move || r.malloc(4 * KIB, STREAM))
            })
            .collect();
        let ptrs: Vec<DevicePtr> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Config { backend: streampool::config::Backend::Pool, background: false, ..Config::default() } makes a main pool and a small-block pool, once.
        let pools = r.sim.pool_infos(0);
        assert_eq!(pools.len(), 2, "{pools:?}");
        assert!(pools.iter().all(|p| !p.destroyed && !p.shareable));
        assert_ne!(ptrs[0], ptrs[1]);
        for p in ptrs {
            r.free(p);
        }
        r.finish();
    });
}

/// One thread allocates and frees twice on a stream (the second allocation may reuse the first
/// block), another allocates and frees once on the same stream.
#[test]
fn cache_hits_and_misses_keep_the_books() {
    check("cache_hits_and_misses_keep_the_books", || {
        let r = Arc::new(Rig::with_pools());
        let a = {
            let r = Arc::clone(&r);
            thread::spawn(move || {
                for _ in 0..2 {
                    let p = r.malloc(4 * KIB, STREAM);
                    r.free(p);
                }
            })
        };
        let b = {
            let r = Arc::clone(&r);
            thread::spawn(move || {
                let p = r.malloc(4 * KIB, STREAM);
                r.free(p);
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        let s = r.stats();
        assert_eq!(s.num_allocs, 1 + 3);
        r.finish();
    });
}

/// One thread frees two blocks into the cache while another empties the cache and a third
/// allocates a block the pool must grow for (so make_room and release_cache_after_growth drain
/// the cache as it fills).
#[test]
fn frees_flush_and_growth_drain_the_cache_together() {
    check("frees_flush_and_growth_drain_the_cache_together", || {
        let r = Arc::new(Rig::with_pools());
        let blocks = [r.malloc(2 * MIB, STREAM), r.malloc(2 * MIB, STREAM)];
        let freeing = {
            let r = Arc::clone(&r);
            thread::spawn(move || blocks.into_iter().for_each(|p| r.free(p)))
        };
        let flushing = {
            let r = Arc::clone(&r);
            thread::spawn(move || r.alloc.empty_cache().unwrap())
        };
        let big = r.malloc(8 * MIB, STREAM);
        freeing.join().unwrap();
        flushing.join().unwrap();
        r.check_books();
        r.free(big);
        r.finish();
    });
}

/// A block used on stream 2 (record_stream) is freed while another thread allocates on its
/// stream: it is not reused before stream 2 completes, and is after.
#[test]
fn record_stream_blocks_wait_then_are_reused() {
    check("record_stream_blocks_wait_then_are_reused", || {
        let r = Arc::new(Rig::with_pools());
        let a = {
            let r = Arc::clone(&r);
            thread::spawn(move || {
                let p = r.malloc(4 * KIB, STREAM);
                r.alloc.record_stream(p, Stream(2)).unwrap();
                r.free(p);
                p
            })
        };
        let b = {
            let r = Arc::clone(&r);
            thread::spawn(move || r.malloc(4 * KIB, STREAM))
        };
        let p = a.join().unwrap();
        let q = b.join().unwrap();
        assert_ne!(p, q, "a block waiting for stream 2 was reused");
        r.check_books();
        let hits = r.stats().num_cache_hits;
        // Stream 2 has completed (check_books): the next allocation on stream 1 reuses the block.
        assert_eq!(r.malloc(4 * KIB, STREAM), p);
        assert_eq!(r.stats().num_cache_hits, hits + 1);
        r.free(p);
        r.free(q);
        r.finish();
    });
}

/// A defect an outside attack suite found: under a cap that fits one 2 MiB block (one granule of
/// pool memory: the cap counts reserved memory too), two threads allocate one at once: one gets
/// it, the other is out of memory — never both (the model's live bytes are checked at each
/// success). Fails when the limit is checked in one lock section and the
/// bytes are added in another (the old code, restored by hand).
#[test]
fn the_memory_fraction_is_a_hard_cap_for_concurrent_allocations() {
    check(
        "the_memory_fraction_is_a_hard_cap_for_concurrent_allocations",
        || {
            const CAP_BYTES: u64 = 2 * MIB;
            let r = Arc::new(Rig::with_pools());
            // 2 MiB of the simulated 1 GiB: 2^-9, exact in binary.
            (r.alloc.device(0).unwrap())
                .set_memory_fraction(1.0 / f64::from(1 << 9))
                .unwrap();
            assert_eq!(r.stats().memory_limit_bytes, CAP_BYTES);
            let threads: Vec<_> = (0..2)
                .map(|t| {
                    let r = Arc::clone(&r);
                    thread::spawn(move || match r.try_malloc(2 * MIB, Stream(1 + t)) {
                        Ok(p) => {
                            let live_bytes = r.live_bytes();
                            assert!(live_bytes <= CAP_BYTES, "{live_bytes} B live");
                            Some(p)
                        }
                        Err(e) => {
                            assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
                            None
                        }
                    })
                })
                .collect();
            let served: Vec<DevicePtr> = threads
                .into_iter()
                .filter_map(|t| t.join().unwrap())
                .collect();
            assert_eq!(served.len(), 1, "one block fits the cap, and it was free");
            assert_eq!(r.stats().num_ooms, 1);
            for p in served {
                r.free(p);
            }
            r.finish();
        },
    );
}

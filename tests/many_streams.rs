//! 100,000 distinct streams over a run — serving code that makes a stream per request and hands
//! it to PyTorch (`torch.cuda.ExternalStream`), CuPy or a C caller — must not slow the allocator
//! down or make it hold more: state kept for streams no longer used may not accumulate. An
//! outside suite measured 14.7M ops/s on one stream falling to 16k after 100k streams.
//!
//! Each stream here allocates and frees a small block twice (cached for its stream) and, every
//! tenth one, a large block (the vmm backend fences it on the stream); the GPU catches up every
//! thousand streams. Afterwards a stream used before and a new one must each run at a quarter of the
//! rate measured on one stream before, or more, and the device must hold no more than after a
//! tenth of the streams. Both backends. (`MANY_STREAMS=n` runs n streams instead, by hand.)
//! Beside it, with 200 streams whose work is in flight: an allocation's look queries the fences
//! of a bounded number of them; a synchronisation queries them all; a trim and a sleep, which
//! wait for the device, and an idle release, give back what each one freed.

use std::sync::{Arc, Mutex};
use std::time::Instant;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{Driver, Stream};
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;
fn streams() -> usize {
    std::env::var("MANY_STREAMS").map_or(100_000, |v| v.parse().unwrap())
}
const PAIRS: u32 = 10_000;
/// The two backends' runs take turns: each measures rates, and the other would compete for the
/// machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// malloc + free pairs per second on `stream`: the best of five runs of `PAIRS` pairs, each
/// cached for the stream after the first (the best: other work on the machine only slows).
fn pairs_per_s(alloc: &Allocator, stream: Stream) -> f64 {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..PAIRS {
                let p = alloc.malloc(4096, 0, stream).unwrap();
                alloc.free(p, 0).unwrap();
            }
            f64::from(PAIRS) / start.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

fn run(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Arc::new(SimDriver::new(1, 16 << 30));
    let config = Config {
        backend,
        background: false,
        ..Config::default()
    };
    let cache_limit_bytes = config.cache_limit.resolve_bytes(16 << 30);
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    let first = Stream(1);
    let before_per_s = pairs_per_s(&alloc, first);
    let held_before = alloc.device(0).unwrap().stats().unwrap().reserved_bytes;
    let mut held_early = 0;
    let start = Instant::now();
    for i in 0..streams() {
        if i == streams() / 10 {
            held_early = alloc.device(0).unwrap().stats().unwrap().reserved_bytes;
        }
        let s = Stream(0x1000 + i * 16);
        let small = alloc.malloc(4096 + (i as u64 % 4) * 512, 0, s).unwrap();
        alloc.free(small, 0).unwrap();
        let again = alloc.malloc(4096 + (i as u64 % 4) * 512, 0, s).unwrap();
        alloc.free(again, 0).unwrap();
        if i % 10 == 0 {
            let large = alloc.malloc(4 * MIB, 0, s).unwrap();
            alloc.free(large, 0).unwrap();
        }
        // The GPU keeps up: work finishes, that of streams no longer used included.
        if i % 1000 == 999 {
            sim.complete_all();
        }
    }
    let streams_s = start.elapsed().as_secs_f64();
    // The two streams' rates measured in turns, the best of each: a burst of other work on the
    // machine (a build beside the tests) slows the runs it falls on, not all of one stream's.
    let (mut old_per_s, mut new_per_s) = (0f64, 0f64);
    for _ in 0..4 {
        old_per_s = old_per_s.max(pairs_per_s(&alloc, first));
        new_per_s = new_per_s.max(pairs_per_s(&alloc, Stream(0x10)));
    }
    let st = alloc.device(0).unwrap().stats().unwrap();
    eprintln!(
        "{backend:?}: {before_per_s:.0} pairs/s on one stream; {} streams in \
         {streams_s:.1} s; then {old_per_s:.0} pairs/s on the first stream, {new_per_s:.0} on a \
         new one; reserved {} MiB before, {} MiB after a tenth of the streams, {} MiB after, {} MiB \
         cached",
        streams(),
        held_before / MIB,
        held_early / MIB,
        st.reserved_bytes / MIB,
        st.cached_bytes / MIB
    );
    // A quarter: a cost that grows with the streams seen falls by orders of magnitude here,
    // while a debug build on a loaded 2-core machine read 0.46-0.49 of the rate before with
    // nothing wrong (the tables have grown and fallen out of cache).
    assert!(
        old_per_s >= before_per_s / 4.0 && new_per_s >= before_per_s / 4.0,
        "{backend:?}: after {} streams {old_per_s:.0} and {new_per_s:.0} pairs/s, \
         below a quarter of {before_per_s:.0}",
        streams()
    );
    assert!(st.cached_bytes <= cache_limit_bytes);
    // The pool holds what the GPU has not caught up with (a thousand streams' frees) and the
    // cache's budget, which may still have been filling after a tenth of the streams; nothing
    // more for more streams.
    assert!(
        st.reserved_bytes <= held_early + cache_limit_bytes,
        "{backend:?}: {} MiB reserved after the streams, {} MiB after a tenth of them",
        st.reserved_bytes / MIB,
        held_early / MIB
    );
    assert_eq!(st.allocated_bytes, 0);
    alloc.empty_cache().unwrap();
    sim.complete_all();
    assert_eq!(sim.outstanding_bytes(), 0);
}

#[test]
fn a_hundred_thousand_streams_keep_the_rate_and_the_memory_of_one_pool_backend() {
    run(Backend::Pool);
}

#[test]
fn a_hundred_thousand_streams_keep_the_rate_and_the_memory_of_one_vmm_backend() {
    run(Backend::Vmm);
}

/// A vmm allocator on the simulator whose 200 streams each allocated and freed a block, their
/// work still in flight: more streams with fences than an allocation's look polls.
fn busy_streams() -> (
    Arc<SimDriver>,
    Allocator,
    std::sync::MutexGuard<'static, ()>,
) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = Arc::new(SimDriver::new(1, 16 << 30));
    let config = Config {
        backend: Backend::Vmm,
        background: false,
        ..Config::default()
    };
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    for i in 0..200 {
        let bytes = 4 * MIB + (i as u64 % 7) * 512;
        let p = alloc.malloc(bytes, 0, Stream(0x1000 + i * 16)).unwrap();
        alloc.free(p, 0).unwrap();
    }
    (sim, alloc, turn)
}

/// Nothing left: every block freed, every page back, nothing outstanding on the device.
fn assert_all_back(sim: &SimDriver, alloc: &Allocator) {
    alloc.empty_cache().unwrap();
    let st = alloc.device(0).unwrap().stats().unwrap();
    assert_eq!((st.allocated_bytes, st.reserved_bytes), (0, 0));
    sim.complete_all();
    assert_eq!(sim.outstanding_bytes(), 0);
}

/// A trim waits for the device, so every fence has completed: what each of many streams freed
/// goes back, not only what the streams an allocation's look would query had freed.
#[test]
fn empty_cache_gives_back_what_each_of_many_streams_freed_vmm_backend() {
    let (sim, alloc, _turn) = busy_streams();
    alloc.empty_cache().unwrap();
    let st = alloc.device(0).unwrap().stats().unwrap();
    assert_eq!(st.reserved_bytes, 0, "before the device completed anything");
    assert_all_back(&sim, &alloc);
}

/// An allocation that finds nothing free on a new stream queries the fences of a bounded number
/// of the streams with work in flight, not of every one.
#[test]
fn a_miss_queries_the_fences_of_a_bounded_number_of_busy_streams_vmm_backend() {
    let (sim, alloc, _turn) = busy_streams();
    let queried = sim.calls("cuEventQuery");
    let p = alloc.malloc(4 * MIB, 0, Stream(0x10)).unwrap();
    let queries = sim.calls("cuEventQuery") - queried;
    assert!((1..=64).contains(&queries), "{queries} fences queried");
    alloc.free(p, 0).unwrap();
    assert_all_back(&sim, &alloc);
}

/// At the program's synchronisation every fence recorded before it has completed: it polls
/// every busy stream, so that what each freed is ready for any stream.
#[test]
fn a_synchronisation_polls_every_busy_stream_vmm_backend() {
    let (sim, alloc, _turn) = busy_streams();
    sim.complete_all(); // the program synchronised the device
    let queried = sim.calls("cuEventQuery");
    alloc.device(0).unwrap().synchronized().unwrap();
    let queries = sim.calls("cuEventQuery") - queried;
    assert!(queries >= 200, "{queries} fences queried");
    assert_all_back(&sim, &alloc);
}

/// A sleep waits for the device: every page that many streams freed goes back, and none is
/// saved to the host as if a live block held it.
#[test]
fn a_sleep_gives_back_what_each_of_many_streams_freed_vmm_backend() {
    let (sim, alloc, _turn) = busy_streams();
    let device = alloc.device(0).unwrap();
    device.sleep(1, &[]).unwrap();
    assert_eq!(device.sleep_saved_bytes(), 0);
    assert_eq!(sim.outstanding_bytes(), 0, "every page back while asleep");
    device.wake().unwrap();
    assert_all_back(&sim, &alloc);
}

/// The idle release follows the device: once the work of every stream is done, a device left idle
/// gives back what each of many streams freed at its first try (with no poll of their fences, 6
/// MiB stays).
#[test]
fn an_idle_release_gives_back_what_each_of_many_streams_freed_vmm_backend() {
    let (sim, alloc, _turn) = busy_streams();
    sim.stop_clock();
    sim.complete_all(); // the GPU caught up; the program made no call
    alloc.tend(); // the first look begins the idle period
    sim.advance_clock_ms(Config::default().idle_release_ms.unwrap() + 1);
    alloc.tend();
    let st = alloc.device(0).unwrap().stats().unwrap();
    assert_eq!(
        st.reserved_bytes, 0,
        "one idle release gave back every page"
    );
    assert_all_back(&sim, &alloc);
}

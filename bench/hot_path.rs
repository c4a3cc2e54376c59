//! The Rust hot path on the simulated driver: malloc + free pairs served by the cache.
//! Target: <= 50 ns per pair on one thread (measured figures: bench/results/costs/README.md).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use std::hint::black_box;
use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::{sim::SimDriver, DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

fn allocator() -> Allocator {
    let sim: Arc<dyn Driver> = Arc::new(SimDriver::new(1, 64 << 30));
    let config = Config {
        backend: Backend::Pool,
        ..Config::default()
    };
    Allocator::new(sim, config).unwrap()
}

fn bench(c: &mut Criterion) {
    let a = allocator();
    let s0 = Stream(0);
    let p = a.malloc(1 << 20, 0, s0).unwrap();
    a.free(p, 0).unwrap();
    c.bench_function("cache_hit_pair_1MiB", |b| {
        b.iter(|| {
            let p = a.malloc(black_box(1 << 20), 0, s0).unwrap();
            a.free(black_box(p), 0).unwrap();
        })
    });

    // A large block the virtual-memory resource serves (not cached): its own best fit, the
    // block freed on the stream reused at once; the pages were mapped by the first pair.
    for (name, bytes) in [
        ("vmm_pair_8MiB", 8u64 << 20),
        ("vmm_pair_256MiB", 256 << 20),
    ] {
        let p = a.malloc(bytes, 0, s0).unwrap();
        a.free(p, 0).unwrap();
        c.bench_function(name, |b| {
            b.iter(|| {
                let p = a.malloc(black_box(bytes), 0, s0).unwrap();
                a.free(black_box(p), 0).unwrap();
            })
        });
    }

    // Steady state of a training step: every size was live at once earlier (the pool holds
    // them all), so the cache can keep one block of each without raising peak memory. The sizes
    // (512 B to 1.5 MiB, both pools) total 48 MiB, within the 64 MiB cache budget: all hits.
    let sizes: Vec<u64> = (0..64).map(|i| 512 + (i * 7919 % 1536) * 1024).collect();
    let warm: Vec<DevicePtr> = sizes.iter().map(|&s| a.malloc(s, 0, s0).unwrap()).collect();
    for p in warm {
        a.free(p, 0).unwrap();
    }
    c.bench_function("cache_hit_pairs_mixed_sizes_x64", |b| {
        b.iter(|| {
            for &s in &sizes {
                let p = a.malloc(black_box(s), 0, s0).unwrap();
                a.free(p, 0).unwrap();
            }
        })
    });

    c.bench_function("cache_hit_pair_two_threads_x10000", |b| {
        let shared = Arc::new(allocator());
        b.iter_batched(
            || Arc::clone(&shared),
            |alloc| {
                let worker = |stream: usize| {
                    let alloc = Arc::clone(&alloc);
                    std::thread::spawn(move || {
                        for _ in 0..10_000 {
                            let p = alloc.malloc(4096, 0, Stream(stream)).unwrap();
                            alloc.free(p, 0).unwrap();
                        }
                    })
                };
                let (t1, t2) = (worker(1), worker(2));
                t1.join().unwrap();
                t2.join().unwrap();
            },
            BatchSize::PerIteration,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! What one allocation costs on the real CUDA driver, call by call: the profile behind the
//! hot-path and training-step figures in bench/results/costs/README.md. Needs a GPU; without one
//! it says so and exits 0. Build with `cargo bench --bench driver_costs --no-run` where Rust is,
//! run the binary on the machine with the GPU (`scripts/gpu-diag costs`).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use streampool::driver::{
    cuda::CudaDriver, DeviceDriver, Driver, PoolAttr, PoolDriver, Stream, StreamDriver,
};
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;
const ROUNDS: usize = 5;

/// Median over rounds of the nanoseconds per operation of `op`, run `n` times per round.
fn ns_per_op(n: usize, mut op: impl FnMut(usize)) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                op(i);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let driver = match CudaDriver::new() {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("driver_costs: no CUDA driver here ({e}); nothing measured");
            return;
        }
    };
    let n = 20_000;
    let pool = driver.pool_create(0, u64::MAX, false).unwrap();
    driver
        .pool_set_attr(0, pool, PoolAttr::ReleaseThresholdBytes(u64::MAX))
        .unwrap();
    let report = |what: &str, ns: f64| println!("COST {what:<52} {ns:8.0} ns");

    report(
        "cuStreamIsCapturing (with the context check)",
        ns_per_op(n, |_| {
            black_box(driver.is_capturing(0, Stream(0)).unwrap());
        }),
    );
    report(
        "pool reserved + used (2 x cuMemPoolGetAttribute)",
        ns_per_op(n, |_| {
            black_box(driver.pool_reserved_used(0, pool).unwrap());
        }),
    );
    for bytes in [4096, MIB, 64 * MIB] {
        let ns = ns_per_op(n, |_| {
            let p = driver.alloc_async(0, pool, bytes, Stream(0)).unwrap();
            driver.free_async(0, p, Stream(0)).unwrap();
        });
        report(
            &format!("cuMemAllocFromPoolAsync + cuMemFreeAsync, {bytes} B"),
            ns,
        );
    }
    driver.synchronize(0).unwrap();
    driver.pool_destroy(0, pool).unwrap();

    let alloc = Allocator::new(driver.clone() as Arc<dyn Driver>, Config::default()).unwrap();
    report(
        "streampool malloc + free, cache hit, 1 MiB",
        ns_per_op(n, |_| {
            let p = alloc.malloc(MIB, 0, Stream(0)).unwrap();
            alloc.free(black_box(p), 0).unwrap();
        }),
    );
    // Each request is 25% larger than the block just freed (sizes cycle), so the cache, which
    // serves a block at most 1/8 larger, cannot serve it from that block.
    for (what, base) in [("small pool", 4096u64), ("main pool", 2 * MIB)] {
        let sizes: Vec<u64> = (0..8).map(|i| base * 5u64.pow(i) / 4u64.pow(i)).collect();
        let ns = ns_per_op(n, |i| {
            let p = alloc.malloc(sizes[i % sizes.len()], 0, Stream(0)).unwrap();
            alloc.free(p, 0).unwrap();
        });
        report(
            &format!("streampool malloc + free, sizes +25% each, {what}"),
            ns,
        );
    }
    let s = alloc.stats(0).unwrap();
    println!(
        "COST (stats: {} allocations, {} cache hits, {} device allocs, {} waits before growth)",
        s.num_allocs, s.num_cache_hits, s.num_device_allocs, s.num_growth_syncs
    );
    alloc.empty_cache().unwrap();
    drop(alloc);

    // No cache: every malloc and free goes to the pool, i.e. the cost of a cache miss.
    let uncached = Config {
        cache_limit: streampool::units::SizeSpec::Bytes(0),
        ..Config::default()
    };
    let alloc = Allocator::new(driver.clone() as Arc<dyn Driver>, uncached).unwrap();
    for bytes in [4096, 64 * MIB] {
        let ns = ns_per_op(n, |_| {
            let p = alloc.malloc(bytes, 0, Stream(0)).unwrap();
            alloc.free(p, 0).unwrap();
        });
        report(
            &format!("streampool malloc + free, no cache, {bytes} B"),
            ns,
        );
    }
    alloc.empty_cache().unwrap();
}

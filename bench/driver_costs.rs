//! What one allocation costs on the real CUDA driver, call by call: the profile behind the
//! hot-path and training-step figures in bench/results/costs/README.md. Needs a GPU; without one
//! it says so and exits 0. Build with `cargo bench --bench driver_costs --no-run` where Rust is,
//! run the binary on the machine with the GPU (`scripts/gpu-diag costs`).
//! `COST vmm ...` lines: what the vmm backend's page calls cost (each per 2 MiB page, or per
//! call where it says so), the figures behind sleep and wake's time; `COST sleep ...` lines
//! (bench/driver_costs_sleep.rs): the choices sleep and wake's speed depends on.

#[path = "driver_costs_sleep.rs"]
mod sleep_costs;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use streampool::config::Backend;
use streampool::driver::{
    cuda::CudaDriver, DeviceDriver, DevicePtr, Driver, MemHandle, PoolAttr, PoolDriver, Stream,
    StreamDriver, VmmDriver,
};
use streampool::{Allocator, Config};

/// The pool backend: its figures are what this profile's labels name (pools, the cache).
fn pool_config() -> Config {
    Config {
        backend: Backend::Pool,
        ..Config::default()
    }
}

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

    let alloc = Allocator::new(driver.clone() as Arc<dyn Driver>, pool_config()).unwrap();
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
    let s = alloc.device(0).unwrap().stats().unwrap();
    println!(
        "COST (stats: {} allocations, {} cache hits, {} device allocs, {} waits before growth)",
        s.num_allocs, s.num_cache_hits, s.num_device_allocs, s.num_growth_syncs
    );
    alloc.empty_cache().unwrap();
    drop(alloc);

    // No cache: every malloc and free goes to the pool, i.e. the cost of a cache miss.
    let uncached = Config {
        cache_limit: streampool::units::SizeSpec::Bytes(0),
        ..pool_config()
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
    drop(alloc);
    // Last: a refusal there ends the binary, and the lines above are printed already.
    vmm_page_costs(&driver);
    sleep_costs::sleep_costs(&driver);
}

/// Nanoseconds per item of `op` over `items`, timed once (each call changes the device).
fn ns_each<T>(items: &[T], mut op: impl FnMut(&T)) -> f64 {
    let t = Instant::now();
    for item in items {
        op(item);
    }
    t.elapsed().as_nanos() as f64 / items.len().max(1) as f64
}

/// The vmm page calls on `PAGES` pages of one reservation: create, map, access, copies, unmap
/// and release, one page at a time and, where the driver allows it, a whole run at once.
fn vmm_page_costs(driver: &Arc<CudaDriver>) {
    const PAGES: u64 = 512;
    let report = |what: &str, ns: f64| println!("COST vmm {what:<56} {ns:10.0} ns");
    let page = match driver.vmm_granularity_bytes(0) {
        Ok(bytes) => bytes.max(2 * MIB),
        Err(e) => return println!("COST vmm: no virtual memory management here ({e})"),
    };
    let run_bytes = PAGES * page;
    let base = driver.address_reserve(0, run_bytes).unwrap();
    let at: Vec<DevicePtr> = (0..PAGES).map(|i| DevicePtr(base.0 + i * page)).collect();
    let mut handles: Vec<MemHandle> = Vec::new();
    report(
        "cuMemCreate, one page",
        ns_each(&at, |_| {
            handles.push(driver.mem_create(0, page).unwrap());
        }),
    );
    let pairs: Vec<(DevicePtr, MemHandle)> =
        at.iter().copied().zip(handles.iter().copied()).collect();
    report(
        "cuMemMap, one page",
        ns_each(&pairs, |&(p, h)| {
            driver.mem_map(0, p, page, h).unwrap();
        }),
    );
    report(
        "cuMemSetAccess, one page",
        ns_each(&at, |&p| {
            driver.mem_set_access(0, p, page, &[0]).unwrap();
        }),
    );

    let t = Instant::now();
    let host = driver.host_alloc(0, run_bytes).unwrap();
    let pin_ns = t.elapsed().as_nanos() as f64;
    report(
        "host_alloc (huge pages, touched by threads, registered), per page of the run",
        pin_ns / PAGES as f64,
    );
    let offsets: Vec<u64> = (0..PAGES).map(|i| i * page).collect();
    let s = driver.stream_create(0).unwrap();
    // `bytes` from `offset` of the run to the host (or back), and the wait for it.
    let copy = |to_host: bool, offset: u64, bytes: u64| {
        let at = DevicePtr(base.0 + offset);
        match to_host {
            true => driver.copy_to_host(0, host, offset, at, bytes, s),
            false => driver.copy_to_device(0, at, host, offset, bytes, s),
        }
        .unwrap();
        driver.stream_synchronize(0, s).unwrap();
    };
    report(
        "cuMemcpyDtoHAsync + wait, one page",
        ns_each(&offsets, |&o| copy(true, o, page)),
    );
    report(
        "cuMemcpyHtoDAsync + wait, one page",
        ns_each(&offsets, |&o| copy(false, o, page)),
    );
    let t = Instant::now();
    copy(true, 0, run_bytes);
    report(
        "cuMemcpyDtoH, the whole run (per page)",
        t.elapsed().as_nanos() as f64 / PAGES as f64,
    );
    let t = Instant::now();
    copy(false, 0, run_bytes);
    report(
        "cuMemcpyHtoD, the whole run (per page)",
        t.elapsed().as_nanos() as f64 / PAGES as f64,
    );
    driver.host_free(0, host);

    report(
        "cuMemUnmap, one page",
        ns_each(&at, |&p| {
            driver.mem_unmap(0, p, page).unwrap();
        }),
    );
    report(
        "cuMemRelease, one page",
        ns_each(&handles, |&h| {
            driver.mem_release(0, h).unwrap();
        }),
    );

    // The whole run unmapped with one call: allowed, or refused (then one page at a time).
    let handles: Vec<MemHandle> = at
        .iter()
        .map(|_| driver.mem_create(0, page).unwrap())
        .collect();
    for (&p, &h) in at.iter().zip(&handles) {
        driver.mem_map(0, p, page, h).unwrap();
    }
    // Fresh mappings, as a wake's: one access call for the whole run.
    let t = Instant::now();
    driver.mem_set_access(0, base, run_bytes, &[0]).unwrap();
    report(
        "cuMemSetAccess, the whole run in one call (per page)",
        t.elapsed().as_nanos() as f64 / PAGES as f64,
    );
    let t = Instant::now();
    match driver.mem_unmap(0, base, run_bytes) {
        Ok(()) => report(
            "cuMemUnmap, the whole run in one call (per page)",
            t.elapsed().as_nanos() as f64 / PAGES as f64,
        ),
        Err(e) => {
            println!("COST vmm cuMemUnmap of {PAGES} mappings in one call refused: {e}");
            for &p in &at {
                driver.mem_unmap(0, p, page).unwrap();
            }
        }
    }
    for h in handles {
        driver.mem_release(0, h).unwrap();
    }

    if driver.mem_export_supported(0).unwrap_or(false) {
        let mut exportable = Vec::new();
        report(
            "cuMemCreate exportable (POSIX fd), one page",
            ns_each(&at, |_| {
                exportable.push(driver.mem_create_exportable(0, page).unwrap());
            }),
        );
        for h in exportable {
            driver.mem_release(0, h).unwrap();
        }
    }

    // Four threads creating and releasing pages at once: does the driver serialise them?
    let create_release = |pages: u64| {
        let made: Vec<MemHandle> = (0..pages)
            .map(|_| driver.mem_create(0, page).unwrap())
            .collect();
        for h in made {
            driver.mem_release(0, h).unwrap();
        }
    };
    for threads in [4, 1] {
        let t = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| create_release(PAGES / threads));
            }
        });
        report(
            &format!("cuMemCreate + cuMemRelease, {threads} thread(s) (wall per page)"),
            t.elapsed().as_nanos() as f64 / PAGES as f64,
        );
    }
    driver.address_free(0, base, run_bytes).unwrap();
}

//! Instructions per malloc + free pair on the allocation hot path, one path at a time, for
//! `scripts/hot-path-gate` (which runs it under `valgrind --tool=callgrind` and compares with
//! `bench/hot_path_baseline.json`):
//! `cargo run --release --features sim --example pairs -- PATH PAIRS` (PATH: see [`PATHS`]).
//!
//! With `PAIRS_DRIVER=cuda` it runs on the real driver instead (streams 1 and 2 are CUDA's
//! legacy and per-thread default streams) and prints the wall time per pair: what the library
//! alone costs on a GPU machine (`scripts/gpu-diag pairs`).
//!
//! Invariant: only the pairs inside [`measured`] are what callgrind counts
//! (`--collect-atstart=no --toggle-collect=pairs::measured`): set-up and warm-up pairs run
//! before it, on one thread, with no background thread, on the simulated driver with its clock
//! stopped, so the count is the same on every run and whatever else the machine runs.
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::{sim::SimDriver, DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

/// Pairs before the measured ones: every cache, map and list the path touches is at its steady
/// size (the cross-stream path's cost per pair settles only after about 1,100 pairs).
const WARM_UP_PAIRS: u64 = 4096;

/// One measured path: the backend, the block's bytes, whether the block is used on a second
/// stream before its free, and the churn window (0: each block is freed at once).
struct Path {
    name: &'static str,
    what: &'static str,
    backend: Backend,
    /// The block's bytes; in a churn, the largest block's.
    bytes: u64,
    cross_stream: bool,
    /// Churn: blocks of log-uniform sizes from [`CHURN_MIN_BYTES`] to `bytes`, each freed once
    /// `window` newer ones are live (the benchmark's `churn` workload); a pair is one
    /// allocation and one free.
    window: usize,
}

/// The smallest block of a churn (as the benchmark's `churn` workload).
const CHURN_MIN_BYTES: u64 = 512;

/// The paths the gate counts.
const PATHS: &[Path] = &[
    Path {
        name: "cached_small",
        what: "pool backend, 1 MiB (the small pool), a cache hit on the allocating stream",
        backend: Backend::Pool,
        bytes: 1 << 20,
        cross_stream: false,
        window: 0,
    },
    Path {
        name: "cached_large",
        what: "pool backend, 16 MiB (the large pool), a cache hit on the allocating stream",
        backend: Backend::Pool,
        bytes: 16 << 20,
        cross_stream: false,
        window: 0,
    },
    Path {
        name: "vmm_large",
        what: "vmm backend, 64 MiB, the block freed on the stream reused at once",
        backend: Backend::Vmm,
        bytes: 64 << 20,
        cross_stream: false,
        window: 0,
    },
    Path {
        name: "vmm_small",
        what:
            "vmm backend, 64 KiB (a carrier page's), the block freed on the stream reused at once",
        backend: Backend::Vmm,
        bytes: 64 << 10,
        cross_stream: false,
        window: 0,
    },
    Path {
        name: "cross_stream",
        what: "pool backend, 1 MiB, used on a second stream (record_stream) before its free",
        backend: Backend::Pool,
        bytes: 1 << 20,
        cross_stream: true,
        window: 0,
    },
    Path {
        name: "vmm_churn",
        what: "vmm backend, the benchmark's churn: 512 B to 64 MiB, log-uniform, 64 blocks live",
        backend: Backend::Vmm,
        bytes: 64 << 20,
        cross_stream: false,
        window: 64,
    },
];

/// The simulated GPU's clock moves on by this much per pair: about what a pair takes on a GPU
/// machine, so fences and anything else done "once per interval" happen as often as there.
const PAIR_US: u64 = 2;

/// What a churn carries from pair to pair: its live blocks, oldest first, and its random state.
struct Churn {
    live: VecDeque<DevicePtr>,
    seed: u64,
}

impl Churn {
    fn new() -> Churn {
        Churn {
            live: VecDeque::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The next size, log-uniform in `[CHURN_MIN_BYTES, max_bytes]` (xorshift64: the same
    /// sequence on every run).
    fn next_bytes(&mut self, max_bytes: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let unit = (self.seed >> 11) as f64 / (1u64 << 53) as f64;
        let (lo, hi) = ((CHURN_MIN_BYTES as f64).ln(), (max_bytes as f64).ln());
        (lo + unit * (hi - lo)).exp() as u64
    }
}

fn pair(a: &Allocator, path: &Path, churn: &mut Churn, sim: Option<&SimDriver>) {
    if path.window > 0 {
        let bytes = churn.next_bytes(path.bytes);
        churn
            .live
            .push_back(a.malloc(black_box(bytes), 0, Stream(1)).unwrap());
        if churn.live.len() > path.window {
            a.free(black_box(churn.live.pop_front().unwrap()), 0)
                .unwrap();
        }
    } else {
        let p = a.malloc(black_box(path.bytes), 0, Stream(1)).unwrap();
        if path.cross_stream {
            a.record_stream(p, Stream(2)).unwrap();
        }
        a.free(black_box(p), 0).unwrap();
    }
    if let Some(sim) = sim {
        sim.advance_clock_us(PAIR_US);
    }
}

/// The pairs callgrind counts (the module's invariant); never inlined, so that it has a symbol.
#[inline(never)]
fn measured(a: &Allocator, path: &Path, churn: &mut Churn, pairs: u64, sim: Option<&SimDriver>) {
    for _ in 0..pairs {
        pair(a, path, churn, sim);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        let names: Vec<&str> = PATHS.iter().map(|p| p.name).collect();
        eprintln!("usage: pairs PATH PAIRS (PATH: {})", names.join(", "));
        for p in PATHS {
            eprintln!("  {}: {}", p.name, p.what);
        }
        std::process::exit(2);
    };
    if args.len() != 2 {
        usage();
    }
    let Some(path) = PATHS.iter().find(|p| p.name == args[0]) else {
        return usage();
    };
    let Ok(pairs) = args[1].parse::<u64>() else {
        return usage();
    };
    let cuda = std::env::var("PAIRS_DRIVER").is_ok_and(|d| d == "cuda");
    let simulated = (!cuda).then(|| {
        let sim = Arc::new(SimDriver::new(1, 64 << 30));
        // The simulator's clock moves only by PAIR_US a pair: nothing the allocator does by time
        // (fences every so often, cold pages, idle release) depends on how fast valgrind runs
        // it. Its GPU keeps up with the program, as it does with a loop that queues no kernels:
        // an event recorded on an idle stream has completed by the next query.
        sim.stop_clock();
        sim.gpu_keeps_up(0);
        sim
    });
    let sim: Arc<dyn Driver> = match &simulated {
        Some(sim) => Arc::clone(sim) as Arc<dyn Driver>,
        None => Arc::new(streampool::driver::cuda::CudaDriver::new().unwrap()),
    };
    let config = Config {
        background: false,
        backend: path.backend,
        ..Config::default()
    };
    let a = Allocator::new(sim, config).unwrap();
    let mut churn = Churn::new();
    for _ in 0..WARM_UP_PAIRS {
        pair(&a, path, &mut churn, simulated.as_deref());
    }
    let began = std::time::Instant::now();
    measured(&a, path, &mut churn, pairs, simulated.as_deref());
    if cuda {
        let ns = began.elapsed().as_nanos() as f64 / pairs as f64;
        println!("PAIRS library {} {ns:.0} ns/pair", path.name);
    }
}

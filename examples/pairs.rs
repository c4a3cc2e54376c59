//! Instruction counts of the allocation hot path (run under `valgrind --tool=callgrind`):
//! `cargo run --release --features sim --example pairs -- BYTES PAIRS`.
use std::sync::Arc;
use streampool::driver::{sim::SimDriver, Driver, Stream};
use streampool::{Allocator, Config};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("BYTES PAIRS"))
        .collect();
    let (bytes, pairs) = (args[0], args[1]);
    let sim: Arc<dyn Driver> = Arc::new(SimDriver::new(1, 64 << 30));
    let config = Config {
        background: false,
        ..Config::default()
    };
    let a = Allocator::new(sim, config).unwrap();
    let s = Stream(0);
    for _ in 0..pairs {
        let p = a.malloc(bytes, 0, s).unwrap();
        a.free(p, 0).unwrap();
    }
}

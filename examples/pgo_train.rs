//! The training run of the release library's profile-guided build (`scripts/build-pgo`): the
//! committed allocation traces replayed through the C functions PyTorch calls (`my_malloc`,
//! `my_free`) on the simulated driver, so that the profile covers the entry points as well as
//! what lies below them. (`bench/replay.rs` replays the same traces one layer lower, on a
//! modeled GPU clock; the build trains on both.)
//!
//! `STREAMPOOL_DRIVER=sim STREAMPOOL_BACKEND=vmm cargo run --release --features sim --example
//! pgo_train -- TRACE...`
//!
//! Every stream of a trace is the legacy default stream here: PyTorch's default, on which the
//! benchmark's models allocate. PyTorch asks `my_malloc` for 0 bytes for an empty tensor:
//! [`ZERO_BYTE_EVERY`] puts such calls among the allocations.
//!
//! Invariant: every allocation succeeds and every free is taken, or the run fails (a profile of
//! failing calls would lay out the wrong code as hot): a refused allocation throws PyTorch's C++
//! exception, which ends this program, and a refused free leaves bytes allocated, which the
//! statistics at the end of each trace show.
#[allow(dead_code)]
#[path = "../bench/replay/inflate.rs"]
mod inflate;
#[allow(dead_code)]
#[path = "../bench/replay/trace.rs"]
mod trace;

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::path::Path;
use std::process::ExitCode;
use streampool::StreampoolStats;
use trace::{Event, Trace};

/// One `my_malloc(0)` before every this many allocations: vision_sizes made about one for every
/// six real ones on the GPU (bench/results/2026-11-30-h200-floor, call 2).
const ZERO_BYTE_EVERY: u64 = 6;

extern "C-unwind" {
    fn my_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
}

extern "C" {
    fn my_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn streampool_synchronizing(device: c_int) -> c_int;
    fn streampool_synchronized(device: c_int) -> c_int;
    fn streampool_empty_cache();
    fn streampool_last_error() -> *const std::ffi::c_char;
    fn streampool_get_stats(device: c_int, out: *mut StreampoolStats) -> c_int;
}

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: pgo_train TRACE... (with STREAMPOOL_DRIVER=sim)");
        return ExitCode::from(2);
    }
    for path in &paths {
        let replayed = Trace::load(Path::new(path)).and_then(|t| replay(&t));
        if let Err(e) = replayed {
            eprintln!("pgo_train: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Replays `trace`'s allocations, frees and synchronisations; frees what is left at its end.
fn replay(trace: &Trace) -> Result<(), String> {
    let legacy = std::ptr::null_mut();
    let mut live: HashMap<u64, (*mut c_void, isize)> = HashMap::new();
    let mut allocations = 0u64;
    for event in &trace.events {
        match *event {
            Event::Alloc { id, bytes, .. } => {
                allocations += 1;
                if allocations.is_multiple_of(ZERO_BYTE_EVERY) {
                    // SAFETY: a size, device 0 and the legacy stream; 0 bytes gives NULL.
                    let none = unsafe { my_malloc(0, 0, legacy) };
                    if !none.is_null() {
                        return Err(format!("{}: my_malloc(0) gave {none:?}", trace.name));
                    }
                }
                let size = isize::try_from(bytes).map_err(|_| format!("{bytes} B too large"))?;
                // SAFETY: as above; a positive size gives a block or throws (never NULL), and a
                // throw ends this program (Rust cannot catch a C++ exception).
                let ptr = unsafe { my_malloc(size, 0, legacy) };
                live.insert(id, (ptr, size));
            }
            Event::Free { id } => {
                let (ptr, size) = live
                    .remove(&id)
                    .ok_or(format!("{}: free of {id}", trace.name))?;
                // SAFETY: a block my_malloc gave on device 0, freed once.
                unsafe { my_free(ptr, size, 0, legacy) };
            }
            Event::Sync => {
                // SAFETY: plain calls with a device index. (Nothing synchronises the simulated
                // device between them, as a program would: here no block waits for another
                // stream, so the mark takes none as done.)
                if unsafe { streampool_synchronizing(0) } != 0 {
                    return Err(format!("{}: synchronizing: {}", trace.name, last()));
                }
                // SAFETY: as above.
                if unsafe { streampool_synchronized(0) } != 0 {
                    return Err(format!("{}: synchronized: {}", trace.name, last()));
                }
            }
            Event::EmptyCache => {
                // SAFETY: no arguments.
                unsafe { streampool_empty_cache() };
            }
            Event::Record { .. } | Event::Wait { .. } | Event::Step => {}
        }
    }
    for (_, (ptr, size)) in live.drain() {
        // SAFETY: as above.
        unsafe { my_free(ptr, size, 0, legacy) };
    }
    // A free the library refused leaves its bytes allocated (my_free only logs its error).
    let mut stats = StreampoolStats::default();
    // SAFETY: a device index and a writable StreampoolStats.
    if unsafe { streampool_get_stats(0, &mut stats) } != 0 {
        return Err(format!("{}: statistics: {}", trace.name, last()));
    }
    match stats.allocated_bytes {
        0 => Ok(()),
        left => Err(format!(
            "{}: {left} B still allocated at the end: a free was refused",
            trace.name
        )),
    }
}

/// The library's last error message.
fn last() -> String {
    // SAFETY: the library returns a valid C string, kept until the next call on this thread.
    unsafe { CStr::from_ptr(streampool_last_error()) }
        .to_string_lossy()
        .into_owned()
}

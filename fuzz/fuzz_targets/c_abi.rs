//! Drives the exported C ABI (`my_malloc`/`my_free` and every `streampool_*` function, src/ffi/)
//! on the simulated driver with arbitrary operations, from one thread or several at once, with
//! sizes over the whole range: 0, small, either side of `MAX_ALLOCATION_BYTES`, near `SIZE_MAX`,
//! any 64-bit value, and negative `ssize_t` through `my_malloc` (whose C++ exception is caught by
//! fuzz/shim/catch_my_malloc.cpp; Rust cannot catch it).
//!
//! Run with `FUZZ_TARGET=c_abi scripts/fuzz [seconds]`, and with `FUZZ_PROFILE=release` for a
//! build without overflow checks, as users run the library (docs/reliability.md).
//!
//! The process has one allocator (the C ABI's), shared by every input: an input starts with
//! nothing allocated and must end so. Checked after every operation:
//! - no status is `STREAMPOOL_STATUS_INTERNAL_ERROR` (a caught panic, e.g. an overflow in a build
//!   with overflow checks) and every status and message is the one the arguments call for: a bad
//!   device, a negative size and a bad fraction are invalid arguments, a size above
//!   `MAX_ALLOCATION_BYTES` is out of memory that says so, a foreign pointer is unknown, a malloc
//!   either succeeds or is out of memory;
//! - a returned block is 512-byte aligned and overlaps no block the callers own (a block counts
//!   from malloc's return until its free was called, and may be reused once its free began);
//! - the timeline's events come out in time order; listed blocks are aligned and on their device;
//! - with one thread, `allocated_bytes` of each device equals the model's live bytes, so a call
//!   that failed changed nothing, and `memory_limit_bytes` follows `set_memory_fraction`.
//!
//! At the end of an input: every block is freed, the cache emptied, and each device holds
//! nothing — no live, cached, active, pool-used or reserved bytes.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Barrier, Mutex, Once};
use streampool::error::StreampoolStatus as Status;
use streampool::history::{StreampoolBlock, StreampoolEvent};
use streampool::ipc::StreampoolIpcHandle;
use streampool::{StreampoolStats, MAX_ALLOCATION_BYTES};

const DEVICES: i32 = 2;
const MEMORY_BYTES: u64 = 64 << 20;
const MAX_OPS: usize = 200;
const OK: c_int = Status::Ok as c_int;
const INVALID: c_int = Status::InvalidArgument as c_int;
const UNKNOWN: c_int = Status::UnknownPointer as c_int;
/// Where the simulator's device 0 hands out addresses; nothing is ever at base + 256.
const SIM_BASE: u64 = 0x7f00_0000_0000;

type MyMalloc = unsafe extern "C-unwind" fn(isize, c_int, *mut c_void) -> *mut c_void;

extern "C-unwind" {
    fn my_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void;
}

extern "C" {
    fn my_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
    fn streampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn streampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) -> c_int;
    fn streampool_last_error() -> *const c_char;
    fn streampool_init(device_count: c_int);
    fn streampool_empty_cache();
    fn streampool_record_stream(ptr: *mut c_void, stream: *mut c_void);
    fn streampool_set_memory_fraction(fraction: f64, device: c_int);
    fn streampool_get_stats(device: c_int, out: *mut StreampoolStats) -> c_int;
    fn streampool_reset_peak_stats(device: c_int);
    fn streampool_set_release_threshold(device: c_int, bytes: u64) -> c_int;
    fn streampool_trim(device: c_int, keep_bytes: u64) -> c_int;
    fn streampool_parse_bytes(spec: *const c_char, device: c_int, out_bytes: *mut u64) -> c_int;
    fn streampool_enable_peer_access(device: c_int) -> c_int;
    fn streampool_record_history(enabled: c_int, max_entries: usize) -> c_int;
    fn streampool_history(
        out: *mut StreampoolEvent,
        capacity: usize,
        count: *mut usize,
        dropped: *mut u64,
    ) -> c_int;
    fn streampool_blocks(
        device: c_int,
        out: *mut StreampoolBlock,
        capacity: usize,
        count: *mut usize,
    ) -> c_int;
    fn streampool_shareable_begin() -> c_int;
    fn streampool_shareable_end() -> c_int;
    fn streampool_pools_supported(device: c_int) -> c_int;
    fn streampool_ipc_supported(device: c_int) -> c_int;
    fn streampool_vmm_supported(device: c_int) -> c_int;
    fn streampool_ipc_export(
        ptr: *mut c_void,
        device: c_int,
        stream: *mut c_void,
        out: *mut StreampoolIpcHandle,
    ) -> c_int;
    fn streampool_ipc_release_export(device: c_int, event: u64) -> c_int;
    fn streampool_ipc_import_pool(device: c_int, fd: c_int, pool: *mut u64) -> c_int;
    fn streampool_ipc_import(
        pool: u64,
        handle: *const StreampoolIpcHandle,
        stream: *mut c_void,
        out: *mut *mut c_void,
    ) -> c_int;
    fn streampool_ipc_close(ptr: *mut c_void, stream: *mut c_void) -> c_int;
    fn streampool_device_count() -> c_int;
    fn streampool_check_config() -> c_int;
    fn streampool_version() -> *const c_char;
    fn streampool_driver_name() -> *const c_char;
    /// fuzz/shim/catch_my_malloc.cpp
    fn fuzz_catch_my_malloc(
        f: MyMalloc,
        size: isize,
        device: c_int,
        stream: *mut c_void,
        message: *mut c_char,
        capacity: usize,
        threw: *mut c_int,
    ) -> *mut c_void;
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    /// 0..=4 MiB.
    Small(u32),
    /// k x 512 bytes.
    Blocks(u8),
    Zero,
    /// `MAX_ALLOCATION_BYTES - 1024 + x`.
    AroundLimit(u16),
    /// `2^64 - 1 - x` (negative as an `ssize_t`).
    NearMax(u16),
    /// Any 64-bit pattern (as `size_t`, or as `ssize_t` through `my_malloc`).
    Any(u64),
}

impl Size {
    fn bits(self) -> u64 {
        match self {
            Size::Small(b) => u64::from(b) % ((4 << 20) + 1),
            Size::Blocks(k) => u64::from(k) * 512,
            Size::Zero => 0,
            Size::AroundLimit(x) => MAX_ALLOCATION_BYTES - 1024 + u64::from(x % 2048),
            Size::NearMax(x) => u64::MAX - u64::from(x),
            Size::Any(b) => b,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dev {
    /// -1, 0, 1, 2: two devices, so -1 and 2 are out of range.
    Near(u8),
    Any(i32),
}

impl Dev {
    fn index(self) -> c_int {
        match self {
            Dev::Near(x) => c_int::from(x % 4) - 1,
            Dev::Any(d) => d,
        }
    }
}

fn valid(device: c_int) -> bool {
    (0..DEVICES).contains(&device)
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Fraction {
    Of255(u8),
    Outside(i8),
    NaN,
}

impl Fraction {
    fn value(self) -> f64 {
        match self {
            Fraction::Of255(x) => f64::from(x) / 255.0,
            Fraction::Outside(x) => 1.0 + f64::from(x).abs() / 8.0 + 0.01,
            Fraction::NaN => f64::NAN,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Spec {
    Known(u8),
    Text(String),
}

const SPECS: [&str; 8] = [
    "4096",
    "8GiB",
    "50%",
    "max",
    "12XB",
    "",
    "99999999999999999999",
    "1TB",
];

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Malloc {
        size: Size,
        device: Dev,
        stream: u8,
    },
    MyMalloc {
        size: Size,
        device: Dev,
        stream: u8,
    },
    Free {
        pick: u16,
        with_my_free: bool,
    },
    /// NULL, an address inside a block, or one nothing is at, on `device`.
    FreeForeign {
        what: Foreign,
        device: Dev,
        with_my_free: bool,
    },
    /// Gives a block to the other threads (one of them, or this one, frees it).
    Handoff {
        pick: u16,
    },
    FreeHandedOff,
    RecordStream {
        pick: u16,
        stream: u8,
    },
    RecordStreamForeign {
        what: Foreign,
        stream: u8,
    },
    EmptyCache,
    Trim {
        device: Dev,
        keep: u64,
    },
    SetReleaseThreshold {
        device: Dev,
        bytes: u64,
    },
    SetMemoryFraction {
        device: Dev,
        fraction: Fraction,
    },
    ResetPeakStats {
        device: Dev,
    },
    GetStats {
        device: Dev,
        null_out: bool,
    },
    ParseBytes {
        spec: Spec,
        device: Dev,
        null_out: bool,
    },
    EnablePeerAccess {
        device: Dev,
    },
    RecordHistory {
        on: bool,
        max_entries: u16,
    },
    History {
        capacity: u8,
        null_out: bool,
    },
    Blocks {
        device: Dev,
        capacity: u8,
        null_out: bool,
    },
    ShareableBegin,
    ShareableEnd,
    ExportImport {
        pick: u16,
        stream: u8,
    },
    Queries {
        device: Dev,
    },
    Init {
        device_count: i8,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Foreign {
    Null,
    Inside(u16),
    Nowhere(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// 1 + threads % 4 threads; operation i runs on thread i % threads.
    threads: u8,
    ops: Vec<Op>,
}

#[path = "c_abi/calls.rs"]
mod calls;
#[path = "c_abi/harness.rs"]
mod harness;
use harness::{Block, Registry, Thread};

fn stream(s: u8) -> *mut c_void {
    usize::from(s % 4) as *mut c_void
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(streampool_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A successful call with a status clears this thread's last error.
fn clear_last_error() {
    // SAFETY: no arguments.
    assert_eq!(unsafe { streampool_device_count() }, DEVICES);
    assert_eq!(last_error(), "");
}

fn stats(device: c_int) -> StreampoolStats {
    let mut s = StreampoolStats::default();
    // SAFETY: `s` is writable.
    assert_eq!(unsafe { streampool_get_stats(device, &mut s) }, OK);
    s
}

/// Checks a status: never an internal error (a panic), and `want` when given.
fn expect(call: &str, status: c_int, want: c_int) {
    assert_ne!(
        status,
        Status::InternalError as c_int,
        "{call}: internal error: {}",
        last_error()
    );
    assert_eq!(
        status,
        want,
        "{call}: status {status}, last error {:?}",
        last_error()
    );
}

/// Checks the error message of a void entry or a NULL return.
fn expect_message(call: &str, contains: &str) {
    let e = last_error();
    assert!(
        !e.starts_with("internal error") && e.contains(contains),
        "{call}: last error {e:?} lacks {contains:?}"
    );
}

/// What a malloc of `bytes` on `device` must do, given the arguments alone: `Err(message part)`
/// for a refusal the arguments decide (above the maximum: out of memory, with the reason),
/// `Ok(())` for success or out of memory.
fn malloc_verdict(bytes: u64, device: c_int) -> Result<(), &'static str> {
    if bytes == 0 {
        Ok(()) // NULL without an error, whatever the device (docs/abi.md)
    } else if !valid(device) {
        Err("device index")
    } else if bytes > MAX_ALLOCATION_BYTES {
        Err("which is larger than streampool's maximum")
    } else {
        Ok(())
    }
}

fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        std::env::set_var("STREAMPOOL_DRIVER", "sim");
        std::env::set_var("STREAMPOOL_SIM_DEVICES", DEVICES.to_string());
        std::env::set_var("STREAMPOOL_SIM_MEMORY", MEMORY_BYTES.to_string());
        std::env::set_var("STREAMPOOL_LOG", "off");
        // SAFETY: no pointers.
        unsafe { streampool_init(DEVICES) };
        assert_eq!(last_error(), "");
    });
}

fuzz_target!(|input: Input| {
    setup();
    let threads = 1 + usize::from(input.threads % 4);
    for d in 0..DEVICES {
        let s = stats(d);
        assert_eq!(
            (s.allocated_bytes, s.allocations_current),
            (0, 0),
            "left by the last input"
        );
    }
    let registry = Registry::default();
    let handoff: Mutex<Vec<Block>> = Mutex::new(Vec::new());
    let barrier = Barrier::new(threads);
    let mut shares: Vec<Vec<Op>> = vec![Vec::new(); threads];
    for (i, op) in input.ops.into_iter().take(MAX_OPS).enumerate() {
        shares[i % threads].push(op);
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|ops| {
                let (registry, handoff, barrier) = (&registry, &handoff, &barrier);
                scope.spawn(move || {
                    let mut t = Thread::new(registry, handoff, threads == 1);
                    barrier.wait();
                    for op in ops {
                        t.step(op);
                    }
                    t.finish();
                })
            })
            .collect();
        // Joined one by one, not left to the scope: a join waits until the thread has run its
        // thread-locals' destructors (its last error message), which the scope does not, and
        // LeakSanitizer would report them as leaks of this input.
        for w in workers {
            w.join().unwrap();
        }
    });
    for block in handoff.into_inner().unwrap() {
        harness::free(&registry, block, false);
    }
    // SAFETY: no pointers.
    unsafe { streampool_empty_cache() };
    for d in 0..DEVICES {
        let s = stats(d);
        let held = (
            s.allocated_bytes,
            s.allocations_current,
            s.active_bytes,
            s.cached_bytes,
            s.pool_used_bytes,
            s.reserved_bytes,
            s.ipc_used_bytes,
        );
        assert_eq!(
            held,
            (0, 0, 0, 0, 0, 0, 0),
            "device {d} holds memory: {s:?}"
        );
        assert_eq!(s.num_allocs, s.num_frees, "device {d}");
        // The next input starts without a cap (a fraction of 1 is the whole device).
        // SAFETY: no pointers.
        unsafe { streampool_set_memory_fraction(1.0, d) };
    }
});

//! A `fork()` while another thread is inside a first-use path must give a child that does not
//! hang. The first use registered the fork handler inside a `Once`, and the first C++ throw looked
//! its runtime up inside a `OnceLock`: a fork while a thread ran either left the child's copy
//! "running" forever, so the child's next call waited for a thread that does not exist there
//! (26 of 300 rounds hung in an outside suite).
//!
//! Deterministic here: a test-only hook (`streampool::testing::set_first_use_hook`) holds a
//! parent thread at a point inside the first-use path while the main thread forks; the child
//! calls the library and must exit on its own (it is killed after 20 s, and the test fails).
//! Its own test binary: the points are passed only once per process.

// The library's C functions are declared below; this links them in.
extern crate streampool;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use streampool::testing::{cxx_runtime_found, set_first_use_hook, FirstUse};

extern "C" {
    fn streampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn streampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) -> c_int;
    fn streampool_device_count() -> c_int;
    fn streampool_last_error() -> *const c_char;
}

/// The parent's pid: the hook holds threads of the parent only (a child passes the same points).
static PARENT: AtomicI32 = AtomicI32::new(0);
/// The point to hold a thread at (`FirstUse as u8 + 1`; 0: none).
static HOLD_AT: AtomicU8 = AtomicU8::new(0);
/// (the point a thread is held at, released?)
static HELD: Mutex<(Option<FirstUse>, bool)> = Mutex::new((None, false));
static CHANGED: Condvar = Condvar::new();

fn code(point: FirstUse) -> u8 {
    point as u8 + 1
}

fn hook(point: FirstUse) {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != PARENT.load(Ordering::SeqCst)
        || HOLD_AT.load(Ordering::SeqCst) != code(point)
    {
        return;
    }
    let mut held = HELD.lock().unwrap();
    *held = (Some(point), false);
    CHANGED.notify_all();
    while !held.1 {
        held = CHANGED.wait(held).unwrap();
    }
    *held = (None, false);
}

/// Waits until a thread is held at `point`.
fn wait_held_at(point: FirstUse) {
    let mut held = HELD.lock().unwrap();
    while held.0 != Some(point) {
        held = CHANGED.wait(held).unwrap();
    }
}

/// Lets the held thread go on, and holds the next one at `next` (if any).
fn release_and_hold_at(next: Option<FirstUse>) {
    HOLD_AT.store(next.map_or(0, code), Ordering::SeqCst);
    let mut held = HELD.lock().unwrap();
    held.1 = true;
    CHANGED.notify_all();
}

/// Forks; the child runs `child` (its exit status) and `_exit`s; the parent waits up to 20 s.
fn fork_and_check(what: &str, child: fn() -> c_int) {
    // SAFETY: the child only calls the library, reads its own memory and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let status = child();
        // SAFETY: ends the child without running the parent's destructors or test harness.
        unsafe { libc::_exit(status) };
    }
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: our own child; status is writable.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            0 => {
                // SAFETY: our own child, not reaped yet.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("{what}: the fork child hung (killed after 20 s)");
            }
            _ => break,
        }
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what}: child status {status:#x}"
    );
}

/// In the child: allocation is refused as in any fork child of a user of streampool.
fn child_allocation_is_refused() -> c_int {
    // SAFETY: no pointers passed; the message is read before the next call.
    let (ptr, message) = unsafe {
        let ptr = streampool_malloc(4096, 0, std::ptr::null_mut());
        (
            ptr,
            CStr::from_ptr(streampool_last_error()).to_string_lossy(),
        )
    };
    // SAFETY: as above.
    let count = unsafe { streampool_device_count() };
    c_int::from(!(ptr.is_null() && message.contains("fork() child") && count < 0))
}

/// In the child: the C++ runtime lookup (the first throw's) finishes.
fn child_finds_the_cxx_runtime() -> c_int {
    c_int::from(!cxx_runtime_found())
}

#[test]
fn a_fork_while_a_thread_is_inside_a_first_use_gives_a_child_that_does_not_hang() {
    std::env::set_var("STREAMPOOL_DRIVER", "sim");
    // SAFETY: getpid has no preconditions.
    PARENT.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    set_first_use_hook(hook);

    // The allocator's first use: held as it begins, then inside the build.
    HOLD_AT.store(code(FirstUse::Started), Ordering::SeqCst);
    // SAFETY: no pointers; the first call of the library in this process.
    let first = std::thread::spawn(|| unsafe { streampool_device_count() });
    wait_held_at(FirstUse::Started);
    fork_and_check("held as the first use began", child_allocation_is_refused);
    release_and_hold_at(Some(FirstUse::BuildingAllocator));
    wait_held_at(FirstUse::BuildingAllocator);
    fork_and_check(
        "held inside the allocator's build",
        child_allocation_is_refused,
    );
    release_and_hold_at(None);
    assert_eq!(first.join().unwrap(), 2, "the parent's first use completes");

    // The first C++ throw's lookup of the runtime.
    HOLD_AT.store(code(FirstUse::FindingCxxRuntime), Ordering::SeqCst);
    let lookup = std::thread::spawn(cxx_runtime_found);
    wait_held_at(FirstUse::FindingCxxRuntime);
    fork_and_check(
        "held inside the C++ runtime lookup",
        child_finds_the_cxx_runtime,
    );
    release_and_hold_at(None);
    assert!(lookup.join().unwrap(), "the parent's lookup completes");

    // The parent goes on as before.
    // SAFETY: a block of this process, freed once.
    unsafe {
        let block = streampool_malloc(4096, 0, std::ptr::null_mut());
        assert!(!block.is_null());
        assert_eq!(streampool_free(block, 4096, 0, std::ptr::null_mut()), 0);
    }
}

//! A defect an outside attack suite found: a `fork()` child of a process that uses streampool
//! must never wait for a lock that a thread of the parent held at the fork — such a lock is never
//! released in the child. The attack suite saw 7-13 of 200 children hang in `ffi::report`'s log
//! line (`Stdout/Stderr lock <- env_logger <- ffi::report <- streampool_empty_cache`).
//!
//! Deterministic here: a parent thread holds stderr's lock (as a thread caught mid-log would)
//! while the main thread forks, and the child calls every entry that reports its error by logging
//! (in a fork child each of them fails). Fails — the child hangs until the timeout — when
//! `ffi::report` logs in a fork child. Its own test binary: one process, one allocator, built from
//! the environment set here. python/tests/test_lifecycle.py forks under logging threads too.

// The library's C functions are declared below; this links them in.
extern crate streampool;

use std::ffi::{c_int, c_void};
use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

extern "C" {
    fn streampool_init(device_count: c_int);
    fn streampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn streampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) -> c_int;
    fn streampool_empty_cache();
    fn streampool_set_memory_fraction(fraction: f64, device: c_int);
    fn streampool_record_stream(ptr: *mut c_void, stream: *mut c_void);
    fn streampool_reset_peak_stats(device: c_int);
    fn streampool_last_error() -> *const std::ffi::c_char;
    fn my_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void);
}

/// Waits up to `limit` for `pid` to exit: its exit status, or None (then it is killed).
fn wait_for(pid: libc::pid_t, limit: Duration) -> Option<c_int> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: our own child; status is writable.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            0 => {
                // SAFETY: our own child, which has not been reaped.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            _ => return Some(status),
        }
    }
}

#[test]
fn a_fork_child_never_waits_for_the_stderr_lock_a_parent_thread_held_at_the_fork() {
    std::env::set_var("STREAMPOOL_DRIVER", "sim");
    std::env::set_var("STREAMPOOL_LOG", "error");
    // SAFETY: no pointers; builds the allocator, the logger and the fork handler.
    let block = unsafe {
        streampool_init(2);
        streampool_malloc(4096, 0, std::ptr::null_mut())
    };
    assert!(!block.is_null());
    let (locked_tx, locked) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.flush();
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    locked.recv().unwrap();
    // SAFETY: the child only calls the library (which must not take a lock a parent thread may
    // hold) and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: as above; every call fails in a fork child and reports its error.
        unsafe {
            streampool_empty_cache();
            streampool_set_memory_fraction(0.5, 0);
            streampool_record_stream(block, 7 as *mut c_void);
            streampool_reset_peak_stats(0);
            streampool_init(2);
            my_free(0x1234 as *mut c_void, 0, 0, std::ptr::null_mut());
            // Size 0 is NULL without an error, in a fork child too; any other size fails.
            let zero = streampool_malloc(0, 0, std::ptr::null_mut());
            if !zero.is_null() || *streampool_last_error() != 0 {
                libc::_exit(3);
            }
            if !streampool_malloc(64, 0, std::ptr::null_mut()).is_null() {
                libc::_exit(4);
            }
            libc::_exit(0);
        }
    }
    release.send(()).unwrap();
    holder.join().unwrap();
    let status = wait_for(pid, Duration::from_secs(20));
    let status = status.expect("the fork child hung: it waited for a lock held at the fork");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    // SAFETY: a block of this process.
    let freed = unsafe { streampool_free(block, 4096, 0, std::ptr::null_mut()) };
    assert_eq!(freed, 0);
}

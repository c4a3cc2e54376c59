//! Page-locked host memory for a sleeping device's contents: anonymous memory aligned to 2 MiB
//! and advised to use huge pages, touched by several threads at once, then registered with the
//! driver (`cuMemHostRegister`); `cuMemAllocHost` where that fails. On an H200 host
//! `cuMemAllocHost` took 536 ms a GiB, while one thread touching huge-page memory took 262 ms
//! and registering it 26 ms: the time is the kernel handing out zeroed pages, which threads share
//! (bench/results/2026-11-28-h200, `COST sleep` lines).
//!
//! Invariants: a buffer registered here is in [`REGISTERED`] from its registration to its
//! unregistration, with the length of its mapping, and is unregistered and unmapped by
//! [`free`]; any other buffer came from `cuMemAllocHost` and goes back to `cuMemFreeHost`; the
//! memory is not inherited by a forked child (`MADV_DONTFORK`), as the driver's own page-locked
//! memory is not.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

const ALIGN_BYTES: usize = 2 << 20;
const PAGE_BYTES: usize = 4096;
/// No thread touches less than this (starting a thread costs more than touching less).
const MIN_TOUCH_BYTES_PER_THREAD: usize = 256 << 20;
const MAX_TOUCH_THREADS: usize = 8;

/// Registered buffers: address → length of the mapping.
static REGISTERED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// `bytes` of page-locked host memory; the context of the device is current.
pub(super) fn alloc(bytes: usize) -> Result<*mut c_void> {
    if let Some(ptr) = registered(bytes) {
        return Ok(ptr);
    }
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the context is current.
    check("cuMemAllocHost", unsafe {
        sys::cuMemAllocHost_v2(&mut ptr, bytes)
    })?;
    Ok(ptr)
}

/// Frees a buffer from [`alloc`]; the context of the device is current.
pub(super) fn free(ptr: *mut c_void) {
    let registered = REGISTERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(ptr as usize));
    let Some(len) = registered else {
        // SAFETY: a pointer from cuMemAllocHost, freed once (the caller's).
        let _ = unsafe { sys::cuMemFreeHost(ptr) };
        return;
    };
    // SAFETY: registered by `registered` and not unregistered since (it was in the table).
    let _ = unsafe { sys::cuMemHostUnregister(ptr) };
    // SAFETY: the mapping `registered` made, of `len` bytes, unmapped once.
    unsafe { libc::munmap(ptr, len) };
}

/// `bytes` of anonymous memory, touched and registered; None if any step fails (nothing is
/// left behind then).
fn registered(bytes: usize) -> Option<*mut c_void> {
    let len = bytes.checked_next_multiple_of(ALIGN_BYTES)?;
    let ptr = map_aligned(len)?;
    // SAFETY: advice on our own mapping; a refusal changes nothing and is ignored.
    unsafe {
        libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        libc::madvise(ptr, len, libc::MADV_DONTFORK);
    }
    touch(ptr as usize, len, MIN_TOUCH_BYTES_PER_THREAD);
    // SAFETY: the range is our mapping, alive until `free` unregisters it.
    let result = unsafe { sys::cuMemHostRegister_v2(ptr, len, 0) };
    if check("cuMemHostRegister", result).is_err() {
        // SAFETY: our mapping of `len` bytes, never registered.
        unsafe { libc::munmap(ptr, len) };
        return None;
    }
    (REGISTERED.lock().unwrap_or_else(|e| e.into_inner())).insert(ptr as usize, len);
    Some(ptr)
}

/// A private anonymous mapping of `len` bytes (a multiple of `ALIGN_BYTES`) at an address
/// aligned to `ALIGN_BYTES`, so that the kernel can back it with huge pages.
fn map_aligned(len: usize) -> Option<*mut c_void> {
    let padded = len.checked_add(ALIGN_BYTES)?;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a new anonymous mapping; no memory of ours is touched.
    let raw = unsafe { libc::mmap(std::ptr::null_mut(), padded, prot, flags, -1, 0) };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(ALIGN_BYTES);
    let (head, tail) = (aligned - start, start + padded - (aligned + len));
    // SAFETY: the parts of our mapping before and after the aligned range, page-aligned (mmap
    // returns page-aligned addresses; ALIGN_BYTES and len are multiples of the page).
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut c_void, tail);
        }
    }
    Some(aligned as *mut c_void)
}

/// Writes a zero into every page of `[start, start + len)`, split between threads (none given
/// less than `min_bytes_per_thread`), so that the kernel backs it before the driver registers it.
fn touch(start: usize, len: usize, min_bytes_per_thread: usize) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_TOUCH_THREADS)
        .min(len.div_ceil(min_bytes_per_thread))
        .max(1);
    let share = len.div_ceil(threads).next_multiple_of(ALIGN_BYTES);
    let touch_part = |from: usize| {
        let end = (from + share).min(start + len);
        for at in (from..end).step_by(PAGE_BYTES) {
            // SAFETY: `at` lies in our writable mapping; nothing else uses it yet.
            unsafe { std::ptr::write_volatile(at as *mut u8, 0) };
        }
    };
    std::thread::scope(|scope| {
        for i in 1..threads {
            let from = start + i * share;
            if from >= start + len {
                break;
            }
            // A thread that cannot be started leaves its part to this one.
            let spawned = std::thread::Builder::new().spawn_scoped(scope, move || touch_part(from));
            if spawned.is_err() {
                touch_part(from);
            }
        }
        touch_part(start);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether every page of `[ptr, ptr + len)` is backed (`mincore`).
    fn resident(ptr: *mut c_void, len: usize) -> Vec<bool> {
        let mut pages = vec![0u8; len / PAGE_BYTES];
        // SAFETY: `ptr` is a page-aligned mapping of `len` bytes; `pages` has one byte a page.
        let done = unsafe { libc::mincore(ptr, len, pages.as_mut_ptr()) };
        assert_eq!(done, 0);
        pages.iter().map(|p| p & 1 == 1).collect()
    }

    #[test]
    fn a_mapping_is_aligned_for_huge_pages_and_every_page_is_backed_once_touched_by_threads() {
        let len = 7 * ALIGN_BYTES;
        let ptr = map_aligned(len).expect("a small mapping");
        assert_eq!(ptr as usize % ALIGN_BYTES, 0);
        // Three threads at most on this machine's CPUs, each given 2 MiB or more.
        touch(ptr as usize, len, ALIGN_BYTES);
        let backed = resident(ptr, len);
        let missing = backed.iter().filter(|&&b| !b).count();
        assert_eq!(
            missing,
            0,
            "{missing} of {} pages not touched",
            backed.len()
        );
        // SAFETY: the mapping above, of `len` bytes (its padding was unmapped by map_aligned).
        assert_eq!(unsafe { libc::munmap(ptr, len) }, 0);
    }

    #[test]
    fn a_size_that_cannot_be_mapped_is_none_and_not_a_panic() {
        assert!(map_aligned(usize::MAX - ALIGN_BYTES + 1).is_none());
        assert!(registered(usize::MAX).is_none());
    }
}

//! Page-locked host memory for a sleeping device's contents: anonymous memory aligned to 2 MiB
//! and advised to use huge pages, touched by several threads at once, then registered with the
//! driver (`cuMemHostRegister`); `cuMemAllocHost` where that fails. On an H200 host
//! `cuMemAllocHost` took 536 ms a GiB, while one thread touching huge-page memory took 262 ms
//! and registering it 26 ms: the time is the kernel handing out zeroed pages, which threads share
//! (bench/results/2026-11-28-h200, `COST sleep` lines).
//!
//! Touching memory the machine does not have would bring the kernel's (or the container's) OOM
//! killer instead of an error, so memory larger than what is available (`MemAvailable`, and the
//! cgroup's limit less its use) goes to `cuMemAllocHost`, which refuses with an error.
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
    if available_bytes().is_some_and(|available| len > available) {
        return None;
    }
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

/// Host memory this process can still touch: `MemAvailable`, bounded by its cgroup's limit
/// less its use; None if neither can be read.
fn available_bytes() -> Option<usize> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let machine = read("/proc/meminfo").and_then(|text| mem_available(&text));
    let cgroup = read("/proc/self/cgroup").and_then(|text| cgroup_room(&text, read));
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The room left under this process's cgroup memory limit, from /proc/self/cgroup's text and a
/// reader of files: cgroup v2 (`0::PATH`, memory.max less memory.current) or v1 (`N:memory:PATH`,
/// memory.limit_in_bytes less memory.usage_in_bytes); None without a limit or readable files.
fn cgroup_room(cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<usize> {
    let number = |path: String| -> Option<usize> { read(&path)?.trim().parse().ok() };
    let room = |dir: String, limit: &str, usage: &str| {
        let limit = number(format!("{dir}/{limit}"))?; // "max" (no limit) does not parse
        Some(limit.saturating_sub(number(format!("{dir}/{usage}"))?))
    };
    cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_end_matches('/');
        match controllers {
            "" => room(
                format!("/sys/fs/cgroup{path}"),
                "memory.max",
                "memory.current",
            ),
            c if c.split(',').any(|c| c == "memory") => room(
                format!("/sys/fs/cgroup/memory{path}"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ),
            _ => None,
        }
    })
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
        // As many threads as this machine's CPUs allow (up to 7 here), each given 2 MiB or more.
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
    fn available_memory_is_read_from_meminfo_and_the_cgroup_limit_of_either_version() {
        let meminfo = "MemTotal:       1000 kB\nMemAvailable:     300 kB\n";
        assert_eq!(mem_available(meminfo), Some(300 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let files = |path: &str| {
            let text = match path {
                "/sys/fs/cgroup/job/memory.max" => "5000\n",
                "/sys/fs/cgroup/job/memory.current" => "1200\n",
                "/sys/fs/cgroup/memory/v1job/memory.limit_in_bytes" => "9000\n",
                "/sys/fs/cgroup/memory/v1job/memory.usage_in_bytes" => "10000\n",
                "/sys/fs/cgroup/free/memory.max" => "max\n",
                "/sys/fs/cgroup/free/memory.current" => "7\n",
                _ => return None,
            };
            Some(text.to_string())
        };
        assert_eq!(cgroup_room("0::/job\n", files), Some(3800));
        // v1: the memory controller's line, among others; usage over the limit leaves none.
        assert_eq!(cgroup_room("4:memory:/v1job\n0::/\n", files), Some(0));
        assert_eq!(cgroup_room("3:cpu,memory:/v1job\n", files), Some(0));
        assert_eq!(cgroup_room("0::/free\n", files), None, "no limit");
        assert_eq!(cgroup_room("1:cpu:/x\n", files), None);
    }

    #[test]
    fn a_size_that_cannot_be_mapped_is_none_and_not_a_panic() {
        assert!(map_aligned(usize::MAX - ALIGN_BYTES + 1).is_none());
        assert!(registered(usize::MAX).is_none());
    }
}

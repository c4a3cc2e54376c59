//! `torch.cuda.MemPool(allocator)` on the simulated driver: a memory pool whose segments come
//! from a foreign malloc/free pair (a counting one here) — every segment from its malloc, back
//! through its free at the first `empty_cache` once nobody uses the pool, counted in what the
//! device holds meanwhile; a malloc that returns NULL is out of memory and leaks nothing; one that
//! returns a misaligned block is refused and the block given back.

mod common;

use common::{base_config, rig_with, s, Rig, MIB};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use streampool::driver::{DevicePtr, Stream};
use streampool::error::Error;
use streampool::StreamFilter;

/// Where the counting malloc's blocks start: never the simulator's addresses.
const BASE: u64 = 0x5a00_0000_0000;
static NEXT: AtomicU64 = AtomicU64::new(0);
/// (address, bytes, device, stream) of each block out, and every call seen.
static OUT: Mutex<Vec<(u64, usize, c_int, usize)>> = Mutex::new(Vec::new());
static MALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static FREE_ERRORS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn counting_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    MALLOCS.fetch_add(1, Ordering::SeqCst);
    let address = BASE + NEXT.fetch_add(1, Ordering::SeqCst) * (1 << 30);
    OUT.lock()
        .unwrap()
        .push((address, size, device, stream as usize));
    address as *mut c_void
}

unsafe extern "C" fn counting_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    FREES.fetch_add(1, Ordering::SeqCst);
    let mut out = OUT.lock().unwrap();
    match out
        .iter()
        .position(|b| *b == (ptr as u64, size, device, stream as usize))
    {
        Some(i) => {
            out.remove(i);
        }
        None => {
            FREE_ERRORS.fetch_add(1, Ordering::SeqCst);
        }
    }
}

static NULLS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn null_malloc(_: usize, _: c_int, _: *mut c_void) -> *mut c_void {
    NULLS.fetch_add(1, Ordering::SeqCst);
    std::ptr::null_mut()
}

unsafe extern "C" fn misaligned_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: the counting malloc is safe to call; its block, moved off alignment.
    let p = unsafe { counting_malloc(size, device, stream) } as u64;
    OUT.lock().unwrap().last_mut().unwrap().0 = p + 256;
    (p + 256) as *mut c_void
}

struct All;

impl StreamFilter for All {
    fn claims(&self, _: Stream) -> bool {
        true
    }
}

fn rig() -> Rig {
    rig_with(1, 512 * MIB, base_config())
}

fn routed(r: &Rig, bytes: u64) -> Result<DevicePtr, Error> {
    let pool = r.device(0).graph_pools().claiming(s(1));
    assert!(pool.is_some());
    r.alloc.malloc_into(bytes, 0, s(1), pool)
}

fn foreign_bytes_out() -> u64 {
    OUT.lock().unwrap().iter().map(|b| b.1 as u64).sum()
}

// One test: the counters are the process's.
#[test]
fn a_mempools_memory_comes_from_its_own_allocator_and_goes_back_through_it() {
    let r = rig();
    let pool = (0, 7);
    // SAFETY: a matching pair of C functions that do not unwind.
    unsafe {
        r.device(0)
            .graph_pools()
            .create_or_incref_with_allocator(pool, counting_malloc, counting_free)
            .unwrap();
    }
    r.device(0)
        .graph_pools()
        .begin_allocate_to_pool(pool, Arc::new(All))
        .unwrap();
    let big = routed(&r, 3 * MIB).unwrap();
    let small = routed(&r, 4096).unwrap();
    // use_mem_pool's end: the route ends and gives up its use of the pool.
    r.device(0)
        .graph_pools()
        .end_allocate_to_pool(pool)
        .unwrap();
    r.device(0).graph_pools().release_pool(pool).unwrap();
    let outside = r.malloc(MIB, 0, 1);
    assert!(MALLOCS.load(Ordering::SeqCst) >= 1);
    let segments = r.device(0).graph_pools().segments(pool).unwrap();
    assert_eq!(
        segments.len() as u64,
        MALLOCS.load(Ordering::SeqCst),
        "every segment from its malloc"
    );
    for p in [big, small] {
        assert!(p.0 >= BASE && segments.iter().any(|(s, b)| p.0 >= s.0 && p.0 < s.0 + b));
    }
    assert!(
        outside.0 < BASE || outside.0 >= BASE + (1 << 40),
        "outside the pool, the device's own memory"
    );
    let out = foreign_bytes_out();
    let (total, _) = r.device(0).reserved_total().unwrap();
    assert_eq!(
        total,
        r.stats(0).reserved_bytes + out,
        "what the device holds counts the pool's segments"
    );
    assert!(r.stats(0).allocated_bytes >= 3 * MIB + 4096 + MIB);

    // Its memory stays while the pool is used, and goes back through its free once it is not.
    r.free(big, 0);
    r.free(small, 0);
    r.alloc.empty_cache().unwrap();
    assert_eq!(FREES.load(Ordering::SeqCst), 0, "the MemPool still uses it");
    r.device(0).graph_pools().release_pool(pool).unwrap(); // the MemPool's end
    r.alloc.empty_cache().unwrap();
    assert_eq!(FREES.load(Ordering::SeqCst), MALLOCS.load(Ordering::SeqCst));
    assert_eq!(
        (foreign_bytes_out(), FREE_ERRORS.load(Ordering::SeqCst)),
        (0, 0),
        "each block once, with its size and stream"
    );
    assert!(
        !r.device(0).graph_pools().ids().contains(&pool),
        "the pool is gone"
    );

    // A malloc that returns NULL: out of memory, nothing booked or leaked, the device goes on.
    let failing = (0, 8);
    // SAFETY: as above.
    unsafe {
        r.device(0)
            .graph_pools()
            .create_or_incref_with_allocator(failing, null_malloc, counting_free)
            .unwrap();
    }
    r.device(0)
        .graph_pools()
        .begin_allocate_to_pool(failing, Arc::new(All))
        .unwrap();
    let allocated = r.stats(0).allocated_bytes;
    let e = routed(&r, 2 * MIB).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    assert!(e.to_string().starts_with("CUDA out of memory."), "{e}");
    assert_eq!(
        NULLS.load(Ordering::SeqCst),
        2,
        "its malloc was asked, and again after the cache went back"
    );
    assert_eq!(r.stats(0).allocated_bytes, allocated);
    r.device(0)
        .graph_pools()
        .end_allocate_to_pool(failing)
        .unwrap();
    r.device(0).graph_pools().release_pool(failing).unwrap();
    r.device(0).graph_pools().release_pool(failing).unwrap();

    // A misaligned block is given back at once and refused.
    let crooked = (0, 9);
    // SAFETY: as above.
    unsafe {
        r.device(0)
            .graph_pools()
            .create_or_incref_with_allocator(crooked, misaligned_malloc, counting_free)
            .unwrap();
    }
    r.device(0)
        .graph_pools()
        .begin_allocate_to_pool(crooked, Arc::new(All))
        .unwrap();
    let e = routed(&r, MIB).unwrap_err().to_string();
    assert!(e.contains("not 512-byte aligned"), "{e}");
    r.device(0)
        .graph_pools()
        .end_allocate_to_pool(crooked)
        .unwrap();
    r.device(0).graph_pools().release_pool(crooked).unwrap();
    r.device(0).graph_pools().release_pool(crooked).unwrap();
    assert_eq!(
        (foreign_bytes_out(), FREE_ERRORS.load(Ordering::SeqCst)),
        (0, 0)
    );
    assert_eq!(
        FREES.load(Ordering::SeqCst),
        MALLOCS.load(Ordering::SeqCst),
        "every block it gave, once"
    );

    r.free(outside, 0);
    r.alloc.empty_cache().unwrap();
    let after = r.alloc.malloc(MIB, 0, s(0)).expect("the process goes on");
    r.free(after, 0);
    r.finish();
}

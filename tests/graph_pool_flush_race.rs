//! A flush that runs while an allocation in a memory pool makes the pool's new segment (another
//! thread's `empty_cache()`, here made from inside the pool's own allocator, deterministically):
//! the pool had no user and held nothing, so the flush dropped it from the device, and the new
//! segment then landed in a pool nothing tracked — never given back. An allocation under way
//! keeps its pool as a user does (PyTorch's use count does not show it).

mod common;

use common::{base_config, rig_with, s, MIB};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use streampool::Allocator;

/// Where this allocator's blocks start: never the simulator's addresses.
const BASE: u64 = 0x5b00_0000_0000;
static NEXT: AtomicU64 = AtomicU64::new(0);
static MALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
/// The allocator a malloc flushes, once, while armed.
static FLUSHED: AtomicPtr<Allocator> = AtomicPtr::new(std::ptr::null_mut());
static ARMED: AtomicBool = AtomicBool::new(false);
/// PyTorch's use count of the pool as the flush ran.
static USE_COUNT_SEEN: AtomicU64 = AtomicU64::new(u64::MAX);

unsafe extern "C" fn flushing_malloc(_: usize, _: c_int, _: *mut c_void) -> *mut c_void {
    MALLOCS.fetch_add(1, Ordering::SeqCst);
    if ARMED.swap(false, Ordering::SeqCst) {
        let alloc = FLUSHED.load(Ordering::SeqCst);
        // SAFETY: set to the test's allocator, which outlives every call made while armed.
        let alloc = unsafe { &*alloc };
        let count = alloc.device(0).unwrap().graph_pools().use_count((0, 9));
        USE_COUNT_SEEN.store(u64::from(count), Ordering::SeqCst);
        alloc.empty_cache().unwrap();
    }
    (BASE + NEXT.fetch_add(1, Ordering::SeqCst) * (1 << 30)) as *mut c_void
}

unsafe extern "C" fn counting_free(_: *mut c_void, _: usize, _: c_int, _: *mut c_void) {
    FREES.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn a_flush_while_a_pool_makes_a_segment_keeps_the_pool_and_its_segment_goes_back() {
    let r = rig_with(1, 512 * MIB, base_config());
    let pool = (0, 9);
    let pools = r.device(0).graph_pools();
    // SAFETY: a matching pair of C functions that do not unwind.
    unsafe {
        pools
            .create_or_incref_with_allocator(pool, flushing_malloc, counting_free)
            .unwrap();
    }
    // Its last user gone, it holds nothing: the next flush would drop it.
    pools.release_pool(pool).unwrap();
    FLUSHED.store(
        &r.alloc as *const Allocator as *mut Allocator,
        Ordering::SeqCst,
    );
    ARMED.store(true, Ordering::SeqCst);
    let block = r.alloc.malloc_into(4096, 0, s(1), Some(pool)).unwrap();
    assert!(
        !ARMED.load(Ordering::SeqCst),
        "the flush ran inside the segment's malloc"
    );
    assert_eq!(pools.ids(), vec![pool], "the pool outlived the flush");
    assert_eq!(
        USE_COUNT_SEEN.load(Ordering::SeqCst),
        0,
        "PyTorch's use count does not show the allocation"
    );
    r.free(block, 0);
    r.alloc.empty_cache().unwrap();
    assert!(
        pools.ids().is_empty(),
        "unused and emptied, the pool leaves"
    );
    assert_eq!(
        (MALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst)),
        (1, 1),
        "its one segment went back through its own free"
    );
    assert_eq!(r.device(0).reserved_total().unwrap().0, 0, "nothing held");
    FLUSHED.store(std::ptr::null_mut(), Ordering::SeqCst);
}

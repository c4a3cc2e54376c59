//! The managed-memory resource alone, on the simulated driver: its caps, and its peaks.

use super::*;
use crate::driver::sim::SimDriver;

const MIB: u64 = 1 << 20;

/// Managed memory oversubscribes on a GPU (the simulator's would fail at its capacity, so
/// the resource's cap is set far below it): kept blocks of other sizes go back before the
/// reserved bytes pass the cap, and the limit lowers the cap.
#[test]
fn kept_blocks_go_back_before_the_reserved_bytes_pass_the_device_or_its_limit() {
    let sim: Arc<dyn Driver> = Arc::new(SimDriver::new(1, 1 << 30));
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let r = ManagedResource::new(&sim, 0, 8 * MIB, Arc::clone(&limit), u64::MAX);
    for n in 1..=6 {
        let p = r.allocate(n * MIB, Stream(1)).unwrap();
        r.deallocate(p, n * MIB, Stream(1)).unwrap();
        let reserved = r.usage().unwrap().reserved_bytes;
        assert!(reserved <= 8 * MIB, "{n} MiB: {reserved} B reserved");
    }
    limit.store(4 * MIB, Ordering::Relaxed);
    let p = r.allocate(3 * MIB + 1, Stream(1)).unwrap();
    assert!(r.usage().unwrap().reserved_bytes <= 4 * MIB);
    r.deallocate(p, 3 * MIB + 1, Stream(1)).unwrap();
}

/// `cuMemFree` runs with the lock released: a block on its way back still counts against the
/// cap. Counted only once the call returned, another thread's allocation meanwhile was let in
/// under the cap while the driver held the block too (a review's reproducer: 10 MiB held
/// under an 8 MiB cap).
#[test]
fn a_block_being_given_back_counts_against_the_cap() {
    let sim = Arc::new(SimDriver::new(1, 1 << 30));
    let driver: Arc<dyn Driver> = sim.clone();
    let max = 8 * MIB;
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let r = Arc::new(ManagedResource::new(&driver, 0, u64::MAX, limit, max));
    let p = r.allocate(4 * MIB, Stream(1)).unwrap();
    r.deallocate(p, 4 * MIB, Stream(1)).unwrap();
    sim.complete_all();
    // Another thread allocates while the kept block is being freed (the hook runs inside
    // `cuMemFree`, before the memory is gone).
    let seen = Arc::new(Mutex::new(None));
    let (other, seen_there, sim_there) =
        (Arc::downgrade(&r), Arc::clone(&seen), Arc::downgrade(&sim));
    let hook = move || {
        let mut seen = seen_there.lock();
        if seen.is_none() {
            let other = other.upgrade().unwrap().allocate(6 * MIB, Stream(3));
            let held = sim_there.upgrade().unwrap().outstanding_bytes();
            *seen = Some((other, held));
        }
    };
    sim.set_call_hooks(vec![("cuMemFree", Arc::new(hook))]);
    let q = r.allocate(6 * MIB, Stream(2)).unwrap();
    sim.set_call_hooks(Vec::new());
    let (other, held) = seen.lock().take().expect("the hook ran");
    assert!(other.is_err(), "admitted meanwhile: {other:?}");
    assert!(
        held <= max,
        "the driver held {held} B under a cap of {max} B"
    );
    assert_eq!(r.usage().unwrap().reserved_bytes, 6 * MIB);
    r.deallocate(q, 6 * MIB, Stream(2)).unwrap();
    r.trim(0).unwrap();
}

/// torch.cuda.max_memory_reserved() after empty_cache(): the peak stays until reset.
#[test]
fn peaks_outlive_a_trim_until_reset() {
    let sim: Arc<dyn Driver> = Arc::new(SimDriver::new(1, 1 << 30));
    let max = u64::MAX;
    let r = ManagedResource::new(&sim, 0, max, Arc::new(AtomicU64::new(max)), max);
    let p = r.allocate(8 * MIB, Stream(1)).unwrap();
    r.deallocate(p, 8 * MIB, Stream(1)).unwrap();
    r.trim(0).unwrap();
    let u = r.usage_with_peaks().unwrap();
    assert_eq!((u.reserved_bytes, u.used_bytes), (0, 0));
    assert_eq!(
        (u.reserved_bytes_high, u.used_bytes_high),
        (8 * MIB, 8 * MIB)
    );
    r.reset_peaks().unwrap();
    let u = r.usage_with_peaks().unwrap();
    assert_eq!((u.reserved_bytes_high, u.used_bytes_high), (0, 0));
}

//! A sleep buffer reserved ahead (`DeviceAllocator::reserve_sleep_buffer`,
//! streampool.reserve_sleep_buffer()): the page-locked host memory of the next level-1 sleep,
//! pinned before it (pinning is the first sleep's slowest step), so that the sleep pins nothing;
//! sized by what live blocks need now or as asked; a kept buffer at least that large stays; a
//! refusal (pool backend, asleep, memory that cannot be pinned) changes nothing, and on a device
//! never used nothing is created for it.

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;
use streampool::driver::sim::SimFault;

#[test]
fn a_reserved_buffer_is_pinned_before_the_sleep_and_the_sleep_pins_nothing() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(6 * MIB, 0, 1);
    fill(&r, a, 6 * MIB, 1);
    let device = r.device(0);
    let pinned = r.sim.calls("cuMemAllocHost");
    let reserved = device.reserve_sleep_buffer(0).unwrap();
    assert_eq!(reserved, 6 * MIB, "the pages under the live block");
    assert_eq!(r.sim.calls("cuMemAllocHost"), pinned + 1);
    assert_eq!(device.sleep_host_buffer_bytes(), reserved);
    // Reserving again, or less, keeps it as it is.
    assert_eq!(device.reserve_sleep_buffer(0).unwrap(), reserved);
    assert_eq!(device.reserve_sleep_buffer(2 * MIB).unwrap(), reserved);
    assert_eq!(r.sim.calls("cuMemAllocHost"), pinned + 1);
    device.sleep(1, &[]).unwrap();
    assert_eq!(
        r.sim.calls("cuMemAllocHost"),
        pinned + 1,
        "the sleep pinned"
    );
    assert_eq!(device.sleep_host_buffer_bytes(), reserved);
    device.wake().unwrap();
    assert!(holds(&r, a, 6 * MIB, 1));
    // More than kept: a larger buffer replaces it (the strict driver checks the old one freed).
    assert_eq!(device.reserve_sleep_buffer(40 * MIB).unwrap(), 40 * MIB);
    assert_eq!(device.sleep_host_buffer_bytes(), 40 * MIB);
    r.free(a, 0);
    r.finish();
}

#[test]
fn with_no_live_block_there_is_nothing_to_reserve() {
    let r = vmm_rig(256 * MIB);
    let device = r.device(0);
    assert_eq!(device.reserve_sleep_buffer(0).unwrap(), 0);
    assert_eq!(
        r.sim.calls("cuMemAddressReserve"),
        0,
        "a device never used was set up"
    );
    let p = r.malloc(MIB, 0, 1);
    r.free(p, 0);
    assert_eq!(device.reserve_sleep_buffer(0).unwrap(), 0, "nothing live");
    assert_eq!(r.sim.calls("cuMemAllocHost"), 0);
    r.finish();
}

#[test]
fn a_reservation_refused_changes_nothing() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    let device = r.device(0);
    assert_eq!(device.reserve_sleep_buffer(8 * MIB).unwrap(), 8 * MIB);
    // Host memory that cannot be pinned: the error says so, the kept buffer stays.
    r.sim.inject_fault(SimFault::HostAlloc, 1);
    let e = device
        .reserve_sleep_buffer(64 * MIB)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("page-locked host memory for the next sleep could not be allocated")
            && e.ends_with("a buffer kept before stays"),
        "{e}"
    );
    assert_eq!(device.sleep_host_buffer_bytes(), 8 * MIB);
    // Asleep: the buffer holds the contents.
    device.sleep(1, &[]).unwrap();
    let e = device
        .reserve_sleep_buffer(64 * MIB)
        .unwrap_err()
        .to_string();
    assert!(e.contains("asleep"), "{e}");
    assert_eq!(device.sleep_host_buffer_bytes(), 8 * MIB);
    device.wake().unwrap();
    r.free(a, 0);
    r.finish();
    // The pool backend cannot sleep; a device never used is not set up to say so.
    let r = rig_with(1, 256 * MIB, pool_config());
    let device = r.device(0);
    for bytes in [0, 8 * MIB] {
        let e = device.reserve_sleep_buffer(bytes).unwrap_err().to_string();
        assert!(e.contains("STREAMPOOL_BACKEND=vmm"), "{e}");
    }
    assert_eq!(r.sim.calls("cuMemPoolCreate"), 0);
    let b = r.malloc(MIB, 0, 1);
    assert!(device.reserve_sleep_buffer(0).is_err());
    assert_eq!(r.sim.calls("cuMemAllocHost"), 0);
    r.free(b, 0);
    r.finish();
}

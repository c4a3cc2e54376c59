//! The virtual-memory resource when the driver refuses: failed maps, access, unmaps and
//! releases leave nothing half done and lose nothing; requests and frees it cannot serve are
//! refused without changing anything.

use super::*;

#[test]
fn a_blocked_page_is_retried_until_it_can_be_fixed() {
    let r = rig();
    let a = r.alloc(PAGE, S1);
    r.sim.inject_fault(SimFault::SetAccess, 2);
    r.sim.inject_fault(SimFault::MemUnmap, 2);
    assert!(
        r.vmm.allocate(PAGE, S1).is_err(),
        "mapped without access: blocked"
    );
    r.vmm.trim(0).unwrap(); // the first try to fix it fails too
    r.vmm.trim(0).unwrap(); // the second works
    r.free(a, PAGE, S1);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0, "nothing blocked is left behind");
}

#[test]
fn a_failed_map_or_access_leaves_nothing_half_done() {
    for fault in [SimFault::MemCreate, SimFault::MemMap, SimFault::SetAccess] {
        let r = rig();
        let a = r.alloc(PAGE, S1);
        r.sim.inject_fault(fault, 1);
        let e = r.vmm.allocate(3 * PAGE, S1).unwrap_err();
        assert!(e.to_string().contains("injected"), "{fault:?}: {e}");
        assert_eq!(
            r.sim.mappings(0).len(),
            1,
            "{fault:?}: only a's page is mapped"
        );
        let b = r.alloc(3 * PAGE, S1);
        r.free(a, PAGE, S1);
        r.free(b, 3 * PAGE, S1);
    }
}

#[test]
fn a_page_whose_access_and_unmap_both_failed_is_never_handed_out_until_fixed() {
    let r = rig();
    let a = r.alloc(PAGE, S1);
    r.sim.inject_fault(SimFault::SetAccess, 1);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    assert!(
        r.vmm.allocate(PAGE, S1).is_err(),
        "no access, and the page stays mapped"
    );
    assert_eq!(r.sim.mappings(0).len(), 2, "the blocked page is mapped");
    // The next allocations must not get the blocked page without access (touch checks it).
    let blocks: Vec<DevicePtr> = (0..3).map(|_| r.alloc(PAGE, S1)).collect();
    assert!(r
        .sim
        .mappings(0)
        .iter()
        .all(|(_, _, access)| access == &[0]));
    r.free(a, PAGE, S1);
    for b in blocks {
        r.free(b, PAGE, S1);
    }
}

#[test]
fn a_spare_handle_the_driver_refuses_to_release_stays_counted_for_the_next_trim() {
    let r = rig_pages();
    r.sim.inject_fault(SimFault::SetAccess, 1);
    assert!(
        r.vmm.allocate(2 * PAGE, S1).is_err(),
        "its two handles become spares"
    );
    assert_eq!((r.physical(), r.reserved()), (2 * PAGE, 2 * PAGE));
    r.sim.inject_fault(SimFault::MemRelease, 1);
    r.vmm.trim(0).unwrap();
    assert_eq!(
        (r.physical(), r.reserved()),
        (PAGE, PAGE),
        "one refused, still held and counted"
    );
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0);
}

#[test]
fn a_failed_unmap_keeps_the_page_and_a_failed_release_keeps_the_handle() {
    let r = rig_with(1, 64 * PAGE, "0");
    let a = r.alloc(2 * PAGE, S1);
    r.free(a, 2 * PAGE, S1);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    r.sim.inject_fault(SimFault::MemRelease, 1);
    r.sim.complete_all();
    r.vmm.trim(0).unwrap();
    assert_eq!(
        r.physical(),
        2 * PAGE,
        "one page not unmapped, one handle not released"
    );
    r.vmm.trim(0).unwrap();
    assert_eq!(r.physical(), 0, "the next trim finishes the job");
}

#[test]
fn a_request_beyond_the_device_fails_at_once_without_reserving_or_listing_pages() {
    let r = rig();
    let started = std::time::Instant::now();
    let e = r.vmm.allocate(1 << 47, S1).unwrap_err();
    assert!(e.is_device_oom(), "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        r.vmm.state.lock().large.extents().count(),
        1,
        "no new reservation"
    );
}

#[test]
fn bad_frees_are_refused_without_changing_anything() {
    let r = rig();
    let a = r.alloc(PAGE, S1);
    assert!(
        r.vmm.deallocate(a.offset(512), PAGE, S1).is_err(),
        "inside a block"
    );
    assert!(r.vmm.deallocate(a, 2 * PAGE, S1).is_err(), "wrong size");
    assert_eq!(r.vmm.usage().unwrap().used_bytes, PAGE);
    r.free(a, PAGE, S1);
    assert!(r.vmm.deallocate(a, PAGE, S1).is_err(), "double free");
}

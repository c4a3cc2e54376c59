//! What a sleeping device refuses, on the strict simulated driver: every way of handing out
//! memory (a PyTorch pool's checkpoint restored too), before anything moves — a refused
//! allocation changes no statistic — and what it no longer refuses: a shared block the program
//! freed, which waits for another stream, does not keep the device awake.

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;
use std::sync::Arc;
use streampool::driver::sim::SimFault;

#[test]
fn a_checkpoint_of_a_pytorch_pool_is_not_restored_while_asleep() {
    let r = vmm_rig(256 * MIB);
    let pool = (0, 1);
    let pools = r.device(0).graph_pools();
    pools
        .begin_allocate_to_pool(pool, Arc::new(OnStream(s(1))))
        .unwrap();
    let routed = pools.claiming(s(1));
    let a = r.alloc.malloc_into(3 * MIB, 0, s(1), routed).unwrap();
    let b = r.alloc.malloc_into(3 * MIB, 0, s(1), routed).unwrap();
    pools.end_allocate_to_pool(pool).unwrap();
    let live = r.device(0).graph_pool_live_blocks(pool).unwrap();
    let &(ptr, requested, block, stream) = live.iter().find(|x| x.0 == b).unwrap();
    r.free(b, 0);
    r.device(0).sleep(1, &[]).unwrap();
    let before = r.stats(0);
    let e = r
        .device(0)
        .restore_in_graph_pool(pool, ptr, requested, block, stream);
    assert!(e.unwrap_err().to_string().contains("asleep"));
    assert_eq!(r.stats(0), before, "a refused restore changed statistics");
    r.device(0).wake().unwrap();
    let p = r
        .device(0)
        .restore_in_graph_pool(pool, ptr, requested, block, stream);
    let p = p.unwrap();
    r.sim.touch(0, 0, p, requested, s(1)).unwrap();
    r.free(p, 0);
    r.free(a, 0);
    r.device(0).graph_pools().release_pool(pool).unwrap();
    r.finish();
}

#[test]
fn an_allocation_refused_while_asleep_hands_back_no_waiting_block() {
    let r = vmm_rig(256 * MIB);
    let kept = r.malloc(4 * MIB, 0, 1);
    let p = r.malloc(6 * MIB, 0, 1);
    r.alloc.record_stream(p, s(2)).unwrap();
    r.device(0).sleep(1, &[]).unwrap();
    r.free(p, 0); // waits for stream 2
    r.sim.complete_all();
    let before = r.stats(0);
    let e = r.alloc.malloc(MIB, 0, s(1)).unwrap_err();
    assert!(e.to_string().contains("asleep"), "{e}");
    assert_eq!(
        r.stats(0),
        before,
        "a refused allocation changed statistics"
    );
    r.device(0).wake().unwrap();
    r.free(kept, 0);
    r.finish();
}

#[test]
fn a_shared_block_freed_while_it_waits_for_another_stream_does_not_keep_the_device_awake() {
    let r = vmm_rig_with_spans(256 * MIB, 32 * MIB);
    let ptr = r.malloc(3 * MIB, 0, 1);
    let (handle, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    for &fd in fds.iter().filter(|&&fd| fd >= 0) {
        // SAFETY: descriptors the export handed to this test, closed once.
        unsafe { libc::close(fd) };
    }
    r.device(0).release_export(handle.event).unwrap();
    r.alloc.record_stream(ptr, s(2)).unwrap();
    r.free(ptr, 0);
    r.sim.complete_all();
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.device(0).wake().unwrap();
    r.finish();
}

/// A wake that maps a page but can neither give it access nor unmap it again (two driver
/// failures) leaves the device asleep, and the next wake gives that page access before the
/// device is awake: nothing is ever handed out on a page without access.
#[test]
fn a_page_a_failed_wake_left_without_access_gets_it_before_the_device_is_awake() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(6 * MIB, 0, 1);
    r.device(0).sleep(1, &[]).unwrap();
    r.sim.inject_fault(SimFault::SetAccess, 1);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    assert!(r.device(0).wake().is_err());
    assert!(r.device(0).is_asleep());
    let e = r.alloc.malloc(MIB, 0, s(1)).unwrap_err();
    assert!(e.to_string().contains("asleep"), "{e}");
    r.sim.inject_fault(SimFault::SetAccess, 1);
    assert!(r.device(0).wake().is_err(), "access failed again");
    assert!(r.device(0).is_asleep());
    r.device(0).wake().unwrap();
    r.sim.touch(0, 0, a, 6 * MIB, s(1)).unwrap();
    let b = r.malloc(MIB, 0, 1);
    r.sim.touch(0, 0, b, MIB, s(1)).unwrap();
    r.free(b, 0);
    r.free(a, 0);
    r.finish();
}

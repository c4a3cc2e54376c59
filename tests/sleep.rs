//! Sleep and wake on the vmm backend, on the strict simulated driver: every physical page goes
//! back while the addresses stay, level 1 saves what live blocks hold in page-locked host memory
//! and copies it back at wake, blocks keep their addresses, and every fault leaves the device
//! either as it was or asleep and wakeable. (The simulator checks that copies touch mapped
//! memory and that nothing leaks; the contents themselves are checked on the GPU.)

mod common;
use common::*;
use streampool::config::Backend;
use streampool::driver::sim::SimFault;
use streampool::driver::VmmDriver;
use streampool::Config;

fn vmm_rig(memory_bytes: u64) -> Rig {
    let config = Config {
        backend: Backend::Vmm,
        ..base_config()
    };
    rig_with(1, memory_bytes, config)
}

#[test]
fn a_sleeping_device_holds_no_memory_and_wakes_at_the_same_addresses() {
    let r = vmm_rig(256 * MIB);
    let big = r.malloc(5 * MIB, 0, 1);
    let small = r.malloc(64 * 1024, 0, 1);
    let gone = r.malloc(8 * MIB, 0, 1);
    r.free(gone, 0);
    let held = r.sim.physical_bytes(0);
    assert!(held >= 16 * MIB);
    let copies_out = r.sim.calls("cuMemcpyDtoH");
    let given_back = r.alloc.sleep(0, 1).unwrap();
    assert_eq!(given_back, held);
    assert_eq!(r.sim.physical_bytes(0), 0, "every page went back");
    assert_eq!(r.alloc.sleeping_bytes(0).unwrap(), held);
    // The live blocks' pages (3 of the big block's, 1 carrier), not the freed block's.
    assert_eq!(r.sim.calls("cuMemcpyDtoH") - copies_out, 4);
    let e = r.alloc.malloc(MIB, 0, s(1)).unwrap_err().to_string();
    assert!(e.contains("asleep") && e.contains("wake"), "{e}");
    r.free(small, 0); // frees are fine while asleep
    let restored = r.alloc.wake(0).unwrap();
    assert_eq!(restored, held);
    assert_eq!(r.alloc.sleeping_bytes(0).unwrap(), 0);
    assert_eq!(
        r.sim.calls("cuMemcpyHtoD"),
        4,
        "the saved pages copied back"
    );
    r.sim.touch(0, 0, big, 5 * MIB, s(1)).unwrap(); // mapped with access again
    let again = r.malloc(64 * 1024, 0, 1);
    r.free(again, 0);
    r.free(big, 0);
    r.finish();
}

#[test]
fn level_2_discards_the_contents() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    r.alloc.sleep(0, 2).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.alloc.wake(0).unwrap();
    assert_eq!(r.sim.calls("cuMemcpyDtoH") + r.sim.calls("cuMemcpyHtoD"), 0);
    r.sim.touch(0, 0, a, 4 * MIB, s(1)).unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn bad_calls_and_faults_leave_the_device_as_it_was() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    let held = r.sim.physical_bytes(0);
    for (call, what) in [
        (r.alloc.wake(0).map(|_| ()), "not asleep"),
        (r.alloc.sleep(0, 3).map(|_| ()), "level"),
        (r.alloc.sleep(0, 0).map(|_| ()), "level"),
    ] {
        let e = call.unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
    // Host memory that cannot be pinned: a clear error, nothing changed.
    r.sim.inject_fault(SimFault::HostAlloc, 1);
    let e = r.alloc.sleep(0, 1).unwrap_err().to_string();
    assert!(
        e.contains("page-locked host memory") && e.contains("nothing changed"),
        "{e}"
    );
    assert_eq!(r.sim.physical_bytes(0), held);
    // A copy that fails: the buffer is freed, nothing else changed.
    r.sim.inject_fault(SimFault::Copy, 1);
    assert!(r.alloc.sleep(0, 1).is_err());
    assert_eq!(r.sim.physical_bytes(0), held);
    let b = r.malloc(MIB, 0, 1);
    r.free(b, 0);
    r.alloc.sleep(0, 1).unwrap();
    let e = r.alloc.sleep(0, 1).unwrap_err().to_string();
    assert!(e.contains("asleep already"), "{e}");
    r.alloc.wake(0).unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn out_of_memory_at_wake_keeps_what_was_restored_and_a_later_wake_goes_on() {
    let r = vmm_rig(64 * MIB);
    let a = r.malloc(20 * MIB, 0, 1);
    r.alloc.sleep(0, 1).unwrap();
    // Another process takes most of the device meanwhile.
    let foreign = r.sim.mem_create(0, 52 * MIB).unwrap();
    let e = r.alloc.wake(0).unwrap_err();
    assert!(e.is_device_oom(), "{e}");
    let restored = r.sim.physical_bytes(0) - 52 * MIB;
    assert!(
        restored > 0 && restored < 20 * MIB,
        "some pages restored: {restored}"
    );
    assert_eq!(r.alloc.sleeping_bytes(0).unwrap(), 20 * MIB - restored);
    r.sim.mem_release(0, foreign).unwrap();
    r.alloc.wake(0).unwrap();
    assert_eq!(r.alloc.sleeping_bytes(0).unwrap(), 0);
    r.sim.touch(0, 0, a, 20 * MIB, s(1)).unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn the_pool_backend_and_a_capture_refuse_to_sleep() {
    let r = pool_rig(64 * MIB);
    let e = r.alloc.sleep(0, 1).unwrap_err().to_string();
    assert!(e.contains("STREAMPOOL_BACKEND=vmm"), "{e}");
    r.finish();
    let r = vmm_rig(64 * MIB);
    let a = r.malloc(MIB, 0, 1);
    r.sim.begin_capture(0, s(9));
    let graph = r.malloc(MIB, 0, 9); // the capture is known now
    let e = r.alloc.sleep(0, 1).unwrap_err().to_string();
    assert!(e.contains("captures"), "{e}");
    r.free(graph, 0);
    r.sim.end_capture(0, s(9));
    r.free(a, 0);
    r.finish();
}

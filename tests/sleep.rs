//! Sleep and wake on the vmm backend, on the strict simulated driver: every physical page goes
//! back while the addresses stay, level 1 saves what live blocks hold in page-locked host memory
//! and copies it back at wake, blocks keep their addresses, and every fault leaves the device
//! either as it was or asleep and wakeable. (The simulator checks that copies touch mapped
//! memory and that nothing leaks; the contents themselves are checked on the GPU.)

mod common;
#[path = "common/contents.rs"]
mod contents;
use common::*;
use contents::*;
use streampool::driver::sim::SimFault;
use streampool::driver::{DevicePtr, VmmDriver};

#[test]
fn a_sleeping_device_holds_no_memory_and_wakes_at_the_same_addresses() {
    let r = vmm_rig(256 * MIB);
    let big = r.malloc(5 * MIB, 0, 1);
    let small = r.malloc(64 * 1024, 0, 1);
    let gone = r.malloc(8 * MIB, 0, 1);
    r.free(gone, 0);
    let held = r.sim.physical_bytes(0);
    assert!(held >= 16 * MIB);
    let copies_out = r.sim.calls("cuMemcpyDtoHAsync");
    let given_back = r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(given_back, held);
    assert_eq!(r.sim.physical_bytes(0), 0, "every page went back");
    // Only the live blocks' pages sleep (3 of the big block's, 1 carrier); the freed block's
    // went back as empty_cache() gives them back. One copy a run of adjacent pages (the big
    // block's 3, in the large region; the carrier, apart).
    let live_pages_bytes = 4 * 2 * MIB;
    assert_eq!(r.device(0).sleeping_bytes(), live_pages_bytes);
    assert_eq!(r.sim.calls("cuMemcpyDtoHAsync") - copies_out, 2);
    assert_eq!(r.device(0).sleep_saved_bytes(), live_pages_bytes);
    let e = r.alloc.malloc(MIB, 0, s(1)).unwrap_err().to_string();
    assert!(e.contains("asleep") && e.contains("wake"), "{e}");
    r.free(small, 0); // frees are fine while asleep
    r.sim.complete_all();
    assert_eq!(
        r.device(0).sleeping_bytes(),
        live_pages_bytes,
        "counted until the wake"
    );
    let maps = r.sim.calls("cuMemMap");
    let restored = r.device(0).wake().unwrap();
    assert_eq!(restored, 3 * 2 * MIB);
    assert_eq!(
        r.sim.calls("cuMemMap") - maps,
        1,
        "wake maps the pages live blocks need: the big block's 3 as one handle (the carrier's \
         only block was freed while asleep)"
    );
    assert_eq!(r.device(0).sleeping_bytes(), 0);
    assert_eq!(
        r.sim.calls("cuMemcpyHtoDAsync"),
        1,
        "the saved pages copied back, a run a copy"
    );
    r.sim.touch(0, 0, big, 5 * MIB, s(1)).unwrap(); // mapped with access again
                                                    // The carrier's page comes back when an allocation needs it.
    let again = r.malloc(64 * 1024, 0, 1);
    r.sim.touch(0, 0, again, 64 * 1024, s(1)).unwrap();
    r.free(again, 0);
    // The freed block's pages come back when an allocation needs them.
    let later = r.malloc(8 * MIB, 0, 1);
    r.sim.touch(0, 0, later, 8 * MIB, s(1)).unwrap();
    r.free(later, 0);
    r.free(big, 0);
    r.finish();
}

#[test]
fn level_2_discards_the_contents() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    r.device(0).sleep(2, &[]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    r.device(0).wake().unwrap();
    assert_eq!(
        r.sim.calls("cuMemcpyDtoHAsync") + r.sim.calls("cuMemcpyHtoDAsync"),
        0
    );
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
        (r.device(0).wake().map(|_| ()), "not asleep"),
        (r.device(0).sleep(3, &[]).map(|_| ()), "level"),
        (r.device(0).sleep(0, &[]).map(|_| ()), "level"),
    ] {
        let e = call.unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
    // Host memory that cannot be pinned: a clear error, nothing changed.
    r.sim.inject_fault(SimFault::HostAlloc, 1);
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(
        e.contains("page-locked host memory") && e.contains("nothing changed"),
        "{e}"
    );
    assert_eq!(r.sim.physical_bytes(0), held);
    // A copy that fails to be queued: nothing changed (the buffer is kept for the next sleep).
    r.sim.inject_fault(SimFault::Copy, 1);
    assert!(r.device(0).sleep(1, &[]).is_err());
    assert_eq!(r.sim.physical_bytes(0), held);
    let b = r.malloc(MIB, 0, 1);
    r.free(b, 0);
    r.device(0).sleep(1, &[]).unwrap();
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("asleep already"), "{e}");
    r.device(0).wake().unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn out_of_memory_at_wake_keeps_what_was_restored_and_a_later_wake_goes_on() {
    let r = vmm_rig(64 * MIB);
    let a = r.malloc(20 * MIB, 0, 1);
    r.device(0).sleep(1, &[]).unwrap();
    // Another process takes most of the device meanwhile.
    let foreign = r.sim.mem_create(0, 52 * MIB).unwrap();
    let ooms = r.stats(0).num_ooms;
    let e = r.device(0).wake().unwrap_err();
    // Python's OutOfMemoryError (the driver's error of one cuMemCreate was passed on as it was).
    assert!(
        matches!(e, streampool::Error::OutOfMemory(_))
            && e.to_string()
                .starts_with("CUDA out of memory. Tried to allocate"),
        "{e}"
    );
    assert_eq!(r.stats(0).num_ooms, ooms + 1);
    let restored = r.sim.physical_bytes(0) - 52 * MIB;
    assert!(
        restored > 0 && restored < 20 * MIB,
        "some pages restored: {restored}"
    );
    assert_eq!(r.device(0).sleeping_bytes(), 20 * MIB - restored);
    r.sim.mem_release(0, foreign).unwrap();
    r.device(0).wake().unwrap();
    assert_eq!(r.device(0).sleeping_bytes(), 0);
    r.sim.touch(0, 0, a, 20 * MIB, s(1)).unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn the_pool_backend_and_a_capture_refuse_to_sleep() {
    let r = pool_rig(64 * MIB);
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("STREAMPOOL_BACKEND=vmm"), "{e}");
    let e = r.device(0).wake().unwrap_err().to_string();
    assert!(e.contains("STREAMPOOL_BACKEND=vmm"), "{e}");
    // Refused before the device, never used, is set up: a refusal creates nothing.
    assert_eq!(r.sim.calls("cuMemPoolCreate"), 0);
    r.finish();
    let r = vmm_rig(64 * MIB);
    let a = r.malloc(MIB, 0, 1);
    r.sim.begin_capture(0, s(9));
    let graph = r.malloc(MIB, 0, 9); // the capture is known now
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("captures"), "{e}");
    r.free(graph, 0);
    r.sim.end_capture(0, s(9));
    // Once the capture ended, the device sleeps (it asks the driver again, not what it last saw).
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    r.free(a, 0);
    r.finish();
}

#[test]
fn the_host_buffer_is_kept_for_the_next_sleep_until_released() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(6 * MIB, 0, 1);
    fill(&r, a, 6 * MIB, 1);
    r.device(0).sleep(1, &[]).unwrap();
    let saved = r.device(0).sleep_saved_bytes();
    assert_eq!(r.device(0).sleep_host_buffer_bytes(), saved);
    let e = r.device(0).release_sleep_buffer().unwrap_err().to_string();
    assert!(e.contains("wake it first"), "{e}");
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 6 * MIB, 1));
    assert_eq!(r.device(0).sleep_host_buffer_bytes(), saved, "kept");
    // The second sleep pins nothing: it reuses the buffer, and restores its own contents.
    let pinned = r.sim.calls("cuMemAllocHost");
    fill(&r, a, 6 * MIB, 2);
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    assert_eq!(r.sim.calls("cuMemAllocHost"), pinned);
    assert!(holds(&r, a, 6 * MIB, 2));
    // More to save than the kept buffer holds: a larger one replaces it.
    let b = r.malloc(20 * MIB, 0, 1);
    fill(&r, b, 20 * MIB, 3);
    r.device(0).sleep(1, &[]).unwrap();
    let larger = r.device(0).sleep_saved_bytes();
    assert!(larger > saved);
    assert_eq!(r.sim.calls("cuMemAllocHost"), pinned + 1);
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 6 * MIB, 2) && holds(&r, b, 20 * MIB, 3));
    assert_eq!(r.device(0).release_sleep_buffer().unwrap(), larger);
    assert_eq!(r.device(0).sleep_host_buffer_bytes(), 0);
    assert_eq!(r.device(0).release_sleep_buffer().unwrap(), 0);
    // Level 2 needs no buffer: one kept stays kept, and can be released while asleep.
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    r.device(0).sleep(2, &[]).unwrap();
    assert_eq!(r.device(0).sleep_host_buffer_bytes(), larger);
    assert_eq!(r.device(0).release_sleep_buffer().unwrap(), larger);
    assert_eq!(r.device(0).sleep_host_buffer_bytes(), 0);
    r.device(0).wake().unwrap();
    // A level-1 sleep after a release pins one again.
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.sim.calls("cuMemAllocHost"), pinned + 3);
    r.device(0).wake().unwrap();
    r.free(a, 0);
    r.free(b, 0);
    r.finish(); // the kept buffer is freed with the allocator (the strict driver checks)
}

#[test]
fn a_copy_that_fails_at_wake_leaves_its_pages_asleep_and_a_later_wake_restores_them() {
    let r = vmm_rig(256 * MIB);
    // Two runs: the large block's pages, discarded (nothing to copy back), then the carrier
    // page of the small block (one copy), which fails once.
    let a = tagged(&r, Some("wake_fault_kv"), 8 * MIB);
    let small = r.malloc(64 * 1024, 0, 1);
    assert!(a.0 < small.0, "the large blocks lie below the carriers");
    fill(&r, small, 64 * 1024, 4);
    r.device(0).sleep(1, &["wake_fault_kv"]).unwrap();
    let asleep = r.device(0).sleeping_bytes();
    r.sim.inject_fault(SimFault::Copy, 1);
    assert!(r.device(0).wake().is_err());
    let left = r.device(0).sleeping_bytes();
    assert_eq!(
        left,
        2 * MIB,
        "the carrier page sleeps on, the large block's are back"
    );
    // The carrier's fresh handle stays, unmapped, for the next wake.
    assert_eq!(r.sim.physical_bytes(0), asleep - left + 2 * MIB);
    r.sim.touch(0, 0, a, 8 * MIB, s(1)).unwrap();
    r.device(0).wake().unwrap();
    assert!(holds(&r, small, 64 * 1024, 4));
    r.free(a, 0);
    r.free(small, 0);
    r.finish();
}

#[test]
fn a_page_that_can_be_neither_restored_nor_unmapped_at_wake_does_not_stop_later_wakes() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(2 * MIB, 0, 1);
    let gap = r.malloc(2 * MIB, 0, 1);
    let b = r.malloc(4 * MIB, 0, 1);
    r.free(gap, 0); // its page goes back at the sleep: a and b are apart
    r.device(0).sleep(1, &[]).unwrap();
    // a's page comes back alone, b's two pages as one handle. a's copy back fails, and so does
    // the unmap that would put it back to sleep: it is taken as restored (mapped, its contents
    // lost), and the wake stops there; b sleeps on.
    r.sim.inject_fault(SimFault::Copy, 1);
    r.sim.inject_fault(SimFault::MemUnmap, 1);
    assert!(r.device(0).wake().is_err());
    assert_eq!(r.device(0).sleeping_bytes(), 4 * MIB);
    r.device(0).wake().unwrap(); // not stuck on the page mapped already
    assert_eq!(r.device(0).sleeping_bytes(), 0);
    r.sim.touch(0, 0, a, 2 * MIB, s(1)).unwrap();
    r.sim.touch(0, 0, b, 4 * MIB, s(1)).unwrap();
    r.free(a, 0);
    r.free(b, 0);
    r.finish();
}

#[test]
fn memory_freed_before_and_during_a_sleep_serves_a_block_across_it_after_wake() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    let b = r.malloc(4 * MIB, 0, 1);
    let c = r.malloc(4 * MIB, 0, 1);
    fill(&r, c, 4 * MIB, 3);
    r.free(b, 0); // idle at the sleep: given back, not asleep
    let given_back = r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.device(0).sleeping_bytes(), 8 * MIB, "a's and c's pages");
    assert_eq!(given_back, 12 * MIB);
    r.free(a, 0); // asleep under a block that is gone by the wake
    r.sim.complete_all(); // the work queued before that free
    assert_eq!(r.device(0).wake().unwrap(), 4 * MIB, "c's pages only");
    assert!(holds(&r, c, 4 * MIB, 3));
    // a's pages and b's, both given back, side by side, back one block: every page of it mapped
    // with access (the simulator refuses a touch of anything else).
    let across = r.malloc(8 * MIB, 0, 1);
    assert_eq!(across, a, "the freed range at a's place is reused");
    r.sim.touch(0, 0, across, 8 * MIB, s(1)).unwrap();
    fill(&r, across, 8 * MIB, 4);
    assert!(holds(&r, c, 4 * MIB, 3), "the new block overlaps c");
    r.free(across, 0);
    r.free(c, 0);
    r.finish();
}

#[test]
fn sleep_and_wake_return_once_their_copies_are_done_and_a_failed_wait_at_wake_keeps_the_pages_asleep(
) {
    let r = vmm_rig(256 * MIB);
    // 20 pages: wake maps them in two chunks, copying the first back while it maps the second.
    let a = r.malloc(40 * MIB, 0, 1);
    fill(&r, a, 40 * MIB, 7);
    r.device(0).sleep(1, &[]).unwrap();
    assert!(!r.sim.work_in_flight(0), "the sleep waited for its copies");
    let asleep = r.device(0).sleeping_bytes();
    assert!(asleep >= 40 * MIB);
    // The wait for the copies back fails: their pages sleep on, their contents in the buffer.
    r.sim.inject_fault(SimFault::StreamSynchronize, 1);
    assert!(r.device(0).wake().is_err());
    assert!(
        !r.sim.work_in_flight(0),
        "nothing in flight after a failed wake"
    );
    assert_eq!(r.device(0).sleeping_bytes(), asleep);
    r.device(0).wake().unwrap();
    assert!(!r.sim.work_in_flight(0), "the wake waited for its copies");
    assert!(holds(&r, a, 40 * MIB, 7));
    r.free(a, 0);
    r.finish();
}

#[test]
fn an_emptied_carrier_goes_back_at_a_sleep_while_the_carrier_in_use_sleeps() {
    let r = vmm_rig(256 * MIB);
    // 512 KiB blocks, four to a 2 MiB carrier: the fifth opens a second carrier.
    let kept: Vec<_> = (0..4).map(|_| r.malloc(512 * 1024, 0, 1)).collect();
    let fifth = r.malloc(512 * 1024, 0, 1);
    let page = |p: DevicePtr| p.0 / (2 * MIB);
    assert!(kept.iter().all(|&p| page(p) == page(kept[0])));
    assert_ne!(page(fifth), page(kept[0]), "a second carrier");
    for (i, &p) in kept.iter().enumerate() {
        fill(&r, p, 512 * 1024, 10 + i as u8);
    }
    r.free(fifth, 0); // its carrier is empty: an idle page
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    assert_eq!(
        r.device(0).sleeping_bytes(),
        2 * MIB,
        "only the carrier in use sleeps"
    );
    assert_eq!(r.device(0).wake().unwrap(), 2 * MIB);
    for (i, &p) in kept.iter().enumerate() {
        assert!(holds(&r, p, 512 * 1024, 10 + i as u8), "block {i} restored");
    }
    // Small blocks still come from carriers mapped with access, the emptied one's included.
    let again: Vec<_> = (0..5).map(|_| r.malloc(512 * 1024, 0, 1)).collect();
    for &p in &again {
        r.sim.touch(0, 0, p, 512 * 1024, s(1)).unwrap();
    }
    for p in kept.into_iter().chain(again) {
        r.free(p, 0);
    }
    r.finish();
}

#[test]
fn a_memory_pool_segment_with_free_space_sleeps_whole_and_serves_the_pool_after_wake() {
    let r = vmm_rig(256 * MIB);
    let pool = (0, 1);
    let into_pool = |bytes| {
        let routed = r.device(0).graph_pools().claiming(s(1));
        assert_eq!(routed, Some(pool));
        r.alloc.malloc_into(bytes, 0, s(1), routed).unwrap()
    };
    r.device(0)
        .graph_pools()
        .begin_allocate_to_pool(pool, std::sync::Arc::new(OnStream(s(1))))
        .unwrap();
    let a = into_pool(3 * MIB);
    let b = into_pool(3 * MIB);
    fill(&r, a, 3 * MIB, 21);
    r.free(b, 0); // free space inside the pool's memory, kept for the pool
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0);
    // Asleep, that space lies on pages given back: the pool hands out nothing.
    let routed = r.device(0).graph_pools().claiming(s(1));
    let e = r.alloc.malloc_into(3 * MIB, 0, s(1), routed).unwrap_err();
    assert!(e.to_string().contains("asleep"), "{e}");
    r.device(0).wake().unwrap();
    assert!(holds(&r, a, 3 * MIB, 21));
    // The pool serves its next block from the space b left, mapped with access again.
    let c = into_pool(3 * MIB);
    r.sim.touch(0, 0, c, 3 * MIB, s(1)).unwrap();
    r.device(0)
        .graph_pools()
        .end_allocate_to_pool(pool)
        .unwrap();
    r.free(a, 0);
    r.free(c, 0);
    r.device(0).graph_pools().release_pool(pool).unwrap();
    r.finish();
}

#[test]
fn a_failed_wait_for_the_copies_at_sleep_leaves_the_device_awake_with_its_contents() {
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(6 * MIB, 0, 1);
    fill(&r, a, 6 * MIB, 3);
    let gone = r.malloc(8 * MIB, 0, 1);
    r.free(gone, 0);
    r.sim.inject_fault(SimFault::StreamSynchronize, 1);
    assert!(r.device(0).sleep(1, &[]).is_err());
    assert!(
        !r.sim.work_in_flight(0),
        "nothing in flight after a failed sleep"
    );
    assert_eq!(r.device(0).sleeping_bytes(), 0, "awake");
    assert!(holds(&r, a, 6 * MIB, 3));
    r.sim.touch(0, 0, a, 6 * MIB, s(1)).unwrap();
    awake_and_sleeps_again(&r);
    assert!(holds(&r, a, 6 * MIB, 3));
    r.free(a, 0);
    r.finish();
}

/// A sleep refused because the device sleeps already changes nothing: it handed back the blocks
/// that waited for other streams first (`active_bytes` fell, `num_device_frees` rose).
#[test]
fn a_refused_second_sleep_hands_back_no_waiting_block() {
    let r = vmm_rig(256 * MIB);
    let keep = r.malloc(4 * MIB, 0, 1);
    let p = r.malloc(6 * MIB, 0, 1);
    r.alloc.record_stream(p, s(2)).unwrap();
    r.device(0).sleep(1, &[]).unwrap();
    r.free(p, 0); // waits for stream 2
    let before = r.stats(0);
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("asleep already"), "{e}");
    let after = r.stats(0);
    assert_eq!(
        (after.active_bytes, after.num_device_frees),
        (before.active_bytes, before.num_device_frees)
    );
    r.device(0).wake().unwrap();
    r.free(keep, 0);
    r.finish();
}

/// Allocating on a sleeping device raises until wake(), from the shareable pool too (it served
/// 900 MiB of a 1 GiB device while asleep, which wake then competed with).
#[test]
fn a_sleeping_device_refuses_shareable_allocations_too() {
    use streampool::ipc::{begin_shareable, end_shareable};
    let r = vmm_rig(256 * MIB);
    let a = r.malloc(4 * MIB, 0, 1);
    r.device(0).sleep(1, &[]).unwrap();
    begin_shareable().unwrap();
    let e = r.alloc.malloc(8 * MIB, 0, s(1)).unwrap_err().to_string();
    end_shareable().unwrap();
    assert!(e.contains("asleep") && e.contains("wake"), "{e}");
    r.device(0).wake().unwrap();
    begin_shareable().unwrap();
    let b = r.malloc(8 * MIB, 0, 1);
    end_shareable().unwrap();
    r.free(b, 0);
    r.free(a, 0);
    r.finish();
}

#[test]
fn a_block_freed_while_asleep_that_waited_for_another_stream_is_not_mapped_again_either() {
    let r = vmm_rig(256 * MIB);
    let kept = r.malloc(4 * MIB, 0, 1);
    let gone = r.malloc(8 * MIB, 0, 1);
    r.alloc.record_stream(gone, s(2)).unwrap();
    r.device(0).sleep(1, &[]).unwrap();
    r.free(gone, 0); // waits for stream 2's work before it goes back
    r.sim.complete_all();
    assert_eq!(r.device(0).wake().unwrap(), 4 * MIB, "kept's pages only");
    assert_eq!(r.sim.physical_bytes(0), 4 * MIB);
    r.free(kept, 0);
    r.finish();
}

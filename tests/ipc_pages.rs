//! Sharing a block of the vmm backend page by page, on the simulated driver: in one process the
//! exporter and the importer are the same allocator; the importer maps the block's physical pages
//! at addresses of its own, and the strict simulator checks that both sides touch the same memory
//! only in stream order (the importer's stream waits for the exporter's event).

mod common;
use common::*;
use streampool::config::Backend;
use streampool::driver::sim::SimFault;
use streampool::ipc::IpcKind;
use streampool::Config;

fn vmm_rig() -> Rig {
    let config = Config {
        backend: Backend::Vmm,
        vmm_span_bytes: Some(32 * MIB),
        ..base_config()
    };
    rig_with(1, 256 * MIB, config)
}

fn close_fds(fds: &[i32]) {
    for &fd in fds.iter().filter(|&&fd| fd >= 0) {
        // SAFETY: descriptors the export handed to the test, closed once.
        unsafe { libc::close(fd) };
    }
}

#[test]
fn a_block_of_the_vmm_backend_round_trips_through_its_pages() {
    let r = vmm_rig();
    let ptr = r.malloc(5 * MIB, 0, 1);
    r.sim.touch(0, 0, ptr, 5 * MIB, s(1)).unwrap(); // the exporter writes it
    assert_eq!(r.device(0).ipc_kind(ptr).unwrap(), IpcKind::Pages);
    let (handle, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    assert_eq!((handle.block_bytes, handle.page_count), (5 * MIB, 3));
    // Its three pages were created as one span: one descriptor, then a -1 for each other page.
    assert_eq!(
        (fds.len(), fds[0] >= 0, &fds[1..]),
        (3, true, &[-1, -1][..])
    );
    let imported = r.alloc.ipc_import_pages(&handle, &fds, s(9)).unwrap();
    close_fds(&fds);
    assert_ne!(imported, ptr, "mapped at addresses of the importer's own");
    // The importer's stream waited for the exporter's work: it may touch the memory now.
    r.sim.touch(0, 0, imported, 5 * MIB, s(9)).unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        6 * MIB,
        "the same pages, nothing new"
    );
    assert_eq!(r.alloc.ipc_open_imports(), 1);
    r.alloc.ipc_close(imported, s(9)).unwrap();
    assert_eq!(r.alloc.ipc_open_imports(), 0);
    assert!(r.alloc.ipc_close(imported, s(9)).is_err(), "closed twice");
    r.device(0).release_export(handle.event).unwrap();
    r.free(ptr, 0);
    r.finish();
}

#[test]
fn without_the_import_waiting_the_simulator_refuses_the_touch() {
    // The check the round trip relies on: touching the pages from another stream before the
    // exporter's work is done is refused.
    let r = vmm_rig();
    let ptr = r.malloc(2 * MIB, 0, 1);
    r.sim.touch(0, 0, ptr, 2 * MIB, s(1)).unwrap();
    let (handle, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    let imported = r.alloc.ipc_import_pages(&handle, &fds, s(9)).unwrap();
    close_fds(&fds);
    assert!(
        r.sim.touch(0, 0, imported, 2 * MIB, s(8)).is_err(),
        "stream 8 did not wait"
    );
    r.sim.complete_all();
    r.alloc.ipc_close(imported, s(9)).unwrap();
    r.device(0).release_export(handle.event).unwrap();
    r.free(ptr, 0);
    r.finish();
}

#[test]
fn blocks_that_cannot_be_shared_page_by_page_say_so() {
    let r = pool_rig(64 * MIB);
    let ptr = r.malloc(MIB, 0, 1);
    assert_eq!(r.device(0).ipc_kind(ptr).unwrap(), IpcKind::None);
    let e = r.device(0).export_pages(ptr, s(1)).unwrap_err().to_string();
    assert!(e.contains("pages can be shared"), "{e}");
    r.free(ptr, 0);
    assert!(r.device(0).ipc_kind(ptr).is_err(), "no longer live");
    r.finish();

    let sim = std::sync::Arc::new(streampool::driver::sim::SimDriver::new(1, 64 * MIB).strict());
    sim.set_ipc_unsupported(0);
    let driver = sim.clone() as std::sync::Arc<dyn streampool::driver::Driver>;
    let config = Config {
        backend: Backend::Vmm,
        ..base_config()
    };
    let alloc = streampool::Allocator::new(driver, config).unwrap();
    let ptr = alloc.malloc(MIB, 0, s(1)).unwrap();
    assert_eq!(
        alloc.device(0).unwrap().ipc_kind(ptr).unwrap(),
        IpcKind::None,
        "no POSIX fd handles"
    );
    alloc.free(ptr, 0).unwrap();
}

/// A block inside a span (one handle for several pages) is exported as the whole span: one
/// descriptor and a -1 for each other page, its offset counted from the span's first page; the
/// importer maps the span whole.
#[test]
fn a_block_in_the_middle_of_a_span_is_shared_with_the_whole_span() {
    let r = vmm_rig();
    let whole = r.malloc(20 * MIB, 0, 1); // one span of ten pages
    r.free(whole, 0);
    r.sim.complete_all();
    let first = r.malloc(6 * MIB, 0, 1);
    let ptr = r.malloc(4 * MIB, 0, 1);
    assert_eq!(
        (first, ptr.0),
        (whole, whole.0 + 6 * MIB),
        "placed side by side"
    );
    r.sim.touch(0, 0, ptr, 4 * MIB, s(1)).unwrap();
    let (handle, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    assert_eq!((handle.page_count, handle.offset_bytes), (10, 6 * MIB));
    assert!(
        fds[0] >= 0 && fds[1..].iter().all(|&fd| fd == -1),
        "{fds:?}"
    );
    for bad in [&[-1][..], &[fds[0], -2]] {
        let mut h = handle;
        h.page_count = bad.len() as u64;
        assert!(r.alloc.ipc_import_pages(&h, bad, s(9)).is_err(), "{bad:?}");
    }
    let physical = r.sim.physical_bytes(0);
    let imported = r.alloc.ipc_import_pages(&handle, &fds, s(9)).unwrap();
    close_fds(&fds);
    r.sim.touch(0, 0, imported, 4 * MIB, s(9)).unwrap();
    assert_eq!(
        r.sim.physical_bytes(0),
        physical,
        "the same span, nothing new"
    );
    r.alloc.ipc_close(imported, s(9)).unwrap();
    r.device(0).release_export(handle.event).unwrap();
    r.free(ptr, 0);
    r.free(first, 0);
    r.finish();
}

#[test]
fn bad_page_imports_are_refused_and_leave_nothing_behind() {
    let r = vmm_rig();
    let ptr = r.malloc(3 * MIB, 0, 1);
    let (handle, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    let physical = r.sim.physical_bytes(0);
    let mappings = r.sim.mappings(0).len();
    let bad = |h: streampool::ipc::StreampoolIpcPages, fds: &[i32], what: &str| {
        let e = r.alloc.ipc_import_pages(&h, fds, s(9)).unwrap_err();
        assert!(!e.to_string().is_empty(), "{what}");
    };
    bad(handle, &fds[..1], "too few descriptors");
    bad(handle, &[-1, -1], "not descriptors");
    bad(
        handle,
        &[fds[0], fds[0], fds[0]],
        "more descriptors than pages",
    );
    let mut h = handle;
    h.offset_bytes = h.page_bytes;
    bad(h, &fds, "an offset that puts the block past its pages");
    let mut h = handle;
    h.block_bytes = u64::MAX;
    bad(h, &fds, "a block larger than its pages");
    let mut h = handle;
    h.device = 7;
    bad(h, &fds, "no such device");
    assert_eq!(r.alloc.ipc_open_imports(), 0);
    assert_eq!(r.sim.physical_bytes(0), physical);
    assert_eq!(
        r.sim.mappings(0).len(),
        mappings,
        "no mapping left by a refused import"
    );
    close_fds(&fds);
    r.device(0).release_export(handle.event).unwrap();
    r.free(ptr, 0);
    r.finish();
}

/// An importer keeps the pages it mapped: a sleep would give nothing back for them, and after
/// wake the two processes would see different memory. So a device refuses to sleep while an
/// export of a block's pages is not released (every importer closed it) and the block lives; a
/// failed export counts nothing.
#[test]
fn a_device_refuses_to_sleep_while_a_live_block_was_shared_page_by_page() {
    let r = vmm_rig();
    let ptr = r.malloc(3 * MIB, 0, 1);
    // Failed exports — a page's descriptor, the event after the descriptors, too little room
    // for them — mark nothing.
    r.sim.inject_fault(SimFault::MemExport, 1);
    assert!(r.device(0).export_pages(ptr, s(1)).is_err());
    r.sim.inject_fault(SimFault::EventRecord, 1);
    assert!(r.device(0).export_pages(ptr, s(1)).is_err());
    let e = r.device(0).export_pages_within(ptr, s(1), 1).unwrap_err();
    assert!(e.to_string().contains("fds needs room for"), "{e}");
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();

    // Two exports: the device sleeps only once both are released.
    let (first, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    close_fds(&fds);
    let (second, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    close_fds(&fds);
    for release in [Some(first.event), None] {
        let physical = r.sim.physical_bytes(0);
        for level in [1, 2] {
            let e = r.device(0).sleep(level, &[]).unwrap_err().to_string();
            assert!(e.contains("shared with other processes"), "{e}");
        }
        assert_eq!(r.sim.physical_bytes(0), physical, "nothing given back");
        assert_eq!(r.device(0).sleeping_bytes(), 0, "awake");
        let more = r.malloc(MIB, 0, 1);
        r.free(more, 0);
        if let Some(event) = release {
            r.device(0).release_export(event).unwrap();
        }
    }
    r.device(0).release_export(second.event).unwrap();
    r.sim.complete_all();
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();

    // Freed with an export not released (against the protocol), the block no longer holds the
    // device awake, nor does a block allocated on its pages since.
    let (third, fds) = r.device(0).export_pages(ptr, s(1)).unwrap();
    close_fds(&fds);
    r.free(ptr, 0);
    r.sim.complete_all();
    let again = r.malloc(3 * MIB, 0, 1);
    assert_eq!(again, ptr, "on the same pages");
    r.device(0).sleep(1, &[]).unwrap();
    assert_eq!(r.sim.physical_bytes(0), 0, "its pages went back");
    assert!(r.device(0).sleeping_bytes() >= 3 * MIB);
    r.device(0).wake().unwrap();
    // That late release lowers no count of the block at the same address, exported since.
    let (fourth, fds) = r.device(0).export_pages(again, s(1)).unwrap();
    close_fds(&fds);
    r.device(0).release_export(third.event).unwrap();
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("shared with other processes"), "{e}");
    r.device(0).release_export(fourth.event).unwrap();
    r.sim.complete_all();
    r.device(0).sleep(1, &[]).unwrap();
    r.device(0).wake().unwrap();
    r.free(again, 0);
    r.finish();
}

/// With every block from a shareable CUDA pool (`STREAMPOOL_IPC=1`, `install(ipc=True)`) on the
/// vmm backend, sleep is refused naming that setting, not the backend already chosen.
#[test]
fn sleep_under_the_ipc_setting_says_that_the_setting_is_why() {
    let config = Config {
        backend: Backend::Vmm,
        ipc: true,
        ..base_config()
    };
    let r = rig_with(1, 256 * MIB, config);
    let ptr = r.malloc(MIB, 0, 1);
    let e = r.device(0).sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("STREAMPOOL_IPC=1"), "{e}");
    r.free(ptr, 0);
    r.finish();
}

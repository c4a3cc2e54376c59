//! A panic inside streampool while it holds a lock — the device allocator's, or the vmm
//! resource's — may leave their books half-updated (a block taken off one list and not yet put on
//! another). The device must then refuse further calls with a clear error, never go on serving
//! from those books (which could hand out the same memory twice). The panic is injected by the
//! test driver (`Wrapped::panic_at_event_record`): `cuEventRecord` is called with each lock held.
//! Each test failed before the fix: the device went on allocating after the panic.

#[path = "common/mod.rs"]
mod common;
#[path = "common/wrapped.rs"]
mod wrapped;

use common::MIB;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::{DeviceDriver, DevicePtr, Driver, Stream};
use streampool::units::SizeSpec;
use streampool::{Allocator, Config, Error, Result};
use wrapped::Wrapped;

const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

fn rig(config: Config) -> (Arc<Wrapped>, Allocator) {
    let w = Wrapped::new(2, 256 * MIB);
    let alloc = Allocator::new(w.clone() as Arc<dyn Driver>, config).unwrap();
    (w, alloc)
}

/// Runs `call` with `cuEventRecord` set to panic; it must panic.
fn panics(w: &Wrapped, call: impl FnOnce() -> Result<()>) {
    w.panic_at_event_record.store(true, Ordering::SeqCst);
    let outcome = catch_unwind(AssertUnwindSafe(call));
    assert!(outcome.is_err(), "the injected panic did not happen");
    assert!(!w.panic_at_event_record.load(Ordering::SeqCst));
}

fn disabled(result: Result<impl std::fmt::Debug>, part: &str) {
    match result {
        Err(e @ Error::Disabled { device: 0, .. }) => {
            let m = e.to_string();
            assert!(
                m.starts_with(
                    "device 0 is disabled after an internal error: a panic inside \
                     streampool's "
                ) && m.contains(part),
                "{m}"
            );
        }
        other => panic!("expected device 0 to be disabled, got {other:?}"),
    }
}

/// Every call that could hand out or take back memory on device 0 is refused; device 1 (its
/// blocks' record_stream too) and the statistics of both still work.
fn device_0_refuses_everything(alloc: &Allocator, live: DevicePtr, part: &str) {
    disabled(alloc.malloc(4096, 0, S1), part);
    disabled(alloc.malloc(8 * MIB, 0, S2), part);
    disabled(alloc.free(live, 0), part);
    disabled(alloc.record_stream(live, S2), part);
    disabled(alloc.device(0).unwrap().trim(0), part);
    disabled(alloc.device(0).unwrap().set_release_threshold(0), part);
    disabled(alloc.empty_cache(), part);
    assert!(
        alloc.device(0).unwrap().stats().is_ok(),
        "statistics stay readable"
    );
    let p = alloc.malloc(4096, 1, S1).unwrap();
    // record_stream asks each device for the block in turn: device 1's is found past device 0.
    alloc.record_stream(p, S2).unwrap();
    alloc.free(p, 1).unwrap();
}

/// The free of a block used on another stream records an event under the device lock.
#[test]
fn a_panic_under_the_device_lock_disables_the_device() {
    let (w, alloc) = rig(Config {
        backend: Backend::Pool,
        ..Config::default()
    });
    let live = alloc.malloc(4096, 0, S1).unwrap();
    let p = alloc.malloc(4096, 0, S1).unwrap();
    alloc.record_stream(p, S2).unwrap();
    panics(&w, || alloc.free(p, 0));
    device_0_refuses_everything(&alloc, live, "device allocator");
    // The block freed at the panic is lost with the device: no leak check at the end.
    std::mem::forget(alloc);
}

/// A free on the vmm backend gives its block back on the resource's fast path, inside the device's
/// lock section: a panic there (the fence it records) disables the device.
#[test]
fn a_panic_in_a_vmm_free_disables_the_device() {
    let (w, alloc) = rig(Config {
        backend: Backend::Vmm,
        background: false,
        ..Config::default()
    });
    let live = alloc.malloc(4096, 0, S1).unwrap();
    let large = alloc.malloc(8 * MIB, 0, S1).unwrap();
    panics(&w, || alloc.free(large, 0));
    device_0_refuses_everything(&alloc, live, "device allocator");
    std::mem::forget(alloc);
}

/// A vmm device whose resource a panic disabled under its own lock, the device itself not told
/// yet: `empty_cache` records the fences of the last frees under the vmm resource's lock (the
/// device lock is not held then). With a block still live.
fn vmm_resource_poisoned() -> (Allocator, DevicePtr) {
    let (w, alloc) = rig(Config {
        backend: Backend::Vmm,
        background: false,
        ..Config::default()
    });
    w.sim.stop_clock();
    let live = alloc.malloc(4096, 0, S1).unwrap();
    let a = alloc.malloc(8 * MIB, 0, S1).unwrap();
    let b = alloc.malloc(8 * MIB, 0, S1).unwrap();
    alloc.free(a, 0).unwrap(); // records S1's first fence
    alloc.free(b, 0).unwrap(); // the clock stands still: its fence is left pending
    panics(&w, || alloc.empty_cache());
    (alloc, live)
}

/// The resource refuses, and so does the device as a whole once the resource has said so.
#[test]
fn a_panic_under_the_vmm_resource_lock_disables_the_device() {
    let (alloc, live) = vmm_resource_poisoned();
    disabled(alloc.malloc(8 * MIB, 0, S1), "virtual-memory resource");
    device_0_refuses_everything(&alloc, live, "virtual-memory resource");
    std::mem::forget(alloc);
}

/// Whichever entry of the device first meets the disabled vmm resource — sleep, wake, peer
/// access, the sleep buffer, as well as those that trim — disables the device as a whole: a
/// later `record_stream`, which needs only the device's own books, is refused too.
#[test]
fn every_device_entry_that_meets_a_disabled_resource_disables_the_device() {
    type Entry = fn(&streampool::DeviceAllocator) -> Result<()>;
    let entries: [(&str, Entry); 5] = [
        ("sleep", |d| d.sleep(1, &[]).map(|_| ())),
        ("wake", |d| d.wake().map(|_| ())),
        ("enable_peer_access", |d| d.enable_peer_access()),
        ("reserve_sleep_buffer", |d| {
            d.reserve_sleep_buffer(0).map(|_| ())
        }),
        ("trim", |d| d.trim(0)),
    ];
    for (name, entry) in entries {
        let (alloc, live) = vmm_resource_poisoned();
        let device = alloc.device(0).unwrap();
        disabled(entry(device), "virtual-memory resource");
        match alloc.record_stream(live, S2) {
            Err(Error::Disabled { device: 0, .. }) => {}
            other => panic!("after {name}: expected device 0 disabled, got {other:?}"),
        }
        std::mem::forget(alloc);
    }
}

/// The synchronisation hook (`streampool_synchronized`, at every `torch.cuda.synchronize()`)
/// has nothing to settle on a disabled device or resource: it returns quietly, so that a
/// training loop is not warned at every step, and the next allocation says why.
#[test]
fn the_synchronisation_hook_is_quiet_on_a_disabled_device() {
    let (alloc, live) = vmm_resource_poisoned();
    assert!(
        alloc.device(0).unwrap().synchronized().is_ok(),
        "resource disabled"
    );
    disabled(alloc.malloc(8 * MIB, 0, S1), "virtual-memory resource");
    assert!(
        alloc.device(0).unwrap().synchronized().is_ok(),
        "device disabled"
    );
    disabled(alloc.record_stream(live, S2), "virtual-memory resource");
    std::mem::forget(alloc);
}

/// The background thread's look leaves a disabled device as it is: its books may be
/// half-updated (a block they show cached may be live), so nothing of it goes back — neither at
/// the idle release (which the pool backend shows: its cache) nor at the release threshold's
/// (the vmm backend's, with a threshold of 0: its idle page, unused for over a second).
#[test]
fn the_background_look_leaves_a_disabled_device_as_it_is() {
    for backend in [Backend::Pool, Backend::Vmm] {
        let (w, alloc) = rig(Config {
            backend,
            background: false,
            idle_release_ms: Some(50),
            release_threshold: SizeSpec::Bytes(0),
            ..Config::default()
        });
        let live = alloc.malloc(4096, 0, S1).unwrap();
        let freed = alloc.malloc(8 * MIB, 0, S1).unwrap();
        let p = alloc.malloc(8 * MIB, 0, S1).unwrap();
        alloc.free(freed, 0).unwrap(); // cached, or idle in the resource: releasable
        alloc.record_stream(p, S2).unwrap();
        panics(&w, || alloc.free(p, 0));
        let free_bytes = || w.sim.mem_info(0).unwrap().free_bytes;
        let before = free_bytes();
        for _ in 0..3 {
            w.sim.complete_all(); // the streams' work is done: only the disabling holds it
            alloc.tend();
            w.sim.advance_clock_ms(1100);
        }
        assert_eq!(free_bytes(), before, "{backend:?}: memory went back");
        device_0_refuses_everything(&alloc, live, "device allocator");
        std::mem::forget(alloc);
    }
}

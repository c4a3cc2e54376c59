//! The contract under driver faults: every driver call the simulator can fail is made to fail,
//! at every step of a short workload in turn; the resource may report the error, but it must
//! not panic, half-do the call that failed, become unusable afterwards, or leak.
//!
//! Invariant: the list of faults is every [`SimFault`] (a new one fails to compile here until it
//! is listed).

use super::rig::{Rig, S, T, U};
use super::{simulator, Factory};
use crate::driver::sim::{SimDriver, SimFault};
use crate::driver::{DevicePtr, Stream};

/// Every fault the simulator can inject.
const FAULTS: [SimFault; 18] = [
    SimFault::PoolCreate,
    SimFault::PoolSetAttr,
    SimFault::Alloc,
    SimFault::Free,
    SimFault::EventCreate,
    SimFault::EventRecord,
    SimFault::StreamWait,
    SimFault::Synchronize,
    SimFault::StreamSynchronize,
    SimFault::AddressReserve,
    SimFault::MemCreate,
    SimFault::MemMap,
    SimFault::MemUnmap,
    SimFault::MemRelease,
    SimFault::SetAccess,
    SimFault::HostAlloc,
    SimFault::Copy,
    SimFault::MemExport,
];

/// Fails to compile when a fault is added to the simulator and not to [`FAULTS`].
const _: fn(SimFault) = |fault| match fault {
    SimFault::PoolCreate
    | SimFault::PoolSetAttr
    | SimFault::Alloc
    | SimFault::Free
    | SimFault::EventCreate
    | SimFault::EventRecord
    | SimFault::StreamWait
    | SimFault::Synchronize
    | SimFault::StreamSynchronize
    | SimFault::AddressReserve
    | SimFault::MemCreate
    | SimFault::MemMap
    | SimFault::MemUnmap
    | SimFault::MemRelease
    | SimFault::SetAccess
    | SimFault::HostAlloc
    | SimFault::Copy
    | SimFault::MemExport => {}
};

/// Takes every injection still pending, so that what follows runs without faults.
fn clear_faults(sim: &SimDriver) {
    for fault in FAULTS {
        while sim.take_injected(fault) {}
    }
}

pub(super) fn a_failed_creation_leaks_nothing(make: Factory) {
    for fault in FAULTS {
        let sim = simulator();
        sim.inject_fault(fault, 1);
        // Made or not, nothing may leak: the rig's end (or the simulator's drop) checks.
        if let Ok(rig) = Rig::on(sim.clone(), make) {
            clear_faults(&sim);
            drop(sim);
            rig.finish();
        }
    }
}

/// The steps of the workload: allocations of both kinds of size on three streams, frees whose
/// memory other streams then ask for, a synchronisation, a trim.
const STEPS: usize = 10;

/// A block of `bytes` on `stream`, or none if the allocation failed (only `tolerant`, and then
/// without changing what is in use).
fn alloc(rig: &mut Rig, bytes: u64, stream: Stream, tolerant: bool) -> Option<DevicePtr> {
    let used = rig.usage().used_bytes;
    match rig.try_alloc(bytes, stream) {
        Ok(ptr) => Some(ptr),
        Err(e) if tolerant => {
            let label = rig.label();
            assert_eq!(
                rig.usage().used_bytes,
                used,
                "{label}: a failed allocation: {e}"
            );
            None
        }
        Err(e) => panic!("{}: {bytes} B on {stream:#x}: {e}", rig.label()),
    }
}

/// Gives `ptr` back if it is live; a failure (only `tolerant`) leaves it live.
fn free(rig: &mut Rig, ptr: Option<DevicePtr>, tolerant: bool) {
    let Some(ptr) = ptr.filter(|p| rig.live.iter().any(|b| b.ptr == *p)) else {
        return;
    };
    if let Err(e) = rig.try_free(ptr) {
        assert!(tolerant, "{}: freeing {ptr:#x}: {e}", rig.label());
    }
}

/// Runs step `step`; `blocks` are the workload's blocks in the order asked for (`None` where an
/// allocation failed). With `tolerant`, a step may fail with an error (a fault was injected);
/// otherwise every step must succeed.
fn step(rig: &mut Rig, step: usize, blocks: &mut Vec<Option<DevicePtr>>, tolerant: bool) {
    let label = rig.label();
    match step {
        0 => blocks.push(alloc(rig, 4096, S, tolerant)),
        1 => blocks.push(alloc(rig, 3 << 20, S, tolerant)),
        2 => free(rig, blocks.first().copied().flatten(), tolerant),
        3 => blocks.push(alloc(rig, 4096, T, tolerant)),
        4 => free(rig, blocks.get(1).copied().flatten(), tolerant),
        5 => blocks.push(alloc(rig, 5 << 20, T, tolerant)),
        6 => {
            if let Err(e) = rig.driver.synchronize(0) {
                assert!(tolerant, "{label}: {e}");
            }
        }
        7 => {
            if let Err(e) = rig.resource.trim(0) {
                assert!(tolerant, "{label}: trim: {e}");
            }
        }
        8 => blocks.push(alloc(rig, 3 << 20, U, tolerant)),
        _ => {
            for b in rig.live.clone() {
                free(rig, Some(b.ptr), tolerant);
            }
        }
    }
    rig.check_usage();
}

pub(super) fn driver_faults_leave_it_usable_and_leak_nothing(make: Factory) {
    for fault in FAULTS {
        for at in 0..STEPS {
            let mut rig = Rig::new(make);
            let mut blocks = Vec::new();
            for s in 0..at {
                step(&mut rig, s, &mut blocks, false);
            }
            rig.sim.inject_fault(fault, 1);
            for s in at..STEPS {
                step(&mut rig, s, &mut blocks, true);
            }
            clear_faults(&rig.sim);
            // Usable again: what failed to go back goes back now, and the workload runs whole.
            rig.free_all();
            rig.sync();
            rig.resource.trim(0).unwrap();
            let mut blocks = Vec::new();
            for s in 0..STEPS {
                step(&mut rig, s, &mut blocks, false);
            }
            rig.finish();
        }
    }
}

//! Peer access between devices' pools (`STREAMPOOL_PEER_ACCESS`, `enable_peer_access`).

mod common;
use common::*;
use streampool::config::PeerAccess;
use streampool::driver::PoolHandle;
use streampool::Config;

const POOL: PoolHandle = PoolHandle(0); // each simulated device's first pool

fn rig_peers(devices: usize, mode: PeerAccess) -> Rig {
    let config = Config {
        peer_access: mode,
        ..Config::default()
    };
    rig_with(devices, 64 * MIB, config)
}

fn touch(rig: &Rig, device: i64) {
    let p = rig.alloc.malloc(MIB, device, 0).unwrap();
    rig.alloc.free(p, device).unwrap();
}

#[test]
fn auto_grants_between_the_devices_a_process_allocates_on() {
    let rig = rig_peers(3, PeerAccess::Auto);
    touch(&rig, 0);
    assert!(
        rig.sim.pool_peers(0, POOL).is_empty(),
        "one device: nothing to grant"
    );
    touch(&rig, 2);
    assert_eq!(rig.sim.pool_peers(0, POOL), [2]);
    assert_eq!(rig.sim.pool_peers(2, POOL), [0]);
    touch(&rig, 1);
    assert_eq!(rig.sim.pool_peers(0, POOL), [2, 1]);
    assert_eq!(rig.sim.pool_peers(1, POOL), [0, 2]);
    assert_eq!(rig.sim.pool_peers(2, POOL), [0, 1]);
    rig.finish();
}

#[test]
fn on_grants_every_device_and_off_none() {
    let rig = rig_peers(3, PeerAccess::On);
    touch(&rig, 1);
    assert_eq!(rig.sim.pool_peers(1, POOL), [0, 2]);
    rig.finish();
    let rig = rig_peers(3, PeerAccess::Off);
    touch(&rig, 0);
    touch(&rig, 1);
    assert!(rig.sim.pool_peers(0, POOL).is_empty());
    assert!(rig.sim.pool_peers(1, POOL).is_empty());
    rig.finish();
}

#[test]
fn an_incapable_peer_is_a_clear_error_and_the_others_are_still_granted() {
    let rig = rig_peers(3, PeerAccess::Off);
    rig.sim.set_peer_incapable(0, 1);
    let e = rig.alloc.enable_peer_access(0).unwrap_err().to_string();
    assert!(
        e.contains("device 1 cannot access memory on device 0")
            && e.contains("cuDeviceCanAccessPeer"),
        "{e}"
    );
    assert_eq!(rig.sim.pool_peers(0, POOL), [2]);
    rig.alloc.enable_peer_access(-1).unwrap_err();
    assert_eq!(rig.sim.pool_peers(1, POOL), [0, 2]);
    assert!(rig.alloc.enable_peer_access(3).is_err());
    assert!(rig.alloc.enable_peer_access(-2).is_err());
    // In auto mode the incapable pair is skipped and allocation goes on.
    touch(&rig, 0);
    rig.finish();
    let rig = rig_peers(2, PeerAccess::Auto);
    rig.sim.set_peer_incapable(1, 0);
    touch(&rig, 0);
    touch(&rig, 1);
    assert_eq!(rig.sim.pool_peers(0, POOL), [1]);
    assert!(rig.sim.pool_peers(1, POOL).is_empty());
    rig.finish();
}

#[test]
fn one_device_has_no_peers_to_grant() {
    let rig = rig_peers(1, PeerAccess::On);
    touch(&rig, 0);
    rig.alloc.enable_peer_access(0).unwrap();
    assert!(rig.sim.pool_peers(0, POOL).is_empty());
    rig.finish();
}

#[test]
fn devices_the_receiver_uses_get_access_to_an_imported_pool() {
    use streampool::ipc::{begin_shareable, end_shareable};
    // Here one process exports and imports; the simulator hands back the exporting pool itself.
    let rig = rig_peers(3, PeerAccess::Auto);
    begin_shareable();
    let ptr = rig.alloc.malloc(MIB, 0, 0).unwrap();
    end_shareable().unwrap();
    let shared_pool = PoolHandle(1); // device 0: main pool 0, shareable pool 1
    let handle = rig.alloc.ipc_export(ptr, 0, 0).unwrap();
    touch(&rig, 1); // the receiver allocates on device 1 before importing ...
    rig.alloc.ipc_import_pool(0, handle.pool_fd).unwrap();
    assert_eq!(rig.sim.pool_peers(0, shared_pool), [1]);
    touch(&rig, 2); // ... and on device 2 after
    assert_eq!(rig.sim.pool_peers(0, shared_pool), [1, 2]);
    rig.alloc.ipc_import_pool(0, handle.pool_fd).unwrap(); // again: nothing new to grant
    assert_eq!(rig.sim.pool_peers(0, shared_pool), [1, 2]);
    rig.alloc.ipc_release_export(0, handle.event).unwrap();
    rig.alloc.free(ptr, 0).unwrap();
    rig.finish();
}

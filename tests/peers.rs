//! Peer access between devices' pools (`STREAMPOOL_PEER_ACCESS`, `enable_peer_access`). Pools are
//! found by what they are — the device's own pools in creation order, its shareable pool, a pool
//! another allocator imported — never by handle number: with the small-block pool, handle 1 is
//! no longer the shareable pool.

mod common;
use common::*;
use std::sync::Arc;
use streampool::config::PeerAccess;
use streampool::driver::sim::SimDriver;
use streampool::driver::Driver;
use streampool::ipc::{begin_shareable, end_shareable};
use streampool::{Allocator, Config};

fn peer_config(mode: PeerAccess) -> Config {
    Config {
        peer_access: mode,
        ..common::pool_config()
    }
}

fn rig_peers(devices: usize, mode: PeerAccess) -> Rig {
    rig_with(devices, 64 * MIB, peer_config(mode))
}

fn touch(rig: &Rig, device: i64) {
    let p = rig.malloc(MIB, device, 0);
    rig.free(p, device);
}

impl Rig {
    /// The peers of each of `device`'s own pools (main, small-block); they must agree.
    fn own_peers(&self, device: usize) -> Vec<usize> {
        let pools = self.own_pools(device);
        assert_eq!(
            pools.len(),
            2,
            "device {device}: main and small-block pools"
        );
        assert_eq!(pools[0].peers, pools[1].peers, "device {device}: {pools:?}");
        pools[0].peers.clone()
    }
}

#[test]
fn auto_grants_between_the_devices_a_process_allocates_on() {
    let rig = rig_peers(3, PeerAccess::Auto);
    touch(&rig, 0);
    assert!(rig.own_peers(0).is_empty(), "one device: nothing to grant");
    touch(&rig, 2);
    assert_eq!(rig.own_peers(0), [2]);
    assert_eq!(rig.own_peers(2), [0]);
    touch(&rig, 1);
    assert_eq!(rig.own_peers(0), [2, 1]);
    assert_eq!(rig.own_peers(1), [0, 2]);
    assert_eq!(rig.own_peers(2), [0, 1]);
    rig.finish();
}

#[test]
fn on_grants_every_device_and_off_none() {
    let rig = rig_peers(3, PeerAccess::On);
    touch(&rig, 1);
    assert_eq!(rig.own_peers(1), [0, 2]);
    rig.finish();
    let rig = rig_peers(3, PeerAccess::Off);
    touch(&rig, 0);
    touch(&rig, 1);
    assert!(rig.own_peers(0).is_empty());
    assert!(rig.own_peers(1).is_empty());
    rig.finish();
}

#[test]
fn an_incapable_peer_is_a_clear_error_and_the_others_are_still_granted() {
    let rig = rig_peers(3, PeerAccess::Off);
    rig.sim.set_peer_incapable(0, 1);
    let e = rig.alloc.enable_peer_access(0).unwrap_err().to_string();
    assert!(
        e.contains("device 1 cannot access memory on device 0")
            && e.contains("cuDeviceCanAccessPeer")
            && e.contains("access to device 0's pool"),
        "{e}"
    );
    assert_eq!(rig.own_peers(0), [2]);
    assert!(
        rig.live_pools(1).is_empty(),
        "only device 0's pools: device 1 still has none"
    );
    rig.alloc.enable_peer_access(-1).unwrap_err();
    assert_eq!(rig.own_peers(1), [0, 2]);
    assert!(rig.alloc.enable_peer_access(3).is_err());
    assert!(rig.alloc.enable_peer_access(-2).is_err());
    // In auto mode the incapable pair is skipped and allocation goes on.
    touch(&rig, 0);
    rig.finish();
    let rig = rig_peers(2, PeerAccess::Auto);
    rig.sim.set_peer_incapable(1, 0);
    touch(&rig, 0);
    touch(&rig, 1);
    assert_eq!(rig.own_peers(0), [1]);
    assert!(rig.own_peers(1).is_empty());
    rig.finish();
}

#[test]
fn one_device_has_no_peers_to_grant() {
    let rig = rig_peers(1, PeerAccess::On);
    touch(&rig, 0);
    rig.alloc.enable_peer_access(0).unwrap();
    rig.alloc.enable_peer_access(-1).unwrap(); // every device
    assert!(rig.own_peers(0).is_empty());
    rig.finish();
}

#[test]
fn a_peer_touches_pool_memory_only_once_granted() {
    // Not strict: the refused touch is an error to check, not a panic.
    let sim = Arc::new(SimDriver::new(2, 64 * MIB));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, peer_config(PeerAccess::Off));
    let alloc = alloc.unwrap();
    let p = alloc.malloc(MIB, 0, s(0)).unwrap();
    sim.touch(0, 0, p, MIB, s(0)).unwrap();
    let e = sim.touch(0, 1, p, MIB, s(0)).unwrap_err().to_string();
    assert!(e.contains("device 1 has no access"), "{e}");
    alloc.enable_peer_access(0).unwrap();
    sim.touch(0, 1, p, MIB, s(0)).unwrap();
    alloc.free(p, 0).unwrap();
    alloc.empty_cache().unwrap();
    sim.complete_all();
    assert_eq!(sim.outstanding_bytes(), 0);
}

/// The importing process's devices get access to a pool it imports. Two allocators over one
/// simulator stand for two processes: the exporter grants no one (`Off`), so every grant seen on
/// the pool is the importer's. Fails if imported pools are never granted to peers.
#[test]
fn devices_the_importer_uses_get_access_to_an_imported_pool() {
    let rig = rig_peers(3, PeerAccess::Off);
    let importer = Allocator::new(
        rig.sim.clone() as Arc<dyn Driver>,
        peer_config(PeerAccess::Auto),
    )
    .unwrap();
    begin_shareable().unwrap();
    let ptr = rig.malloc(MIB, 0, 0);
    end_shareable().unwrap();
    let handle = rig.alloc.device(0).unwrap().export(ptr, s(0)).unwrap();
    assert!(
        rig.shareable_pool(0).peers.is_empty(),
        "the exporter grants none"
    );
    let p1 = importer.malloc(MIB, 1, s(0)).unwrap(); // allocates on device 1 before importing ...
    let token = importer.ipc_import_pool(0, handle.pool_fd).unwrap();
    assert_eq!(rig.shareable_pool(0).peers, [1]);
    let p2 = importer.malloc(MIB, 2, s(0)).unwrap(); // ... and on device 2 after
    assert_eq!(rig.shareable_pool(0).peers, [1, 2]);
    assert_eq!(importer.ipc_import_pool(0, handle.pool_fd).unwrap(), token);
    assert_eq!(
        rig.shareable_pool(0).peers,
        [1, 2],
        "imported again: nothing new to grant"
    );
    let imported = importer.ipc_import(token, &handle, s(0)).unwrap();
    importer.ipc_close(imported, s(0)).unwrap();
    importer.free(p1, 1).unwrap();
    importer.free(p2, 2).unwrap();
    importer.empty_cache().unwrap();
    drop(importer);
    rig.alloc
        .device(0)
        .unwrap()
        .release_export(handle.event)
        .unwrap();
    rig.free(ptr, 0);
    rig.finish();
}

//! Access to one device's pool from other devices: `STREAMPOOL_PEER_ACCESS` and
//! `streampool_enable_peer_access`.
//!
//! Pool memory ignores `cuCtxEnablePeerAccess`, and PyTorch's pluggable path copies between
//! devices with a plain `cudaMemcpyAsync`, which needs the destination's and the source's pools
//! to be accessible from the copying device. So access is granted per pool, with
//! `cuMemPoolSetAccess`.
//!
//! Invariants: access is only ever granted, never revoked (CUDA cannot revoke it); a device is
//! granted access only after `cuDeviceCanAccessPeer` says it can have it; a resource's own device
//! is never granted here (CUDA rejects changing a pool owner's access; the virtual-memory
//! resource gives its device access itself); a failed grant never makes memory unusable by its
//! own device. Pools imported from other processes follow the same mode for the devices of the
//! importing process.

use crate::config::PeerAccess;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::resource::Accessible;
use parking_lot::Mutex;
use std::sync::Arc;

/// Memory of a device that peers may be given access to.
type Target = Arc<dyn Accessible>;

/// The resources created so far, and the configured policy.
pub struct Peers {
    mode: PeerAccess,
    /// Each device's own resources (for large and small blocks), once created.
    pools: Mutex<Vec<Vec<Target>>>,
    /// Memory other than the devices' own, with its device: pools imported from other
    /// processes, or the shareable pools of `streampool.shareable()`.
    extra: Mutex<Vec<(usize, Target)>>,
}

impl Peers {
    pub fn new(mode: PeerAccess, device_count: usize) -> Peers {
        Peers {
            mode,
            pools: Mutex::new(vec![Vec::new(); device_count]),
            extra: Mutex::new(Vec::new()),
        }
    }

    /// Called once `device`'s resources exist: grants what the mode asks for. A pair that cannot
    /// be granted is logged, not returned: the resources serve their own device either way.
    pub fn pools_created(&self, driver: &dyn Driver, device: usize, own: &[Target]) {
        let grants: Vec<(usize, Target, usize)> = {
            let mut pools = self.pools.lock();
            pools[device] = own.to_vec();
            let count = pools.len();
            match self.mode {
                PeerAccess::Off => Vec::new(),
                PeerAccess::On => (0..count)
                    .filter(|&peer| peer != device)
                    .flat_map(|peer| own.iter().map(move |pool| (device, Arc::clone(pool), peer)))
                    .collect(),
                // Both directions between this device and every device already allocated on,
                // and this device to the extra pools of other devices.
                PeerAccess::Auto => {
                    let mut grants = Vec::new();
                    for (other, theirs) in pools.iter().enumerate() {
                        if other != device && !theirs.is_empty() {
                            grants.extend(own.iter().map(|p| (device, Arc::clone(p), other)));
                            grants.extend(theirs.iter().map(|p| (other, Arc::clone(p), device)));
                        }
                    }
                    let extra = self.extra.lock();
                    let imported = extra.iter().filter(|(owner, _)| *owner != device);
                    grants.extend(imported.map(|(owner, p)| (*owner, Arc::clone(p), device)));
                    grants
                }
            }
        };
        self.apply(driver, grants);
    }

    /// Called for a pool of `device` other than its own (imported from another process, or the
    /// shareable pool): the devices the mode names get access to it too, so copies from its
    /// memory to them work.
    pub fn extra_pool(&self, driver: &dyn Driver, device: usize, pool: Target) {
        let grants: Vec<(usize, Target, usize)> = {
            self.extra.lock().push((device, Arc::clone(&pool)));
            let pools = self.pools.lock();
            let peers = (0..pools.len()).filter(|&peer| peer != device);
            match self.mode {
                PeerAccess::Off => Vec::new(),
                PeerAccess::On => peers
                    .map(|peer| (device, Arc::clone(&pool), peer))
                    .collect(),
                PeerAccess::Auto => peers
                    .filter(|&peer| !pools[peer].is_empty())
                    .map(|peer| (device, Arc::clone(&pool), peer))
                    .collect(),
            }
        };
        self.apply(driver, grants);
    }

    /// Grants each (owner, memory, peer); a pair that cannot be granted is logged.
    fn apply(&self, driver: &dyn Driver, grants: Vec<(usize, Target, usize)>) {
        for (owner, target, peer) in grants {
            match grant(driver, owner, target.as_ref(), peer) {
                Ok(()) => log::info!(
                    "device {peer} can now access device {owner}'s {}",
                    target.label()
                ),
                Err(e) if self.mode == PeerAccess::Auto => log::info!("{e}"),
                Err(e) => log::warn!("STREAMPOOL_PEER_ACCESS=1: {e}"),
            }
        }
    }

    /// Grants every other device access to `device`'s `own` resources. Every capable peer is
    /// granted; the first pair that could not be is the error.
    pub fn grant_all(&self, driver: &dyn Driver, device: usize, own: &[Target]) -> Result<()> {
        let count = self.pools.lock().len();
        (0..count)
            .filter(|&peer| peer != device)
            .flat_map(|peer| own.iter().map(move |target| (peer, target)))
            .map(|(peer, target)| grant(driver, device, target.as_ref(), peer))
            .fold(Ok(()), Result::and)
    }
}

/// Lets `peer` read and write all of `owner`'s `target`, after checking that it can.
fn grant(driver: &dyn Driver, owner: usize, target: &dyn Accessible, peer: usize) -> Result<()> {
    if !driver.can_access_peer(owner, peer)? {
        return Err(Error::InvalidArgument(format!(
            "device {peer} cannot access memory on device {owner}: cuDeviceCanAccessPeer reports \
             no peer path between them (no NVLink or PCIe peer-to-peer), so device {peer} cannot \
             be granted access to device {owner}'s {}",
            target.label()
        )));
    }
    target.grant_access(peer)
}

//! Peer access on the simulator: which device may use another's memory (all pairs but those
//! a test marks incapable) and grants on a pool.
//!
//! Invariant: as CUDA, a device is never its own peer, the owner's access cannot be changed,
//! and access is granted only to a capable peer.

use super::{driver_error, pools, SimDriver};
use crate::driver::{PeerDriver, PoolHandle};
use crate::error::Result;

impl PeerDriver for SimDriver {
    fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool> {
        if peer >= self.devices.len() {
            return Err(driver_error(
                "cuDeviceGet",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            ));
        }
        drop(self.device(device, "cuDeviceCanAccessPeer")?);
        Ok(peer != device && !self.peer_incapable.lock().contains(&(device, peer)))
    }

    fn pool_grant_access(&self, device: usize, pool: PoolHandle, peer: usize) -> Result<()> {
        // As CUDA: the owner's access cannot be changed, and a peer must be capable.
        if !self.can_access_peer(device, peer)? {
            return Err(driver_error(
                "cuMemPoolSetAccess",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            ));
        }
        let mut d = self.device(device, "cuMemPoolSetAccess")?;
        let peers = &mut pools::get_mut(&mut d, pool, "cuMemPoolSetAccess")?.peers;
        if !peers.contains(&peer) {
            peers.push(peer);
        }
        Ok(())
    }
}

//! Sources added to the device's table at run time, and removed again (the seam for per-pool
//! sources such as CUDA graph pools): a removed source serves no new block, and its blocks still
//! go back to it — live ones when they are freed, cached and waiting ones when they leave — so it
//! leaves the table, and its id becomes free, only once the last of them is back.
//!
//! Invariant: a removed source's resource is dropped outside the device lock (dropping one may
//! call the driver).

use super::DeviceAllocator;
use crate::error::Result;
use crate::resource::{Resource, SourceId};
use std::sync::Arc;

impl DeviceAllocator {
    /// Adds `resource` to the device's sources (created first if need be); its id.
    pub(crate) fn add_source(&self, resource: Arc<dyn Resource>) -> Result<SourceId> {
        self.setup()?;
        Ok(self.lock_enabled()?.ledger.sources_mut().add(resource))
    }

    /// Removes source `id`: it serves no new block, and leaves once no block of it is held.
    pub(crate) fn remove_source(&self, id: SourceId) -> Result<()> {
        let gone = self.lock_enabled()?.ledger.sources_mut().remove(id)?;
        drop(gone);
        Ok(())
    }
}

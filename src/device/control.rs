//! The device's knobs and views: release threshold, peak reset, peer access, statistics, the
//! blocks it holds, the timeline's starting point, trims.
//!
//! Invariant: a view reads the ledger under the device lock and the resources' own accounting
//! outside it; nothing here changes what is allocated.

use super::DeviceAllocator;
use crate::error::Result;
use crate::history::StreampoolBlock;
use crate::resource::{peer_target, Accessible, Resources};
use crate::stats::{DeviceFigures, StreampoolStats};
use std::sync::Arc;

impl DeviceAllocator {
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.check_enabled()?;
        self.resources()?
            .for_each(|r| match r.capabilities().release_threshold {
                Some(threshold) => threshold.set_release_threshold(bytes),
                None => Ok(()),
            })
    }

    /// The device's memory, read once.
    pub fn device_total_bytes(&self) -> Result<u64> {
        match self.provisioned.get() {
            Some(p) => Ok(p.total_bytes),
            None => Ok(self.driver.mem_info(self.device)?.total_bytes),
        }
    }

    pub fn stats(&self) -> Result<StreampoolStats> {
        let (counters, cached_bytes) = {
            let st = self.state.lock();
            (st.ledger.counters().clone(), st.ledger.cached_bytes())
        };
        let (usage, driver_counts) = match self.provisioned.get() {
            Some(p) => (p.resources.usage_with_peaks()?, p.resources.driver_counts()),
            None => Default::default(),
        };
        Ok(StreampoolStats::assemble(DeviceFigures {
            counters: &counters,
            cached_bytes,
            usage,
            shareable: self.exporter.usage()?,
            limit_bytes: self.limit.bytes(),
            driver_counts,
            device_total_bytes: self.device_total_bytes()?,
        }))
    }

    pub fn reset_peak_stats(&self) -> Result<()> {
        self.state.lock().ledger.counters_mut().reset_peaks();
        match self.provisioned.get() {
            Some(p) => p.resources.for_each(|r| match r.capabilities().statistics {
                Some(statistics) => statistics.reset_peaks(),
                None => Ok(()),
            }),
            None => Ok(()),
        }
    }

    /// Grants every other device access to this device's resources (see [`Peers::grant_all`]).
    pub fn enable_peer_access(&self) -> Result<()> {
        let own: Vec<Arc<dyn Accessible>> =
            self.resources()?.all().filter_map(peer_target).collect();
        self.peers
            .grant_all(self.driver.as_ref(), self.device, &own)
    }

    /// The blocks this device holds from its resources (for `dump_snapshot`).
    pub fn blocks(&self) -> Vec<StreampoolBlock> {
        let st = self.state.lock();
        st.ledger.blocks(self.device, st.waits.blocks())
    }

    /// The resources' reserved bytes, read only while the timeline is recording.
    pub(super) fn reserved_for_timeline(&self, resources: &Resources) -> Option<u64> {
        self.recorder
            .enabled()
            .then(|| resources.reserved_bytes().ok())
            .flatten()
    }

    /// Called when the timeline starts: its gauges begin at the device's current values (events
    /// of a resource, such as mappings, carry them until the device's next event).
    pub fn start_timeline(&self) {
        if let Some(p) = self.provisioned.get() {
            if let Some(reserved_bytes) = self.reserved_for_timeline(&p.resources) {
                self.recorder.set_reserved(reserved_bytes);
            }
        }
        self.recorder.set_last(self.state.lock().ledger.gauges());
    }

    /// Returns the cache, synchronises and trims each resource to `keep_bytes`.
    pub fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.resources()?;
        self.flush(keep_bytes)
    }
}

//! The device's set-up on its first use: its sources created from the settings for its memory
//! (in relaxed capture mode), peer access granted as the mode says, the ledger given its sources
//! and cache, the background thread told.
//!
//! Invariant: the set-up runs once per device (under `creating`; a racing first use waits and
//! takes the same set-up), and a failure leaves no set-up, so that a later call tries again.

use super::DeviceAllocator;
use super::DeviceSetup;
use crate::cache::Cache;
use crate::error::Result;
use crate::resource::{peer_target, Accessible};
use std::sync::{Arc, Weak};

impl DeviceAllocator {
    /// [`DeviceAllocator::setup`] on the device's first use (or a race to it).
    #[cold]
    #[inline(never)]
    pub(super) fn first_setup(&self) -> Result<&DeviceSetup> {
        let _creating = self.creating.lock();
        if let Some(setup) = self.setup.get() {
            return Ok(setup);
        }
        // In relaxed capture mode: a first allocation may come during a capture (in global mode,
        // maybe on another thread), which the set-up's queries and reservations must not disturb.
        let mut made = None;
        self.driver.relaxed_capture(&mut || {
            let total_bytes = self.driver.mem_info(self.device)?.total_bytes;
            let settings = self.settings.for_device(total_bytes);
            let provision = crate::resource::provision(
                &self.driver,
                self.device,
                &settings.sources,
                total_bytes,
                self.limit.shared(),
                &self.recorder,
            )?;
            made = Some((total_bytes, settings, provision));
            Ok(())
        })?;
        let (total_bytes, settings, provision) =
            made.ok_or_else(|| crate::Error::Internal("the device's set-up did not run".into()))?;
        let own = provision.sources.own();
        let targets: Vec<Arc<dyn Accessible>> = own.iter().filter_map(peer_target).collect();
        self.peers
            .pools_created(self.driver.as_ref(), self.device, &targets);
        log::info!(
            "device {}: the {} backend serves it",
            self.device,
            provision.backend.name()
        );
        // (The virtual-memory resource's blocks are never cached: it reuses and coalesces freed
        // blocks itself, a trait of the resource.)
        let max_block_bytes = settings.cache_max_block_bytes;
        let limit_bytes = settings.cache_limit_bytes;
        // Only the sources and the cache: the counters may already hold an out-of-memory error
        // (a request above the maximum is refused without creating the sources).
        self.state
            .lock()
            .ledger
            .provision(provision.sources, Cache::new(limit_bytes, max_block_bytes));
        let background = settings.background;
        let setup = self.setup.get_or_init(|| DeviceSetup {
            total_bytes,
            settings,
            own,
        });
        if background {
            crate::background::register(self.me.clone() as Weak<dyn crate::background::Tended>);
        }
        Ok(setup)
    }
}

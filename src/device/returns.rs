//! The way back: blocks whose streams are done are collected from the waits, kept in the cache
//! or sent home to their resource (or the driver), and `flush` (`empty_cache`, trim) returns
//! everything and trims the resources.
//!
//! Invariants: a block leaves the ledger before it is sent home and comes back onto them (as
//! unreturned, held) if the driver refuses it, so no failure loses memory; sending home happens
//! outside the device lock; a flush during a capture neither waits nor trims.

use super::ledger::{FreedBlock, Home};
use super::{DeviceAllocator, DeviceState};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::SizeClass;
use crate::sync::MutexGuard;

impl DeviceAllocator {
    pub(super) fn keep_or_send_home(
        &self,
        mut st: MutexGuard<'_, DeviceState>,
        block: FreedBlock,
    ) -> Result<()> {
        if !st.ledger.cacheable(&block) {
            // Straight home (a large block of the vmm backend, which reuses it itself): no
            // list to build.
            st.ledger.release(&block);
            drop(st);
            return self.send_one_home(block);
        }
        let mut homeless = Vec::new();
        st.ledger
            .keep(block, &mut homeless, |bytes| self.home_of(bytes));
        if homeless.is_empty() {
            return Ok(());
        }
        drop(st);
        self.send_home(homeless)
    }

    /// Hands back the blocks whose streams are done (forgetting captures that ended); those the
    /// cache does not keep, and those it evicts for them, are added to `homeless`, to be sent
    /// home once the lock is released.
    pub(super) fn collect_waits(&self, st: &mut DeviceState, homeless: &mut Vec<FreedBlock>) {
        for w in st.waits.collect(self.driver.as_ref(), self.device) {
            st.ledger.deactivate(w.requested_bytes);
            st.ledger
                .keep(w.block, homeless, |bytes| self.home_of(bytes));
        }
    }

    /// Where a cached block of `block_bytes` goes back to (cached blocks exist only once the
    /// resources do).
    fn home_of(&self, block_bytes: u64) -> Home {
        match self.provisioned.get() {
            Some(p) => Home::of(p.resources.class_of(block_bytes)),
            None => Home::Large,
        }
    }

    /// Sends blocks home — to their resource, the shareable pool or the driver — on their own
    /// streams; they already left `held_bytes`. A block the driver refuses stays on the ledger
    /// for the next flush to retry; the first error is returned.
    pub(super) fn send_home(&self, blocks: Vec<FreedBlock>) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let shareable = blocks
            .iter()
            .any(|b| b.home == Home::Shareable)
            .then(|| self.exporter.existing_pool())
            .flatten();
        let results: Vec<Result<()>> = blocks
            .iter()
            .map(|b| self.return_block(b, shareable.as_deref()))
            .collect();
        let mut first_error = Ok(());
        {
            let mut st = self.state.lock();
            for (block, result) in blocks.iter().zip(results) {
                if let Err(e) = self.settle_return(&mut st, block, result) {
                    first_error = first_error.and(Err(e));
                }
            }
        }
        if let Err(e) = &first_error {
            self.log_return_failure(e);
        }
        first_error
    }

    /// [`DeviceAllocator::send_home`] for one block, without building a list.
    fn send_one_home(&self, block: FreedBlock) -> Result<()> {
        let shareable = match block.home {
            Home::Shareable => self.exporter.existing_pool(),
            _ => None,
        };
        let result = self.return_block(&block, shareable.as_deref());
        let settled = self.settle_return(&mut self.state.lock(), &block, result);
        if let Err(e) = &settled {
            self.log_return_failure(e);
        }
        settled
    }

    /// Gives `block` back to its resource, the shareable pool or the driver.
    fn return_block(
        &self,
        b: &FreedBlock,
        shareable: Option<&dyn crate::resource::Resource>,
    ) -> Result<()> {
        match (b.home, self.provisioned.get(), shareable) {
            (Home::Graph | Home::DriverPool, _, _) => {
                self.driver.free_async(self.device, b.ptr, b.stream)
            }
            (Home::Shareable, _, Some(pool)) => pool.deallocate(b.ptr, b.block_bytes, b.stream),
            (Home::Small, Some(p), _) => {
                p.resources
                    .get(SizeClass::Small)
                    .deallocate(b.ptr, b.block_bytes, b.stream)
            }
            (Home::Large, Some(p), _) => {
                p.resources
                    .get(SizeClass::Large)
                    .deallocate(b.ptr, b.block_bytes, b.stream)
            }
            _ => Err(Error::Internal(format!(
                "{:#x}: its {:?} resource does not exist",
                b.ptr, b.home
            ))),
        }
    }

    /// Ledger the outcome of a return: the block is home (noted on the timeline), or, refused,
    /// held again for the next flush.
    fn settle_return(
        &self,
        st: &mut DeviceState,
        block: &FreedBlock,
        result: Result<()>,
    ) -> Result<()> {
        st.ledger.settle_return(*block, result)?;
        self.note(
            st,
            Event::PoolFree,
            block.stream,
            block.ptr,
            block.block_bytes,
        );
        Ok(())
    }

    #[cold]
    fn log_return_failure(&self, e: &Error) {
        log::error!(
            "device {}: returning blocks failed ({e}); empty_cache will retry",
            self.device
        );
    }

    /// Returns cached and completed blocks to their resources, synchronises and trims each
    /// resource to `keep_bytes`. While a graph is being captured it only returns the cache (no
    /// waiting). A block the driver refuses does not stop the trim; the first error is reported.
    pub fn flush(&self, keep_bytes: u64) -> Result<()> {
        let Some(provisioned) = self.provisioned.get() else {
            return Ok(());
        };
        let resources = &provisioned.resources;
        let mut blocks = Vec::new();
        let (capturing, mark) = {
            let mut st = self.lock_enabled()?;
            self.collect_waits(&mut st, &mut blocks);
            (st.waits.capturing(), st.waits.mark())
        };
        let synced = match capturing {
            true => Ok(()),
            false => self.driver.synchronize(self.device),
        };
        {
            let mut st = self.state.lock();
            if !capturing && synced.is_ok() {
                // All work queued before the synchronisation is done: every block that waited
                // before it began is free (one freed since may still be in use).
                for w in st.waits.take_all_after_sync(mark) {
                    st.ledger.deactivate(w.requested_bytes);
                    st.ledger.release(&w.block);
                    blocks.push(w.block);
                }
            }
            blocks.extend(
                st.ledger
                    .drain_cache(|bytes| Home::of(resources.class_of(bytes))),
            );
            blocks.extend(st.ledger.take_unreturned());
        }
        let count = blocks.len();
        let returned = self.send_home(blocks);
        synced?;
        if !capturing {
            self.driver.synchronize(self.device)?;
            let before_bytes = self.reserved_for_timeline(resources);
            resources.for_each(|r| r.trim(keep_bytes))?;
            if let (Some(before), Some(after)) =
                (before_bytes, self.reserved_for_timeline(resources))
            {
                let st = self.state.lock();
                self.recorder
                    .note_trim(before, after, Stream(0), || st.ledger.gauges());
            }
        }
        log::info!(
            "device {}: flushed {count} blocks, trimmed to {keep_bytes} B",
            self.device
        );
        returned
    }
}

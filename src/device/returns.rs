//! The way back: a freed block leaves the live list, waits for the other streams that used it,
//! and is kept in the cache or returned to its source; blocks whose streams are done are
//! collected from the waits; `flush` (`empty_cache`, trim) returns everything and trims the
//! device's own resources.
//!
//! Invariants: a block leaves the ledger before it is returned and comes back onto it (as
//! unreturned, held) if its source refuses it, so no failure loses memory; a block goes back to
//! the source its record names, on its allocation stream; returns happen outside the device
//! lock; a flush while a capture is possible (known, or a route to a graph pool open) neither
//! waits nor trims; no block goes back to a CUDA pool on a stream that captures (put off).

use super::freed::{FreedBlock, Kept, Returning, WaitingBlock};
use super::{DeviceAllocator, DeviceState};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::sync::MutexGuard;

impl DeviceAllocator {
    /// Frees `ptr`: off the live list; a block other streams used waits for them; then it is
    /// cached for its stream, or goes back to its source.
    pub(crate) fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut st = timed_section!("device free: lock", self.lock_enabled())?;
        let Some(live) = st.ledger.remove_live(ptr) else {
            return Err(self.unknown_pointer(ptr));
        };
        st.activity += 1;
        self.note(&st, Event::Free, live.stream, ptr, live.requested_bytes);
        if log::max_level() >= log::LevelFilter::Trace {
            self.trace_free(ptr, live.requested_bytes, live.stream);
        }
        let block = FreedBlock {
            ptr,
            block_bytes: live.block_bytes,
            stream: live.stream,
            source: live.source,
        };
        if live.other_streams > 0 {
            let removed = st.ledger.removed_used_elsewhere(ptr, live);
            if st.ledger.held(&block) {
                let waiting = WaitingBlock {
                    block,
                    requested_bytes: live.requested_bytes,
                };
                let mut one = [Stream(0)];
                match self.wait_for_streams(st, waiting, removed.other_streams(&mut one))? {
                    Some(synchronised) => st = synchronised,
                    None => return Ok(()),
                }
            }
        }
        st.ledger.deactivate(live.requested_bytes);
        // The freed, inactive block goes into the cache, or back to its source if the cache does
        // not take it (with the blocks the cache evicts for it). (Here, not in a function that
        // takes the lock's guard: moving the guard into it cost copies of it on every free.)
        match st.ledger.try_keep(&block) {
            Kept::Cached => Ok(()),
            // Straight back (a block of the vmm backend, which reuses it itself): on its source's
            // fast path, here, if it has one and can; else outside the lock.
            Kept::NotCacheable => match st.ledger.return_fast(&block) {
                Some(Ok(())) => {
                    let (stream, ptr, bytes) = (block.stream, block.ptr, block.block_bytes);
                    self.note(&st, Event::PoolFree, stream, ptr, bytes);
                    Ok(())
                }
                Some(Err(e)) => {
                    self.log_return_failure(&e);
                    Err(e)
                }
                None => self.return_outside(st, block),
            },
            Kept::OverBudget => self.keep_evicting(st, block),
        }
    }

    /// A freed block waits for the other `streams` that used it: `None` once events stand for
    /// them. Without an event it cannot be known when the streams are done: the device is
    /// synchronised, and the block goes on at once (the lock, taken again, is handed back); if
    /// even that fails, the block is kept until one of them works, and the error returned.
    fn wait_for_streams<'a>(
        &'a self,
        mut st: MutexGuard<'a, DeviceState>,
        waiting: WaitingBlock,
        streams: &[Stream],
    ) -> Result<Option<MutexGuard<'a, DeviceState>>> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let routed = self.graph_pools.any_route_open();
        let failed = match st.waits.wait_for(driver, device, waiting, streams, routed) {
            Ok(()) => return Ok(None),
            Err(failed) => failed,
        };
        drop(st);
        log::warn!(
            "device {device}: {}; synchronising before reusing {:#x}",
            failed.error,
            failed.waiting.block.ptr
        );
        let synced = self.driver.synchronize(device);
        st = self.state.lock();
        if let Err(e) = synced {
            st.waits.defer(failed.waiting, failed.streams);
            return Err(e);
        }
        Ok(Some(st))
    }

    /// Logs a free (trace level). Out of line, its arguments copies: a reference to the free's
    /// pointer or record, taken for the message, kept them in memory on every free, with copies
    /// of the record between stack slots.
    #[cold]
    #[inline(never)]
    fn trace_free(&self, ptr: DevicePtr, requested_bytes: u64, stream: Stream) {
        log::trace!(
            "device {}: free {ptr:#x} ({requested_bytes} B) on stream {stream:#x}",
            self.device
        );
    }

    #[cold]
    fn unknown_pointer(&self, ptr: DevicePtr) -> crate::Error {
        crate::Error::UnknownPointer {
            ptr: ptr.0,
            device: self.device,
        }
    }

    pub(crate) fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.lock_enabled()?
            .ledger
            .record_stream(ptr, stream, self.device)
    }

    /// A freed block that its source's fast path did not take back: it leaves the ledger and goes
    /// back once the lock is released.
    fn return_outside(&self, mut st: MutexGuard<'_, DeviceState>, block: FreedBlock) -> Result<()> {
        let returning = st.ledger.release(block);
        drop(st);
        self.return_one(returning)
    }

    /// [`DeviceAllocator::free`] for a block the cache makes room for: the blocks it
    /// evicts go back.
    #[cold]
    fn keep_evicting(&self, mut st: MutexGuard<'_, DeviceState>, block: FreedBlock) -> Result<()> {
        let mut to_return = Vec::new();
        st.ledger.put_in_cache(block, &mut to_return);
        drop(st);
        self.return_blocks(to_return)
    }

    /// Hands back the blocks whose streams are done (forgetting captures that ended); those the
    /// cache does not keep, and those it evicts for them, are added to `to_return`, to be
    /// returned once the lock is released.
    pub(super) fn collect_waits(&self, st: &mut DeviceState, to_return: &mut Vec<Returning>) {
        for w in st.waits.collect(self.driver.as_ref(), self.device) {
            st.ledger.deactivate(w.requested_bytes);
            st.ledger.keep(w.block, to_return);
        }
    }

    /// Returns blocks to their sources, on their own streams; they already left `held_bytes`. A
    /// block its source refuses stays on the ledger for the next flush to retry; the first error
    /// is returned.
    pub(super) fn return_blocks(&self, blocks: Vec<Returning>) -> Result<()> {
        self.return_blocks_as(blocks, |_| false)
    }

    /// Hands back the waiting blocks whose streams are done, idle where they can be
    /// ([`DeviceAllocator::return_idle_blocks`]), with the lock `st` released; false, and nothing
    /// collected, while a capture is known. `after_sync`: the device has just been synchronised
    /// by this thread (the program's synchronisation), and blocks that waited before it began
    /// ([`DeviceAllocator::synchronizing`]) are done.
    pub(super) fn return_finished_waits(
        &self,
        mut st: MutexGuard<'_, DeviceState>,
        after_sync: bool,
    ) -> Result<bool> {
        if st.waits.capturing() {
            return Ok(false);
        }
        let done = match after_sync {
            true => st.waits.sync_ended(),
            false => Vec::new(),
        };
        let mut blocks = Vec::with_capacity(done.len());
        // Those that waited before this thread's synchronisation began, asked nothing.
        let mut before: Vec<DevicePtr> = Vec::with_capacity(done.len());
        for w in done {
            before.push(w.block.ptr);
            st.ledger.deactivate(w.requested_bytes);
            st.ledger.keep(w.block, &mut blocks);
        }
        self.collect_waits(&mut st, &mut blocks);
        drop(st);
        before.sort_unstable();
        self.return_idle_blocks(blocks, &before)?;
        Ok(true)
    }

    /// [`DeviceAllocator::return_blocks`] for blocks whose other streams' work has completed,
    /// handed back at the program's synchronisation: a block of a resource that takes idle
    /// blocks whose own stream has finished its work too goes back idle
    /// ([`crate::resource::Resource::deallocate_idle`]: ready for every stream). A block in
    /// `freed_before` (sorted) waited before the synchronisation began, so its own stream's work
    /// on it is done: it goes back idle unasked. For the others each stream is asked once (a
    /// capture query and a `cuStreamQuery`), however many of its blocks go back.
    pub(super) fn return_idle_blocks(
        &self,
        blocks: Vec<Returning>,
        freed_before: &[DevicePtr],
    ) -> Result<()> {
        let mut finished: Vec<(Stream, bool)> = Vec::new();
        let (driver, device) = (self.driver.as_ref(), self.device);
        self.return_blocks_as(blocks, |r| {
            let takes_idle = r.resource.as_ref().map(|s| s.traits().takes_idle_blocks);
            if takes_idle != Some(true) {
                return false;
            }
            if freed_before.binary_search(&r.block.ptr).is_ok() {
                return true;
            }
            let stream = r.block.stream;
            match finished.iter().find(|(s, _)| *s == stream) {
                Some(&(_, done)) => done,
                None => {
                    let done = crate::stream_order::finished(driver, device, stream);
                    finished.push((stream, done));
                    done
                }
            }
        })
    }

    /// Gives `blocks` back, each as idle where `idle` says so.
    fn return_blocks_as(
        &self,
        blocks: Vec<Returning>,
        mut idle: impl FnMut(&Returning) -> bool,
    ) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let blocks = match self.graph_pools.any_route_open() {
            false => blocks,
            true => self.put_off_captured(blocks),
        };
        let results: Vec<Result<()>> = blocks.iter().map(|r| deallocate(r, idle(r))).collect();
        let mut first_error = Ok(());
        {
            let mut st = self.state.lock();
            for (r, result) in blocks.iter().zip(results) {
                if let Err(e) = self.finish_return(&mut st, &r.block, result) {
                    first_error = first_error.and(Err(e));
                }
            }
        }
        if let Err(e) = &first_error {
            self.log_return_failure(e);
        }
        first_error
    }

    /// [`DeviceAllocator::return_blocks`] for one block, without building a list.
    fn return_one(&self, returning: Returning) -> Result<()> {
        if self.graph_pools.any_route_open() && self.captured_return(&returning) {
            self.state.lock().ledger.put_off(returning.block);
            return Ok(());
        }
        let result = deallocate(&returning, false);
        let finished = self.finish_return(&mut self.state.lock(), &returning.block, result);
        if let Err(e) = &finished {
            self.log_return_failure(e);
        }
        finished
    }

    /// Books the outcome of a return: the block is back (noted on the timeline), or, refused,
    /// held again for the next flush.
    fn finish_return(
        &self,
        st: &mut DeviceState,
        block: &FreedBlock,
        result: Result<()>,
    ) -> Result<()> {
        st.ledger.record_return(*block, result)?;
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

    /// Returns cached and completed blocks to their sources, synchronises and trims each of the
    /// device's own resources to `keep_bytes` (the shareable pool, a pool of its own, to 0).
    /// While a graph may be being captured ([`DeviceAllocator::capture_possible`]) it only
    /// returns the cache (no waiting, no trim). A block its
    /// source refuses does not stop the trim; the first error is reported.
    pub(crate) fn flush(&self, keep_bytes: u64) -> Result<()> {
        let Some(setup) = self.setup.get() else {
            return Ok(());
        };
        let mut blocks = Vec::new();
        let (capturing, mark) = {
            let mut st = self.lock_enabled()?;
            self.collect_waits(&mut st, &mut blocks);
            (self.capture_possible(&st), st.waits.mark())
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
                    blocks.push(st.ledger.release(w.block));
                }
            }
            blocks.extend(st.ledger.drain_cache());
            blocks.extend(st.ledger.take_unreturned());
        }
        let count = blocks.len();
        let returned = self.return_blocks(blocks);
        synced?;
        if !capturing {
            // Memory pools nobody uses give their free segments back once the synchronisation
            // has finished every replay launched before they were taken; once those returns
            // complete, the trim can release them too.
            let taken = self.graph_pools.take_unused_segments();
            self.driver.synchronize(self.device)?;
            match self.graph_pools.give_back_segments(taken) {
                Ok(0) => {}
                Ok(_) => self.driver.synchronize(self.device)?,
                Err(e) => log::warn!("device {}: releasing unused memory pools: {e}", self.device),
            }
            let before_bytes = self.reserved_for_timeline();
            setup.for_each_own(|r| r.trim(keep_bytes))?;
            if let (Some(before), Some(after)) = (before_bytes, self.reserved_for_timeline()) {
                let st = self.state.lock();
                self.recorder
                    .note_trim(before, after, Stream(0), || st.ledger.gauges());
            }
            // The shareable pool's free memory goes back too (as every pool's at PyTorch's
            // empty_cache()); it keeps none of `keep_bytes`, which is the device's own pools'.
            if let Some(pool) = self.shareable_apart(setup) {
                pool.trim(0)?;
            }
        }
        log::info!(
            "device {}: flushed {count} blocks, trimmed to {keep_bytes} B",
            self.device
        );
        returned
    }
}

impl DeviceAllocator {
    /// True if giving `r` back now would free it on a stream that captures a graph: its source
    /// is one of streampool's CUDA pools (held memory whose frees are `cuMemFreeAsync` on the
    /// block's stream), and the free would be a node of the graph — an error on a GPU for memory
    /// the graph did not allocate, or a free at every replay. (Graph memory, not held, is the
    /// graph's own: its free in the capture is the node it needs.) Asked only while PyTorch
    /// routes allocations to a graph pool (it opens the route before it begins a capture): no
    /// driver call otherwise.
    #[cold]
    #[inline(never)]
    fn captured_return(&self, r: &Returning) -> bool {
        let stream = r.block.stream;
        let traits = r.resource.as_ref().map(|s| s.traits());
        stream.may_be_captured()
            && traits.is_some_and(|t| t.held && t.frees_applied_at_sync)
            && (self.driver.is_capturing(self.device, stream)).unwrap_or(false)
    }

    /// `blocks` less those whose return is put off ([`DeviceAllocator::captured_return`]),
    /// which are held again, as unreturned, for the next flush or idle release.
    #[cold]
    #[inline(never)]
    fn put_off_captured(&self, blocks: Vec<Returning>) -> Vec<Returning> {
        let (off, on): (Vec<Returning>, Vec<Returning>) =
            blocks.into_iter().partition(|r| self.captured_return(r));
        if !off.is_empty() {
            let mut st = self.state.lock();
            off.iter().for_each(|r| st.ledger.put_off(r.block));
        }
        on
    }
}

/// Gives the block back to its source (as idle: [`crate::resource::Resource::deallocate_idle`]).
fn deallocate(r: &Returning, idle: bool) -> Result<()> {
    let b = &r.block;
    match &r.resource {
        Some(resource) if idle => resource.deallocate_idle(b.ptr, b.block_bytes, b.stream),
        Some(resource) => resource.deallocate(b.ptr, b.block_bytes, b.stream),
        None => Err(Error::Internal(format!(
            "{:#x}: its source {:?} is not in the device's table",
            b.ptr, b.source
        ))),
    }
}

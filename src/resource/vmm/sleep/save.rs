//! A sleep's saving and giving back: the pages under kept blocks are copied to the host buffer in
//! address order, in batches of [`BATCH_BYTES`] with an event recorded after each, and a mapping
//! is given back (unmapped, its handle released) as soon as the batches that copy its pages have
//! completed, while the later batches' copies run. On an H200 a handle costs about 44 us to give
//! back and 2 MiB about 38 us to copy: with GPT-2's 5.5 GiB and the host buffer reserved, a sleep
//! that gave everything back after the last copy took 0.140-0.143 s (74-75% of the host link),
//! this one 0.108 s (97-98%; bench/results/2026-12-01-h200-sleep).
//!
//! Invariants: a page is unmapped only after the event of every batch that copies it completed
//! (a mapping whose pages are not all below the first page a pending batch copies waits);
//! mappings go back in address order, so the pages below the last given-back mapping's end are
//! all given back or stayed awake because their unmap failed; a failed wait maps the pages given
//! back before it again with their saved contents (their copies had completed; the discarded
//! tags' blocks come back without theirs) — or, where that fails, leaves them asleep for
//! `wake()`, and says so — and leaves no copy in flight and no event alive.

use super::{HostBytes, SleptPage};
use crate::driver::{DevicePtr, EventHandle, Stream};
use crate::error::{Error, Result};
use crate::history::StreampoolEventKind as Event;
use crate::resource::vmm::{Page, VmmResource, VmmState};
use crate::tag::TagId;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

/// The copies between two events: 1.2 ms at an H200's 55 GB/s, while the pages of the batch
/// before (eight 8 MiB handles, 0.35 ms) are given back.
const BATCH_BYTES: u64 = 64 << 20;

/// The copies queued by a sleep: where they go, and an event after each batch.
pub(super) struct Saving {
    pub(super) host: HostBytes,
    pub(super) batches: Vec<Batch>,
}

/// A batch of copies: once its event completed, every saved page below `copied_below` is in the
/// host buffer.
pub(super) struct Batch {
    event: EventHandle,
    copied_below: u64,
}

impl VmmResource {
    /// The mapped pages any live block lies on, but for blocks allocated under a tag in
    /// `discard`.
    pub(super) fn pages_under_kept_blocks(
        &self,
        st: &VmmState,
        discard: &[TagId],
    ) -> BTreeSet<u64> {
        let mut pages = BTreeSet::new();
        let kept = st.live.blocks().filter(|&(start, _)| {
            discard.is_empty() || st.live.tag(start).is_none_or(|t| !discard.contains(&t))
        });
        for (start, bytes) in kept {
            let end = start + bytes;
            let first = st.pages.range(..=start).next_back().map(|(&p, _)| p);
            let from = first
                .filter(|&p| p + self.page_bytes > start)
                .unwrap_or(start);
            pages.extend(st.pages.range(from..end).map(|(&p, _)| p));
        }
        pages
    }

    /// Queues the copies of the `saved` pages into a page-locked host buffer (the kept one if it
    /// is large enough) on the legacy stream, in address order, a run of adjacent pages a copy
    /// (cut where a batch ends), an event after each batch; `None` if there are none. On a
    /// failure nothing else changed: a buffer had is kept for the next sleep (but one too small,
    /// which [`VmmResource::host_buffer`] freed when a larger one could not be had either).
    pub(super) fn save(&self, st: &mut VmmState, saved: &BTreeSet<u64>) -> Result<Option<Saving>> {
        if saved.is_empty() {
            return Ok(None);
        }
        let bytes = (saved.len() as u64)
            .checked_mul(self.page_bytes)
            .ok_or_else(|| Error::Internal("the pages to save overflow".into()))?;
        let host = self.host_buffer(st, bytes)?;
        let pages: Vec<u64> = saved.iter().copied().collect();
        let batch_pages = (BATCH_BYTES / self.page_bytes).max(1) as usize;
        let mut batches = Vec::new();
        let pieces = (self.runs(st, &pages).into_iter()).flat_map(|run| cut(run, batch_pages));
        for piece in pieces {
            let ends_batch = piece.end % batch_pages == 0 || piece.end == pages.len();
            let copied_below = pages.get(piece.end).copied().unwrap_or(u64::MAX);
            let queued = self
                .copy_out(host, &pages, piece)
                .and_then(|()| match ends_batch {
                    true => self
                        .mark_batch(copied_below)
                        .map(|batch| batches.push(batch)),
                    false => Ok(()),
                });
            if let Err(e) = queued {
                // The copies queued before finish before anything else happens.
                let _ = self.wait_for_copies();
                self.forget_batches(batches);
                st.sleep_buffer = Some(host);
                return Err(e);
            }
        }
        debug_assert!(st.pages.keys().filter(|p| saved.contains(p)).count() == saved.len());
        Ok(Some(Saving { host, batches }))
    }

    /// Queues the copy of `pages[piece]` (adjacent pages) to their place in `host`.
    fn copy_out(&self, host: HostBytes, pages: &[u64], piece: Range<usize>) -> Result<()> {
        let at = piece.start as u64 * self.page_bytes;
        let bytes = piece.len() as u64 * self.page_bytes;
        let first = DevicePtr(pages[piece.start]);
        (self.driver).copy_to_host(self.device, host.buffer, at, first, bytes, Stream::LEGACY)
    }

    /// An event recorded on the legacy stream after the copies queued so far.
    fn mark_batch(&self, copied_below: u64) -> Result<Batch> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let event = driver.event_create(device)?;
        if let Err(e) = driver.event_record(device, event, Stream::LEGACY) {
            driver.event_destroy(device, event);
            return Err(e);
        }
        Ok(Batch {
            event,
            copied_below,
        })
    }

    fn forget_batches(&self, batches: impl IntoIterator<Item = Batch>) {
        for batch in batches {
            self.driver.event_destroy(self.device, batch.event);
        }
    }

    /// A page-locked host buffer of at least `bytes`: the one kept from the last sleep if it is
    /// large enough, else a new one (which replaces the kept one; that one is freed first only
    /// if the new one cannot be had beside it).
    fn host_buffer(&self, st: &mut VmmState, bytes: u64) -> Result<HostBytes> {
        if let Some(kept) = st.sleep_buffer.take() {
            if kept.bytes >= bytes {
                return Ok(kept);
            }
            match self.driver.host_alloc(self.device, bytes) {
                Ok(buffer) => {
                    self.driver.host_free(self.device, kept.buffer);
                    return Ok(HostBytes { buffer, bytes });
                }
                Err(_) => self.driver.host_free(self.device, kept.buffer),
            }
        }
        let buffer = self.driver.host_alloc(self.device, bytes).map_err(|e| {
            Error::InvalidArgument(format!(
                "device {} cannot sleep at level 1: {bytes} B of page-locked host memory for \
                 its contents could not be allocated ({e}); nothing changed on the device",
                self.device
            ))
        })?;
        Ok(HostBytes { buffer, bytes })
    }

    /// Waits for the copies queued on the legacy stream; if that fails, for the whole device
    /// before the error returns, so that no copy is in flight once it has.
    pub(super) fn wait_for_copies(&self) -> Result<()> {
        let waited = (self.driver).stream_synchronize(self.device, Stream::LEGACY);
        if waited.is_err() {
            let _ = self.driver.synchronize(self.device);
        }
        waited
    }

    /// `pages` (ascending) cut into runs of adjacent pages inside one address reservation: the
    /// ranges of their indices.
    pub(super) fn runs(&self, st: &VmmState, pages: &[u64]) -> Vec<Range<usize>> {
        let mut bases: Vec<u64> = (st.large.extents().chain(st.carriers.extents()))
            .map(|(base, _)| base)
            .collect();
        bases.sort_unstable();
        let joins = |i: usize| {
            pages[i] == pages[i - 1] + self.page_bytes && bases.binary_search(&pages[i]).is_err()
        };
        crate::resource::vmm::runs(pages.len(), joins).collect()
    }

    /// Gives back every spare at once, and every mapping (unmapped, its handle released) as soon
    /// as the batches copying its `saved` pages completed; the pages slept, with where their
    /// contents wait, and the error of a wait that failed (the device synchronised then: no copy
    /// in flight; the mappings of that batch and after stay mapped). A mapping that cannot be
    /// unmapped stays mapped (and awake); a handle that cannot be released stays held.
    pub(super) fn give_back_as_copied(
        &self,
        st: &mut VmmState,
        saved: &BTreeSet<u64>,
        batches: Vec<Batch>,
    ) -> (Vec<SleptPage>, Result<()>) {
        for handle in std::mem::take(&mut st.spare_handles) {
            self.release_handle(st, handle, 1);
        }
        self.release_spare_spans(st);
        let offsets: HashMap<u64, u64> = (saved.iter().enumerate())
            .map(|(i, &page)| (page, i as u64 * self.page_bytes))
            .collect();
        let (mut slept, mut from) = (Vec::new(), 0);
        let mut batches = batches.into_iter();
        while let Some(batch) = batches.next() {
            let waited = self.driver.event_synchronize(self.device, batch.event);
            self.driver.event_destroy(self.device, batch.event);
            if let Err(e) = waited {
                let _ = self.driver.synchronize(self.device);
                self.forget_batches(batches);
                return (slept, Err(e));
            }
            from = self.give_back_below(st, &offsets, from, batch.copied_below, &mut slept);
        }
        self.give_back_below(st, &offsets, from, u64::MAX, &mut slept);
        (slept, Ok(()))
    }

    /// Gives back the mappings from `from` (a mapping's first page) that end at or below
    /// `bound`, in address order, adding their pages to `slept`; where the next call starts.
    fn give_back_below(
        &self,
        st: &mut VmmState,
        offsets: &HashMap<u64, u64>,
        from: u64,
        bound: u64,
        slept: &mut Vec<SleptPage>,
    ) -> u64 {
        let firsts: Vec<(u64, Page)> = (st.pages.range(from..bound))
            .filter(|&(&at, p)| p.mapping.first == at)
            .map(|(&at, &p)| (at, p))
            .collect();
        let mut next = from;
        for (first, p) in firsts {
            let end = first + p.mapping.pages * self.page_bytes;
            if end > bound {
                break;
            }
            next = end;
            if let Err(e) = self.unmap_mapping(st, first) {
                let device = self.device;
                log::warn!("device {device}: a page stays awake, it could not be unmapped: {e}");
                continue;
            }
            for page in p.mapping.page_starts(self.page_bytes) {
                self.count(Event::Unmap, page, st);
                let saved_at = offsets.get(&page).copied();
                let region = p.region;
                slept.push(SleptPage {
                    page,
                    region,
                    saved_at,
                });
            }
            self.release_handle(st, p.handle, p.mapping.pages);
        }
        next
    }

    /// After a wait that failed part way through a sleep: the pages it gave back before (their
    /// copies had completed) are mapped again with their contents, and the buffer is kept for
    /// the next sleep; the error to return. Pages that cannot be restored sleep on, and the
    /// device with them (`wake()` restores them): the error says so.
    pub(super) fn undo_sleep(
        &self,
        st: &mut VmmState,
        slept: Vec<SleptPage>,
        host: HostBytes,
        failed: Error,
    ) -> Error {
        let (restored, undone) = self.restore(st, &slept, Some(host));
        let Err(why) = undone else {
            st.sleep_buffer = Some(host);
            return failed;
        };
        let pages: Vec<SleptPage> = (slept.into_iter())
            .filter(|p| !restored.contains(&p.page))
            .collect();
        let asleep_bytes = pages.len() as u64 * self.page_bytes;
        st.asleep = Some(super::Asleep {
            pages,
            host: Some(host),
        });
        self.asleep_now
            .store(true, std::sync::atomic::Ordering::Release);
        Error::Internal(format!(
            "device {}: the sleep failed part way ({failed}), and {asleep_bytes} B it had given \
             back could not be mapped again ({why}): the device is asleep with them; \
             streampool.wake() restores them",
            self.device
        ))
    }
}

/// `run` cut where a multiple of `every` falls inside it.
fn cut(run: Range<usize>, every: usize) -> impl Iterator<Item = Range<usize>> {
    let mut at = run.start;
    std::iter::from_fn(move || {
        (at < run.end).then(|| {
            let end = ((at / every + 1) * every).min(run.end);
            let piece = at..end;
            at = end;
            piece
        })
    })
}

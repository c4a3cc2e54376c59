//! The free address ranges of the virtual-memory resource: pure bookkeeping, no driver calls.
//!
//! Invariants: free ranges never overlap and lie inside extents; two neighbours are merged when
//! they are ready for the same streams, and memory freed on a stream absorbs its ready
//! neighbours (the whole range then serves that stream at once, as one block, and the others
//! after its fence), never across an extent's end; a range is one of
//! - `Unmapped`: no physical memory behind it, whole pages, usable by any stream once mapped;
//! - `Ready`: mapped, and no work on any stream still uses it;
//! - `Freed { stream, seq }`: mapped, freed on `stream` — usable at once by that stream, by others
//!   once the stream's fence `seq` (recorded at the free) has completed;
//! - `Blocked`: whole pages mapped but without access (setting it failed, and so did unmapping
//!   them again): usable by no one until access is set or they are unmapped;
//! - `Retiring`: a whole page whose physical memory now backs another address (see
//!   `super::lending`): usable by no one, unmapped later. Never merged with a neighbour.
//!
//! Pages are `page_bytes` long and counted from each extent's base.

use crate::driver::Stream;
use crate::fasthash::WordTable;
use by_stream::ByStream;
use index::AddressOrder;
use sizes::SizeIndex;
use std::collections::BTreeMap;

pub(crate) use state::State;

/// Streams whose freed memory all became ready keep their (empty) size index while there are at
/// most this many indexes: a stream that frees all the time does not rebuild its own every
/// millisecond, and a program with a stream per request does not keep one per stream.
const KEPT_EMPTY: usize = 16;

#[derive(Debug, Clone, Copy, Default)]
struct Range {
    bytes: u64,
    state: State,
}

#[derive(Debug, Default)]
pub(crate) struct FreeRanges {
    page_bytes: u64,
    /// base -> bytes of each reservation.
    extents: BTreeMap<u64, u64>,
    /// The largest power of two that every extent's base ever added is a multiple of (0 before
    /// the first): an address that is not a multiple of it begins no extent, which a merge's
    /// check then learns without the map ([`FreeRanges::starts_extent`]).
    base_align: u64,
    /// start -> range (a start or an end is never 0: no reservation begins at 0).
    ranges: WordTable<Range>,
    /// end -> start of every range: a free's left neighbour, found without the order.
    by_end: WordTable<u64>,
    /// The starts in address order, for the paths that walk the ranges ([`index`]).
    order: AddressOrder,
    /// (bytes, start) of every `Ready` range, for best fit ([`sizes`]).
    ready_by_size: SizeIndex,
    /// (bytes, start) of every `Freed` range, by stream (an emptied stream's index is kept for
    /// its next free while there are few: [`KEPT_EMPTY`]).
    freed_by_size: ByStream,
}

impl FreeRanges {
    pub fn new(page_bytes: u64) -> FreeRanges {
        FreeRanges {
            page_bytes,
            ..FreeRanges::default()
        }
    }

    /// A new reservation of `bytes` (whole pages) at `base`, all unmapped.
    pub fn add_extent(&mut self, base: u64, bytes: u64) {
        debug_assert_eq!(bytes % self.page_bytes, 0);
        self.add_extent_in(base, bytes, State::Unmapped);
    }

    /// A new extent of `bytes` at `base`, free in `state` (a carrier of small blocks in a hole
    /// of the large blocks' ranges is an extent of its own, mapped from the start).
    pub fn add_extent_in(&mut self, base: u64, bytes: u64, state: State) {
        self.insert_extent(base, bytes);
        self.put(base, bytes, state);
    }

    /// The extent at `base` is `bytes` long (new, or grown or shrunk), its base counted in
    /// `base_align`.
    fn insert_extent(&mut self, base: u64, bytes: u64) {
        self.extents.insert(base, bytes);
        let bits = self.base_align | base;
        self.base_align = bits & bits.wrapping_neg();
    }

    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.extents.iter().map(|(&b, &l)| (b, l))
    }

    /// The smallest mapped range `stream` may use that holds `bytes`; its start.
    pub fn best_fit(&self, bytes: u64, stream: Stream) -> Option<u64> {
        let ready = self.ready_by_size.first_at_least(bytes);
        let freed = (self.freed_by_size.get(stream)).and_then(|f| f.first_at_least(bytes));
        match (ready, freed) {
            (Some(a), Some(b)) => Some(a.min(b).1),
            (a, b) => a.or(b).map(|(_, start)| start),
        }
    }

    /// The smallest range freed on a stream other than `stream` that holds `bytes`, with that
    /// stream and its fence: `stream` may use it once it has waited for the fence.
    pub fn best_fit_other(&self, bytes: u64, stream: Stream) -> Option<(u64, Stream, u64)> {
        let others = self.freed_by_size.iter().filter(|&(s, _)| s != stream);
        let (_, start) = others.filter_map(|(_, f)| f.first_at_least(bytes)).min()?;
        match self.at(start).state {
            State::Freed { stream, seq } => Some((start, stream, seq)),
            _ => None,
        }
    }

    /// A whole page (page-aligned) inside one mapped range that `stream` may use: the smallest
    /// such range first. For the carriers of small blocks.
    pub fn best_fit_page(&self, stream: Stream) -> Option<u64> {
        self.best_fit_page_where(stream, u64::MAX, |_, _, _| true)
    }

    /// [`FreeRanges::best_fit_page`] among holes of at most `max_bytes`: ranges between blocks
    /// (no free or unmapped range beside them, so no larger free run a block could use, nor one
    /// a growth would extend), for pages that pass `keep_page`.
    pub fn best_fit_page_in_hole(
        &self,
        stream: Stream,
        max_bytes: u64,
        keep_page: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        self.best_fit_page_where(stream, max_bytes, |start, bytes, page| {
            self.by_end.get(start).is_none()
                && self.ranges.get(start + bytes).is_none()
                && keep_page(page)
        })
    }

    /// The first whole page of the smallest range of at most `max_bytes` that `stream` may use,
    /// holds one and passes `keep(start, bytes, page)`.
    fn best_fit_page_where(
        &self,
        stream: Stream,
        max_bytes: u64,
        keep: impl Fn(u64, u64, u64) -> bool,
    ) -> Option<u64> {
        let page = self.page_bytes;
        let first = |index: &SizeIndex| {
            (index.iter_from(page))
                .take_while(|&(len, _)| len <= max_bytes)
                .find_map(|(len, start)| {
                    let at = self.page_ceil(start);
                    (at + page <= start + len && keep(start, len, at)).then_some((len, at))
                })
        };
        let ready = first(&self.ready_by_size);
        let freed = self.freed_by_size.get(stream).and_then(first);
        match (ready, freed) {
            (Some(a), Some(b)) => Some(a.min(b).1),
            (a, b) => a.or(b).map(|(_, at)| at),
        }
    }

    /// A whole page inside a range freed on a stream other than `stream`, with that stream and
    /// the range's fence: `stream` may use it once it has waited for the fence. The first found
    /// (pages are alike). For the carriers of small blocks.
    pub fn page_freed_by_other(&self, stream: Stream) -> Option<(u64, Stream, u64)> {
        let page = self.page_bytes;
        let others = self.freed_by_size.iter().filter(|&(s, _)| s != stream);
        let (at, start) =
            others
                .flat_map(|(_, f)| f.iter_from(page))
                .find_map(|(len, start)| {
                    let at = self.page_ceil(start);
                    (at + page <= start + len).then_some((at, start))
                })?;
        match self.at(start).state {
            State::Freed { stream, seq } => Some((at, stream, seq)),
            _ => None,
        }
    }

    /// Hands out `[start, start + bytes)`, which must be free and usable (mapped) for the caller;
    /// the state the block was in (ready, or freed on one stream with the latest fence of its
    /// pieces).
    pub fn take(&mut self, start: u64, bytes: u64) -> State {
        let end = start + bytes;
        // The common case (a best fit): the block starts a free range that holds it all.
        if let Some(&r) = self.ranges.get(start) {
            if r.bytes >= bytes && r.state.is_mapped_free() {
                self.order.forget();
                if r.bytes == bytes {
                    self.remove(start, r);
                    return r.state;
                }
                // The rest keeps the range's end: its end entry now names the rest's start.
                self.unindex(start, r);
                self.ranges.remove(start);
                let rest = Range {
                    bytes: r.bytes - bytes,
                    state: r.state,
                };
                self.index(end, rest);
                self.ranges.insert(end, rest);
                self.by_end.insert(start + r.bytes, end);
                return r.state;
            }
        }
        let covered = self.overlapping(start, end);
        debug_assert!(covered.iter().map(|(_, r)| r.bytes).sum::<u64>() >= bytes);
        let mut state = State::Ready;
        for &(s, r) in &covered {
            state = state.joined(r.state).unwrap_or(state);
            debug_assert!(
                r.state.is_mapped_free(),
                "taking unmapped or inaccessible memory"
            );
            self.remove(s, r);
            if s < start {
                self.put(s, start - s, r.state);
            }
            if s + r.bytes > end {
                self.put(end, s + r.bytes - end, r.state);
            }
        }
        state
    }

    /// Gives `[start, start + bytes)` back in `state`, merged with its neighbours where they may
    /// be ([`State::absorbs`]); the free range it is now part of, as (start, bytes).
    pub fn give(&mut self, start: u64, bytes: u64, state: State) -> (u64, u64) {
        self.order.forget();
        self.merge_in(start, bytes, state)
    }

    /// [`FreeRanges::give`], keeping the address order if it is kept. The maps are written once
    /// for the result: an absorbed left neighbour's start entry and a right one's end entry are
    /// the result's and are rewritten at the end, unless a later merge makes them inner (gone).
    fn merge_in(&mut self, start: u64, bytes: u64, state: State) -> (u64, u64) {
        let (mut start, mut bytes, mut state) = (start, bytes, state);
        // Whether `ranges` holds an (outdated) entry at `start`, and `by_end` one at the end.
        let (mut start_entry, mut end_entry) = (false, false);
        // A merge changes the range's state, after which a neighbour looked at before may merge
        // too: both sides are looked at again until neither merges.
        loop {
            if let Some((s, r)) = self.left_neighbour(start) {
                if let Some(merged) = state.absorbs(r.state) {
                    self.unindex(s, r);
                    self.by_end.remove(start);
                    if start_entry {
                        self.ranges.remove(start);
                        self.order.removed(start);
                    }
                    (start, bytes, state, start_entry) = (s, r.bytes + bytes, merged, true);
                    continue;
                }
            }
            let end = start + bytes;
            if let Some(&r) = self.ranges.get(end) {
                if !self.starts_extent(end) {
                    if let Some(merged) = state.absorbs(r.state) {
                        self.unindex(end, r);
                        self.ranges.remove(end);
                        self.order.removed(end);
                        if end_entry {
                            self.by_end.remove(end);
                        }
                        (bytes, state, end_entry) = (bytes + r.bytes, merged, true);
                        continue;
                    }
                }
            }
            let range = Range { bytes, state };
            self.index(start, range);
            self.ranges.insert(start, range);
            self.by_end.insert(start + bytes, start);
            if !start_entry {
                self.order.inserted(start);
            }
            return (start, bytes);
        }
    }

    /// The free range at `start` (one there is).
    #[inline]
    fn at(&self, start: u64) -> Range {
        match self.ranges.get(start) {
            Some(&r) => r,
            None => unreachable!("no free range at {start:#x}"),
        }
    }

    /// The free range that ends at `start`, unless an extent begins there.
    #[inline]
    fn left_neighbour(&self, start: u64) -> Option<(u64, Range)> {
        let &s = self.by_end.get(start)?;
        match self.starts_extent(start) {
            true => None,
            false => Some((s, self.at(s))),
        }
    }

    /// True if an extent begins at `addr` (no free range merges across it).
    #[inline]
    fn starts_extent(&self, addr: u64) -> bool {
        addr & self.base_align.wrapping_sub(1) == 0 && self.extents.contains_key(&addr)
    }

    /// The ranges' starts in address order ([`index`]).
    fn starts(&self) -> std::cell::Ref<'_, Vec<u64>> {
        self.order.get(self.ranges.iter().map(|(start, _)| start))
    }

    /// The free ranges that overlap `[start, end)`, in address order.
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, Range)> {
        let starts = self.starts();
        let first = starts.partition_point(|&s| s <= start).saturating_sub(1);
        starts[first..]
            .iter()
            .take_while(|&&s| s < end)
            .map(|&s| (s, self.at(s)))
            .filter(|(s, r)| s + r.bytes > start)
            .collect()
    }

    /// The free range `addr` lies in, as (start, range).
    fn containing(&self, addr: u64) -> Option<(u64, Range)> {
        let starts = self.starts();
        let &s = starts.get(starts.partition_point(|&s| s <= addr).checked_sub(1)?)?;
        let r = self.at(s);
        (addr < s + r.bytes).then_some((s, r))
    }

    /// Freed ranges of `stream` whose fence is at most `completed_seq` become ready; the ready
    /// ranges they are now part of, as (start, bytes).
    pub fn promote(&mut self, stream: Stream, completed_seq: u64) -> Vec<(u64, u64)> {
        let Some(freed) = self.freed_by_size.get(stream) else {
            return Vec::new();
        };
        let done: Vec<(u64, Range)> = freed
            .iter()
            .map(|(_, start)| (start, self.at(start)))
            .filter(|(_, r)| matches!(r.state, State::Freed { seq, .. } if seq <= completed_seq))
            .collect();
        let mut merged = Vec::with_capacity(done.len());
        if !done.is_empty() {
            self.order.forget();
        }
        for (start, r) in done {
            // Two freed ranges of one stream are never neighbours (they merge), so no earlier
            // merge of this loop has taken this one in.
            self.remove(start, r);
            merged.push(self.merge_in(start, r.bytes, State::Ready));
        }
        merged
    }

    /// Streams with freed ranges not yet ready.
    #[cfg(test)]
    pub fn streams_waited_for(&self) -> Vec<Stream> {
        let waited = self.freed_by_size.iter().filter(|(_, f)| !f.is_empty());
        waited.map(|(s, _)| s).collect()
    }

    /// Bytes in freed ranges that are not ready yet.
    pub fn freed_bytes(&self) -> u64 {
        let freed = self.freed_by_size.values().flat_map(SizeIndex::iter);
        freed.map(|(len, _)| len).sum()
    }

    fn put(&mut self, start: u64, bytes: u64, state: State) {
        let range = Range { bytes, state };
        self.index(start, range);
        self.ranges.insert(start, range);
        self.by_end.insert(start + bytes, start);
        self.order.inserted(start);
    }

    fn remove(&mut self, start: u64, r: Range) {
        self.unindex(start, r);
        self.ranges.remove(start);
        self.by_end.remove(start + r.bytes);
        self.order.removed(start);
    }

    /// The range at `start` joins the size index of its state (none for unmapped ones).
    #[inline]
    fn index(&mut self, start: u64, r: Range) {
        match r.state {
            State::Ready => {
                self.ready_by_size.insert(r.bytes, start);
            }
            State::Freed { stream, .. } => {
                let freed = self.freed_by_size.get_or_default(stream);
                freed.insert(r.bytes, start);
            }
            State::Unmapped | State::Blocked | State::Retiring => {}
        }
    }

    /// The range at `start` leaves the size index of its state.
    #[inline]
    fn unindex(&mut self, start: u64, r: Range) {
        match r.state {
            State::Ready => {
                self.ready_by_size.remove(r.bytes, start);
            }
            State::Freed { stream, .. } => {
                if let Some(freed) = self.freed_by_size.get_mut(stream) {
                    freed.remove(r.bytes, start);
                    if freed.is_empty() && self.freed_by_size.len() > KEPT_EMPTY {
                        self.freed_by_size.remove(stream);
                    }
                }
            }
            State::Unmapped | State::Blocked | State::Retiring => {}
        }
    }

    /// Every free range as (start, bytes, state), in address order.
    #[cfg(test)]
    pub fn snapshot(&self) -> Vec<(u64, u64, State)> {
        let starts = self.starts();
        let snapshot = starts.iter().map(|s| (*s, self.at(*s)));
        snapshot.map(|(s, r)| (s, r.bytes, r.state)).collect()
    }
}

mod by_stream;
#[cfg(test)]
mod check;
mod index;
mod joined;
mod pages;
mod sizes;
mod state;
#[cfg(test)]
mod tests;
mod window;

pub(crate) use window::Window;

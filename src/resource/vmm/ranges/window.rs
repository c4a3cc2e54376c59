//! Windows: where a request that fits no free range it may use can go — a run of contiguous free
//! ranges whose unmapped pages are to be mapped, and which may cover memory other streams freed,
//! behind GPU-side waits for their fences.
//!
//! Invariant: a window lies inside one extent, in ranges that are unmapped, usable by the
//! stream, or (when asked) freed on another stream; it lists every unmapped page it touches and,
//! for every other stream whose freed memory it covers, the latest fence of that memory, so that
//! waiting for those fences makes the whole window usable by the stream.

use super::{FreeRanges, Range, State};
use crate::driver::Stream;

/// Where a request that fits no mapped range can go, once `pages` are mapped and the stream has
/// waited for `waits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    pub start: u64,
    /// Unmapped pages inside the window (their starts), to map before it can be used.
    pub pages: Vec<u64>,
    /// Other streams whose freed memory the window covers, each with the latest fence of it.
    pub waits: Vec<(Stream, u64)>,
}

/// What a candidate window covers: unmapped pages, and other streams' freed memory.
#[derive(Debug, Default)]
pub(super) struct Cover {
    pub pages: u64,
    pub waits: Vec<(Stream, u64)>,
}

impl FreeRanges {
    /// The best place for `bytes` on `stream` among contiguous free ranges it may use once their
    /// unmapped pages are mapped — and, with `others`, once it has waited for the fences of other
    /// streams' freed memory: the fewest pages to map, then the fewest streams to wait for, then
    /// the lowest address. Candidates are compared by counting; only the chosen window's pages
    /// are listed.
    pub fn window(&self, bytes: u64, stream: Stream, others: bool) -> Option<Window> {
        self.window_aligned(bytes, stream, 512, others)
    }

    /// As [`FreeRanges::window`], for a block starting at a multiple of `align_bytes` (a power of
    /// two: 512, or the page for the carriers of small blocks) from its extent's base.
    pub fn window_aligned(
        &self,
        bytes: u64,
        stream: Stream,
        align_bytes: u64,
        others: bool,
    ) -> Option<Window> {
        let mut best: Option<(u64, usize, u64)> = None; // (pages to map, waits, start)
        let usable = |r: &Range| match r.state {
            State::Unmapped => true,
            State::Freed { .. } if others => true,
            state => state.usable_by(stream),
        };
        let mut run: Option<(u64, u64)> = None;
        let mut runs = Vec::new();
        let starts = self.starts();
        for (s, r) in starts.iter().map(|&s| (s, self.at(s))) {
            let joins = run.is_some_and(|(_, end)| end == s && !self.starts_extent(s));
            match (usable(&r), joins) {
                (true, true) => run = run.map(|(start, _)| (start, s + r.bytes)),
                (true, false) => {
                    runs.extend(run.take());
                    run = Some((s, s + r.bytes));
                }
                (false, _) => runs.extend(run.take()),
            }
        }
        runs.extend(run);
        drop(starts);
        for (start, end) in runs.into_iter().filter(|(s, e)| e - s >= bytes) {
            let base = self.extent_base(start);
            let first = base + (start - base).div_ceil(align_bytes) * align_bytes;
            let last = base + (end - bytes - base) / align_bytes * align_bytes;
            if first > last {
                continue;
            }
            for at in [first, last] {
                let cover = self.cover(at, at + bytes, stream, None);
                let candidate = (cover.pages, cover.waits.len(), at);
                if best.is_none_or(|b| candidate < b) {
                    best = Some(candidate);
                }
            }
        }
        let (_, _, start) = best?;
        let mut pages = Vec::new();
        let waits = self
            .cover(start, start + bytes, stream, Some(&mut pages))
            .waits;
        Some(Window {
            start,
            pages,
            waits,
        })
    }

    /// How many unmapped pages `[start, end)` touches (their starts added to `list` if given),
    /// and the other streams whose freed memory it covers, with their latest fences.
    pub(super) fn cover(
        &self,
        start: u64,
        end: u64,
        stream: Stream,
        mut list: Option<&mut Vec<u64>>,
    ) -> Cover {
        let mut cover = Cover::default();
        for (s, r) in self.overlapping(start, end) {
            match r.state {
                State::Freed { stream: other, seq } if other != stream => {
                    match cover.waits.iter_mut().find(|(s, _)| *s == other) {
                        Some((_, latest)) => *latest = (*latest).max(seq),
                        None => cover.waits.push((other, seq)),
                    }
                    continue;
                }
                State::Unmapped => {}
                _ => continue,
            }
            let mut page = self.page_floor(start.max(s));
            let stop = end.min(s + r.bytes);
            if page >= stop {
                continue;
            }
            cover.pages += (stop - page).div_ceil(self.page_bytes);
            if let Some(list) = list.as_deref_mut() {
                while page < stop {
                    list.push(page);
                    page += self.page_bytes;
                }
            }
        }
        cover
    }
}

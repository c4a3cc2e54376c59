//! Moving a page's physical memory to another address in two halves: its handle is mapped at the
//! new address at once, and the old address is unmapped later, off the allocating thread (by the
//! background thread or a trim), once no work can still use it there. Two kinds of page give
//! their handles this way:
//! - idle pages (in `Ready` ranges: no work uses them): the unmap costs the allocation nothing;
//! - pages a growth's own stream S freed, before S's work on them has completed (GMLake's
//!   stitching, in stream order): S's new work at the new address is queued after its old work
//!   at the old one, so it never sees memory in use; only S's own freed memory is lent (memory
//!   other streams used came back to the resource only once their work was done); the old
//!   address is unmapped once S's fence covering the free has completed (an unmap is not
//!   stream-ordered).
//!
//! Invariants: a retiring page is in no free range any stream may use (`State::Retiring`); a lent
//! handle's new page is freed memory of its stream behind the same fence, never ready memory
//! (so no other stream is handed any part of it before that fence), also when it was blocked
//! and given access later; a move whose new page could not be mapped is undone, never left as a
//! plain spare (which a later growth would map as ready memory); a handle still mapped at a
//! retiring page is never released; its
//! handle is counted once, under its new address in `pages` (or as a spare); a retiring page is
//! unmapped only by the background thread, a trim, a sleep or the teardown, never when a capture
//! is known as it is chosen, and only once the fence it waits for (if any) has completed; an
//! unmap that fails is tried again at the next look. Every unmap is made under the resource's
//! lock, as every other mapping call: on an H200, with the background thread's unmaps made
//! outside it, beside the allocating thread's maps, `cuMemMap` failed (`CUDA_ERROR_UNKNOWN`) in
//! most BERT processes (bench/results/2026-11-30-h200-bert). The background thread hands the
//! lock to a waiting allocation between two unmaps of retired pages, so that the allocation
//! waits for one of those at most, not for all (memory above a release threshold still goes
//! back in one hold).

use super::ranges::State;
use super::{Page, Region, VmmResource, VmmState};
use crate::driver::{DevicePtr, MemHandle, Stream};
use crate::error::Result;
use crate::history::StreampoolEventKind as Event;
use crate::sync::MutexGuard;

/// A page whose handle now backs another address, still mapped at its own until `fence` (a
/// stream and its fence number) completes, or at once if it waits for none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retiring {
    pub page: u64,
    pub region: Region,
    pub fence: Option<(Stream, u64)>,
    pub handle: MemHandle,
}

impl VmmResource {
    /// Whole pages `stream` freed (in either region) outside `[keep.0, keep.1)`, whose handles
    /// a growth for `stream` may take at once.
    pub(super) fn lendable_pages(
        &self,
        st: &VmmState,
        stream: Stream,
        keep: (u64, u64),
    ) -> Vec<u64> {
        let mut pages = st.large.freed_pages(stream, keep.0, keep.1);
        pages.extend(st.carriers.freed_pages(stream, keep.0, keep.1));
        pages
    }

    /// Takes the handle of `page` (whole, inside a ready range or one freed on the growth's
    /// stream): the page retires where it is, and its handle is the caller's to map elsewhere;
    /// with the fence its old work is behind, if any: wherever it is mapped next, it is freed
    /// memory of that stream (usable by the stream at once, by others after the fence), never
    /// ready memory, until the fence completes.
    pub(super) fn retire_page(&self, st: &mut VmmState, page: u64) -> MemHandle {
        let Page { handle, region, .. } = st.pages.remove(&page).expect("a free page is mapped");
        st.counts.moves += 1;
        let fence = match st.region(region).retire(page) {
            State::Freed { stream, seq } => {
                st.counts.lent += 1;
                Some((stream, seq))
            }
            _ => None,
        };
        st.retiring.push(Retiring {
            page,
            region,
            fence,
            handle,
        });
        handle
    }

    /// The state memory backed by `handle` is in: freed on the stream whose old work a moved
    /// handle may still serve (behind that stream's fence, while it is outstanding), else ready.
    pub(super) fn state_of_handle(&self, st: &VmmState, handle: MemHandle) -> State {
        let fences = st.retiring.iter().rev().filter(|r| r.handle == handle);
        let outstanding = fences
            .filter_map(|r| r.fence)
            .find(|&(stream, seq)| st.fences.outstanding(stream, seq));
        match outstanding {
            Some((stream, seq)) => State::Freed { stream, seq },
            None => State::Ready,
        }
    }

    /// A handle that did not end up mapped at its new address (a growth failed): if it was moved
    /// out of a page that still retires, the move is undone — that page has it again, in the
    /// state the page was in (freed behind its fence while that is outstanding, else ready) —
    /// and true; false for any other handle (the caller keeps it as a spare).
    pub(super) fn return_moved(&self, st: &mut VmmState, handle: MemHandle) -> bool {
        let Some(i) = st.retiring.iter().rposition(|r| r.handle == handle) else {
            return false;
        };
        let r = st.retiring.remove(i);
        let state = match r.fence {
            Some((stream, seq)) if st.fences.outstanding(stream, seq) => {
                State::Freed { stream, seq }
            }
            _ => State::Ready,
        };
        let page = Page::alone(r.page, handle, r.region, self.driver.now_ms());
        st.pages.insert(r.page, page);
        st.region(r.region).retag(r.page, State::Retiring, state);
        true
    }

    /// True if `handle` is still mapped at a retiring page (a spare that must not be released
    /// before that unmap).
    pub(super) fn retiring_handle(st: &VmmState, handle: MemHandle) -> bool {
        st.retiring.iter().any(|r| r.handle == handle)
    }

    /// Whether the retiring page `r` still waits for its fence.
    fn waits(st: &VmmState, r: &Retiring) -> bool {
        r.fence
            .is_some_and(|(stream, seq)| st.fences.outstanding(stream, seq))
    }

    /// Unmaps the retiring pages whose fences have completed. Not during a known capture.
    pub(super) fn unmap_retired(&self, st: &mut VmmState) {
        let mut tried = Vec::new();
        while self.unmap_one_retired(st, &mut tried) {}
    }

    /// From the background thread: [`VmmResource::unmap_retired`] a page at a time, the lock
    /// handed to a thread waiting for it between two (an unmap on a busy H200 takes tens of
    /// microseconds, which an allocation waiting for the lock would pay for every page).
    /// False if a panic of another thread's left the state half-updated while the lock was
    /// handed over (the caller stops there).
    pub(super) fn unmap_retired_piecewise(&self, st: &mut MutexGuard<'_, VmmState>) -> bool {
        let mut tried = Vec::new();
        while self.unmap_one_retired(st, &mut tried) {
            st.unlocked_fair(|| {});
            if self.state.is_poisoned() {
                return false;
            }
        }
        true
    }

    /// Unmaps one retiring page whose fence has completed and that is not in `tried` (which it
    /// joins); false if there is none, or a capture is known.
    fn unmap_one_retired(&self, st: &mut VmmState, tried: &mut Vec<u64>) -> bool {
        if st.captures.any_known() {
            return false;
        }
        let due =
            (st.retiring.iter()).position(|r| !tried.contains(&r.page) && !Self::waits(st, r));
        let Some(i) = due else {
            return false;
        };
        let r = st.retiring.remove(i);
        tried.push(r.page);
        let unmapped = (self.driver).mem_unmap(self.device, DevicePtr(r.page), self.page_bytes);
        if let Some(r) = self.unmapped(st, r, unmapped) {
            st.retiring.insert(i, r);
        }
        true
    }

    /// Notes the unmap of the retiring page `r`: unmapped, it is free address space again
    /// (None); if the unmap failed, `r` is returned, to be tried again at the next look.
    fn unmapped(&self, st: &mut VmmState, r: Retiring, result: Result<()>) -> Option<Retiring> {
        match result {
            Ok(()) => {
                st.region(r.region)
                    .retag(r.page, State::Retiring, State::Unmapped);
                self.count(Event::Unmap, r.page, st);
                None
            }
            Err(e) => {
                log::warn!("device {}: unmapping a moved page: {e}", self.device);
                Some(r)
            }
        }
    }
}

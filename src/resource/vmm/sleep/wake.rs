//! Wake: fresh memory mapped where the slept pages were, run by run in address order, a chunk of
//! `WAKE_CHUNK_PAGES` at a time — one handle for the chunk (a span,
//! [`crate::resource::vmm::spans`]) where no spare handle waits and the device has the memory,
//! else a handle a page — and their saved contents copied back on the legacy stream while the
//! next chunk is mapped (on an H200, mapping and giving access to 2 MiB pages one handle each
//! costs about as long as copying them: 1 GiB took 49 ms one after the other, 32 overlapped; in
//! 32 MiB handles the calls cost a tenth, and wake ran at 99% of the host link).
//!
//! Before it maps anything, a wake forgets the slept pages that are wholly free by then — left by
//! blocks freed while asleep, or the rest of a span a live block lay on at the sleep
//! ([`VmmResource::forget_freed_while_asleep`]): they are unmapped free memory from then on, as
//! the idle pages a sleep gave back, mapped when an allocation needs them.
//!
//! Invariants: a page is in the page map once mapped with access; once awake, each slept page is
//! either mapped again or marked unmapped in its region's ranges; its contents are known to be
//! back only once the legacy stream's copies completed; a page whose copy failed, or whose copy
//! could not be waited for, goes back to sleep with its contents still in the host buffer — a
//! span whole, once the copies queued into it are waited for — (or, if it cannot even be
//! unmapped, counts as restored without its contents, and says so in the log); a span's handle
//! is released, never kept as a spare; nothing is handed out before the wake returns (the
//! resource's lock is held throughout).

use super::{HostBytes, SleptPage};
use crate::driver::{DevicePtr, MemHandle, Stream};
use crate::error::Result;
use crate::history::StreampoolEventKind as Event;
use crate::resource::vmm::spans::Mapping;
use crate::resource::vmm::{Caller, Page, VmmResource, VmmState};
use std::collections::HashSet;

/// Pages mapped before their contents are copied back: enough for a copy to run at the link's
/// speed (32 MiB of 2 MiB pages), few enough that the next chunk's mapping overlaps it.
const WAKE_CHUNK_PAGES: usize = 16;

/// The pages a chunk restored, those of them whose copies are in flight, and the error that
/// stopped it part way.
struct Restored {
    pages: Vec<u64>,
    in_flight: Vec<(SleptPage, MemHandle)>,
    outcome: Result<()>,
}

impl VmmResource {
    /// Gives access to the pages an earlier wake mapped without it ([`VmmState::no_access`]).
    pub(super) fn give_access_left(&self, st: &mut VmmState) -> Result<()> {
        if st.no_access.is_empty() {
            return Ok(());
        }
        let mut pages = std::mem::take(&mut st.no_access);
        pages.sort_unstable();
        let devices = self.access_list(st);
        let given = self.set_access(st, &pages, &devices);
        if given.is_err() {
            st.no_access = pages;
        }
        given
    }

    /// Forgets the pages of `asleep` that no block, slot or carrier needs any more (blocks freed
    /// while asleep left them wholly free, their fences complete): each is marked unmapped in its
    /// region, as a page an idle release gave back.
    pub(super) fn forget_freed_while_asleep(&self, st: &mut VmmState, asleep: &mut Vec<SleptPage>) {
        self.return_kept(st);
        self.update_ranges(st, Caller::Program);
        let idle: HashSet<u64> = st.idle_pages((0, 0)).into_iter().collect();
        asleep.retain(|slept| match idle.contains(&slept.page) {
            true => {
                st.region(slept.region).mark_unmapped(slept.page);
                false
            }
            false => true,
        });
    }

    /// Restores `slept` (in address order) from `host`; the pages restored (their contents back),
    /// and the first error. Pages not restored stay asleep.
    pub(super) fn restore(
        &self,
        st: &mut VmmState,
        slept: &[SleptPage],
        host: Option<HostBytes>,
    ) -> (HashSet<u64>, Result<()>) {
        let mut restored = HashSet::new();
        let addresses: Vec<u64> = slept.iter().map(|p| p.page).collect();
        let mut in_flight = Vec::new();
        let mut result = Ok(());
        let chunks = (self.runs(st, &addresses).into_iter()).flat_map(|run| {
            run.clone()
                .step_by(WAKE_CHUNK_PAGES)
                .map(move |from| from..(from + WAKE_CHUNK_PAGES).min(run.end))
        });
        for chunk in chunks {
            let done = self.restore_run(st, &slept[chunk], host);
            restored.extend(done.pages);
            in_flight.extend(done.in_flight);
            if let Err(e) = done.outcome {
                result = Err(e);
                break;
            }
        }
        if in_flight.is_empty() {
            return (restored, result);
        }
        if let Err(e) = self.wait_for_copies() {
            // Their contents may not have arrived: they sleep on, their contents in the buffer.
            let stuck = self.back_to_sleep(st, &in_flight, true);
            for (slept, _) in &in_flight {
                if !stuck.contains(&slept.page) {
                    restored.remove(&slept.page);
                }
            }
            result = result.and(Err(e));
        }
        (restored, result)
    }

    /// Maps fresh pages where the adjacent pages of `run` were, gives access in one call, and
    /// queues their contents' copies back on the legacy stream (a copy for each stretch saved side
    /// by side). Pages mapped before a failure to create or map are restored; a failure to give
    /// access or to queue a copy puts the pages it concerns back to sleep.
    fn restore_run(
        &self,
        st: &mut VmmState,
        run: &[SleptPage],
        host: Option<HostBytes>,
    ) -> Restored {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let (mapped, span, stopped) = self.map_chunk(st, run);
        let pages: Vec<u64> = mapped.iter().map(|(s, _)| s.page).collect();
        let devices = self.access_list(st);
        if !pages.is_empty() {
            if let Err(e) = self.set_access(st, &pages, &devices) {
                let pages = self.back_to_sleep(st, &mapped, false);
                return Restored {
                    pages,
                    in_flight: Vec::new(),
                    outcome: Err(e),
                };
            }
        }
        let now_ms = driver.now_ms();
        let mapping = Mapping {
            first: run[0].page,
            pages: mapped.len() as u64,
        };
        for &(slept, handle) in &mapped {
            let page = match span {
                true => Page::in_mapping(mapping, handle, slept.region, now_ms),
                false => Page::alone(slept.page, handle, slept.region, now_ms),
            };
            st.pages.insert(slept.page, page);
            self.count(Event::Map, slept.page, st);
        }
        st.physical_high_bytes = st
            .physical_high_bytes
            .max(st.physical_bytes(self.page_bytes));
        let Some(host) = host else {
            return Restored {
                pages,
                in_flight: Vec::new(),
                outcome: stopped,
            };
        };
        // Stretches saved side by side (a page not saved is a stretch of its own).
        let saved = |i: usize| mapped[i].0.saved_at;
        let joins =
            |i: usize| saved(i - 1).is_some_and(|at| saved(i) == Some(at + self.page_bytes));
        let mut in_flight = Vec::new();
        for stretch in crate::resource::vmm::runs(mapped.len(), joins) {
            let Some(from) = saved(stretch.start) else {
                continue;
            };
            let at = DevicePtr(mapped[stretch.start].0.page);
            let bytes = stretch.len() as u64 * self.page_bytes;
            if let Err(e) =
                driver.copy_to_device(device, at, host.buffer, from, bytes, Stream::LEGACY)
            {
                if span {
                    // A span is unmapped whole: once the copies queued into it are done, all of
                    // its pages sleep on (their contents still in the buffer).
                    let _ = self.wait_for_copies();
                    return Restored {
                        pages: self.back_to_sleep(st, &mapped, true),
                        in_flight: Vec::new(),
                        outcome: Err(e),
                    };
                }
                // Not restored from here on: these pages sleep on (their contents still in the
                // buffer); the copies queued before are in flight.
                let stuck = self.back_to_sleep(st, &mapped[stretch.start..], true);
                let pages = [&pages[..stretch.start], &stuck[..]].concat();
                return Restored {
                    pages,
                    in_flight,
                    outcome: Err(e),
                };
            }
            in_flight.extend_from_slice(&mapped[stretch]);
        }
        if span && !in_flight.is_empty() {
            // A span goes back to sleep whole if its copies cannot be waited for.
            in_flight = mapped;
        }
        Restored {
            pages,
            in_flight,
            outcome: stopped,
        }
    }

    /// Fresh memory mapped where the adjacent pages of `run` were: one handle for all of them
    /// where no spare handle waits and the device has the memory, else a handle a page (spares
    /// first) until one fails. The pages mapped, whether they share one handle, and the error
    /// that stopped it.
    fn map_chunk(
        &self,
        st: &mut VmmState,
        run: &[SleptPage],
    ) -> (Vec<(SleptPage, MemHandle)>, bool, Result<()>) {
        let (driver, device) = (self.driver.as_ref(), self.device);
        if run.len() > 1 && st.spare_handles.is_empty() {
            let pages = run.len() as u64;
            let bytes = pages * self.page_bytes;
            match self.create_physical(st, bytes) {
                Ok(handle) => {
                    if let Err(e) = driver.mem_map(device, DevicePtr(run[0].page), bytes, handle) {
                        self.put_back_unmapped(st, handle, pages);
                        return (Vec::new(), false, Err(e));
                    }
                    return (run.iter().map(|&s| (s, handle)).collect(), true, Ok(()));
                }
                // A handle a page, as far as the device's memory goes.
                Err(e) if e.is_device_oom() => {}
                Err(e) => return (Vec::new(), false, Err(e)),
            }
        }
        let mut mapped = Vec::with_capacity(run.len());
        for &slept in run {
            let handle = match st.spare_handles.pop() {
                Some(handle) => Ok(handle),
                None => self.create_physical(st, self.page_bytes),
            };
            let handle = match handle {
                Ok(handle) => handle,
                Err(e) => return (mapped, false, Err(e)),
            };
            if let Err(e) = driver.mem_map(device, DevicePtr(slept.page), self.page_bytes, handle) {
                st.spare_handles.push(handle);
                return (mapped, false, Err(e));
            }
            mapped.push((slept, handle));
        }
        (mapped, false, Ok(()))
    }

    /// Unmaps the `mapped` pages of a run that cannot be restored, a handle at a time (a span
    /// whole), single pages' handles spares again and spans' released (`booked`: they were in
    /// the page map, and leave it); the pages that could not even be unmapped (two driver
    /// failures), which are taken as restored without their contents — those never given access
    /// (not `booked`) get it at the next wake ([`VmmResource::give_access_left`]), which must
    /// succeed before the device is awake again.
    fn back_to_sleep(
        &self,
        st: &mut VmmState,
        mapped: &[(SleptPage, MemHandle)],
        booked: bool,
    ) -> Vec<u64> {
        let (driver, device) = (self.driver.as_ref(), self.device);
        let mut stuck = Vec::new();
        let mut rest = mapped;
        while let Some(&(first, handle)) = rest.first() {
            let n = rest.iter().take_while(|&&(_, h)| h == handle).count();
            let (group, after) = rest.split_at(n);
            rest = after;
            let mapping = Mapping {
                first: first.page,
                pages: n as u64,
            };
            let bytes = mapping.pages * self.page_bytes;
            if driver
                .mem_unmap(device, DevicePtr(first.page), bytes)
                .is_ok()
            {
                for &(slept, _) in group.iter().filter(|_| booked) {
                    st.pages.remove(&slept.page);
                    self.count(Event::Unmap, slept.page, st);
                }
                self.put_back_unmapped(st, handle, mapping.pages);
                continue;
            }
            log::error!(
                "device {device}: {n} page(s) at {:#x} could not be restored nor unmapped at wake",
                first.page
            );
            for &(slept, _) in group {
                if !booked {
                    let now_ms = driver.now_ms();
                    let page = Page::in_mapping(mapping, handle, slept.region, now_ms);
                    st.pages.insert(slept.page, page);
                    // Mapped without access: given it at the next wake, before any use.
                    st.no_access.push(slept.page);
                }
                stuck.push(slept.page);
            }
        }
        stuck
    }
}

//! streampool's own virtual-memory pool (`STREAMPOOL_BACKEND=vmm`): one address range per device,
//! shared by every stream and every block size, backed page by page with physical handles
//! (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`).
//!
//! - Large blocks are placed by best fit in the free ranges ([`large`], [`ranges`]); small
//!   blocks (up to `small_max_bytes`) are carved out of whole pages, their carriers ([`small`]),
//!   in a region of the address space of their own, so that they do not split the ranges large
//!   blocks need, and a block may span adjacent ones (or, before that region grows, in a hole of
//!   at most two pages between large blocks, a handle a page); an emptied page of a carrier is an
//!   idle page again. The smallest (up to 16
//!   KiB) are slots of slabs cut from carriers, each of one stream and one size class: a freed
//!   slot serves its stream, and other streams get its memory once its slab, emptied, goes back
//!   ([`slabs`]).
//! - A block freed on stream S is reusable on S at once, on another stream T at once after T
//!   waits on the GPU for S's fence (`cuStreamWaitEvent`, no CPU wait), and on every stream once
//!   the fence has completed ([`crate::stream_order`]); freed on S, it takes in the ready memory
//!   around it, so that S sees one free block. The block freed last waits in a slot for its
//!   stream's next request of its size ([`slot`]); nothing is cached in front of the resource.
//! - A request that fits no mapped range gets a window of free addresses (which may cover memory
//!   other streams freed, once the stream has waited on the GPU for their fences) whose unmapped
//!   pages are backed ([`mapping`]) by spare handles, then by handles moved out of cold idle
//!   pages (unused for `cold_after_ms`), then by new handles, and only when the growth slack,
//!   the device (less the headroom kept for the CUDA runtime) or the cap is reached by handles
//!   moved out of any idle page or out of pages the stream itself freed (mapped at once, the old
//!   address unmapped once no work can use it there: [`lending`]); a growth that found the
//!   device full gives idle pages back until it has room again ([`growth`]).
//! - Nothing is released on the allocating thread but after a growth that found the device full:
//!   memory above the release threshold is released once unused for a second, and all idle
//!   memory once the device is idle, by the device's background thread
//!   ([`VmmResource::release_above_threshold`], [`VmmResource::release_idle`]), which records
//!   nothing on the program's streams; `trim` after a synchronisation (empty_cache).
//!
//! Invariants: a page is unmapped only once no work uses it — it lies in a `Ready` range, whose
//! fences have completed, or it retires after its handle moved ([`lending`]); every mapping gives
//! the device and every granted peer access before any block in it is handed out; physical memory
//! never exceeds the pool cap nor the device's memory limit (`set_per_process_memory_fraction`); no
//! fence is recorded on a stream that is capturing (a free on it only takes the number of the
//! stream's next fence, recorded after the capture); while a capture is known on the device nothing
//! is unmapped, and what is mapped, or queried (fences of streams that are not capturing, from a
//! thread of the program), is done in relaxed capture mode, as PyTorch makes its graph pools'
//! `cudaMalloc`; the resource asks the driver when the capture has ended — a stream the driver
//! cannot answer for (destroyed) is not capturing; the resource's lock is held across map and unmap
//! calls; the device takes it inside its own lock only with `try_lock`, for the fast path (a slot,
//! a fit, a free, and at most a fence recorded and queried: calls that return at once), never
//! waiting for it there, and the resource never takes the device's lock (a panic on that path
//! disables the whole device).

mod backing;
mod clock;
mod export;
mod growth;
mod interface;
mod large;
mod lending;
mod live;
mod mapping;
mod order;
mod ranges;
mod release;
mod settings;
mod slabs;
mod sleep;
mod slot;
mod small;
mod spans;

use crate::config::VMM_RELEASE_AFTER_MS as RELEASE_AFTER_MS;
use crate::driver::{DevicePtr, Driver, MemHandle, Stream};
use crate::error::{Error, Result};
use crate::history::Recorder;
use crate::stream_order::{CaptureWatch, Fences, SyncMarks};
use crate::sync::Mutex;
use crate::units::{format_bytes, format_limit};
use ranges::{FreeRanges, State};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use mapping::DriverCounts;
pub use settings::VmmSettings;
use settings::ADDRESS_SPACE_PER_DEVICE_MEMORY;

/// A free records its stream's fence only if the last one is this old (see [`Fences`]): a loop
/// that frees all the time pays one event record (and one poll) a millisecond, not one a free.
const FENCE_INTERVAL_US: u64 = 1000;

/// Hot fields first, then the lock and its state (hot fields first too): a call touches few cache
/// lines (docs/replay.md, "Cache lines"). `Drop` tears the state down, whatever the field order.
#[repr(C, align(64))]
pub struct VmmResource {
    small_max_bytes: u64,
    /// Blocks up to this are slots of slabs ([`slabs`]); 0 where carriers cannot hold a slab.
    slab_max_bytes: u64,
    page_bytes: u64,
    device: usize,
    driver: Arc<dyn Driver>,
    state: Mutex<VmmState>,
    /// The most pages one new handle backs, if set ([`spans`]; 1: no spans; `None`: auto).
    span_pages: Option<u64>,
    extent_bytes: u64,
    max_physical_bytes: u64,
    device_total_bytes: u64,
    cold_after_ms: u64,
    growth_slack_percent: Option<u64>,
    headroom_bytes: u64,
    /// Its pages are created exportable to POSIX file descriptors (where the device can), so
    /// that any block can be shared with another process ([`export`]).
    exportable: bool,
    /// The device's memory limit (`set_per_process_memory_fraction`), shared with the device.
    limit_bytes: Arc<AtomicU64>,
    /// Asleep (`state.asleep` is set), for readers that must not wait for the lock, which a sleep
    /// or a wake holds through its copies: written under the lock, true until a wake succeeds.
    asleep_now: std::sync::atomic::AtomicBool,
    recorder: Arc<Recorder>,
    release_threshold_bytes: AtomicU64,
}

/// The two parts of the address space: one for large blocks, one for the carriers of small
/// blocks (so that a carrier never splits a range large blocks need); pages move between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Large,
    Carriers,
}

/// A mapped page: its handle, the mapping that handle makes (this page alone, or a span of
/// adjacent pages: [`spans`]), its region, and when it was mapped (its last use is the later of
/// that and the page clock's mark: [`VmmState::last_used_ms`]).
#[derive(Debug, Clone, Copy)]
struct Page {
    handle: MemHandle,
    mapping: spans::Mapping,
    region: Region,
    mapped_ms: u64,
}

impl Page {
    /// A page mapped alone (its handle backs it and nothing else).
    fn alone(page: u64, handle: MemHandle, region: Region, mapped_ms: u64) -> Page {
        let mapping = spans::Mapping {
            first: page,
            pages: 1,
        };
        Page::in_mapping(mapping, handle, region, mapped_ms)
    }

    /// A page of `mapping`, backed by its `handle`.
    fn in_mapping(
        mapping: spans::Mapping,
        handle: MemHandle,
        region: Region,
        mapped_ms: u64,
    ) -> Page {
        Page {
            handle,
            mapping,
            region,
            mapped_ms,
        }
    }

    /// Its last use, given its page clock mark (0: never marked): the later of the two.
    #[inline]
    fn last_used_ms(&self, mark_ms: u64) -> u64 {
        self.mapped_ms.max(mark_ms)
    }
}

/// In the order the fast paths read it: the slot, counts, live blocks, fences, then the ranges.
#[derive(Default)]
#[repr(C)]
struct VmmState {
    /// The block freed last, kept aside for its stream's next request of its size ([`slot`]).
    slot: Option<slot::Slot>,
    used_bytes: u64,
    used_high_bytes: u64,
    /// The most in use since a trim asked for (`empty_cache()`, `streampool.trim()`, the flush
    /// before an out-of-memory retry) last gave memory back, or the device last idled; the
    /// release threshold's trims keep it, and it is not reset with the peaks: the growth slack's
    /// measure ([`growth`]).
    used_max_bytes: u64,
    /// Live blocks, to check frees against.
    live: live::Live,
    fences: Fences,
    /// Whether more than one stream allocated or freed since the program last synchronised
    /// ([`slot`]): only then has a settling at a synchronisation anything to give (where one
    /// stream alone allocates and frees, its frees serve it at once).
    streams_since_sync: slot::StreamsSinceSync,
    /// Asleep: every page given back, the addresses kept ([`sleep`]).
    asleep: Option<sleep::Asleep>,
    /// The slabs cut from carriers for the smallest blocks ([`slabs`]).
    slabs: slabs::Slabs,
    /// The free ranges inside carriers: each carrier (a run of adjacent pages, or a page of a
    /// hole) is an extent.
    small: FreeRanges,
    /// The carriers taken out of a hole of the large blocks' ranges ([`small`]), by page.
    hole_carriers: crate::fasthash::WordTable<()>,
    /// The free ranges of the large blocks' part of the address space.
    large: FreeRanges,
    /// When each page of the reservations was last marked used by a free ([`clock`]).
    clock: clock::PageClock,
    /// The free pages of the carriers' part (a carrier is taken out of it while in use).
    carriers: FreeRanges,
    /// Mapped pages.
    pages: BTreeMap<u64, Page>,
    /// Handles taken out of pages and not mapped again yet (counted as reserved).
    spare_handles: Vec<MemHandle>,
    /// Spans unmapped whose handles the driver would not release: released at the next try,
    /// never mapped again (counted as reserved; [`spans`]). Their handles and pages.
    spare_spans: Vec<(MemHandle, u64)>,
    /// Pages whose handles were lent to other addresses, to unmap once their fences complete
    /// ([`lending`]).
    retiring: Vec<lending::Retiring>,
    physical_high_bytes: u64,
    /// Streams of the device known to capture a graph (from the device's allocations on them):
    /// while one still does, nothing is unmapped, and what is mapped or queried is done in relaxed
    /// capture mode.
    captures: CaptureWatch,
    /// The fences' marks ([`Fences::mark`]) threads noted as their synchronisations of the
    /// device began ([`order`]).
    sync_marks: SyncMarks,
    /// Devices other than its own with access.
    peers: Vec<usize>,
    /// Some pages are blocked (mapped without access): updating the ranges tries to fix them.
    blocked: bool,
    counts: DriverCounts,
    /// The device's free memory as last read ([`growth`]).
    free_seen: Option<growth::FreeSeen>,
    /// A growth found the device full (its free memory less the headroom bounded it, and idle
    /// pages were moved): the allocation releases the surplus before it returns.
    device_full: bool,
    /// The most held before a trim after a synchronisation, or a sleep, gave memory back since
    /// the device last idled (0 before one did, and after an idle release): until as much is
    /// held again, memory cycles — given back, mapped again — and new memory comes in spans if
    /// their size is auto ([`spans`]).
    cycle_back_to_bytes: u64,
    /// As `cycle_back_to_bytes`, for the give-backs that repeat by nature — the release
    /// threshold's at a synchronisation, a sleep — only: memory mapped ahead of a block fills
    /// up to it ([`spans`]). An `empty_cache()` may end a phase as well as a loop's step, and
    /// the next phase, smaller, would fill the earlier one's peak.
    ahead_back_to_bytes: u64,
    /// Memory went back (a trim, a sleep) since the device last idled: after that, a trim
    /// asked for (`empty_cache()`) starts a cycle too, not only the threshold's ([`spans`]).
    given_back_since_idle: bool,
    /// The most physical memory ever created for (not reset with the peaks).
    physical_max_bytes: u64,
    /// Awake: the host buffer of the last level-1 sleep, kept for the next one ([`sleep`]).
    sleep_buffer: Option<sleep::HostBytes>,
    /// Pages a failed wake mapped but could neither give access to nor unmap (two driver
    /// failures): the next wake gives them access before the device is awake ([`sleep`]).
    no_access: Vec<u64>,
    /// Sleeps so far: an export whose pages were read before the last one shares other pages
    /// ([`export`]).
    sleeps: u64,
}

impl VmmState {
    /// When the mapped page at `page` was last used: marked by a free ([`clock`]), or made.
    fn last_used_ms(&self, page: u64) -> u64 {
        self.pages[&page].last_used_ms(self.clock.get(page))
    }

    fn physical_bytes(&self, page_bytes: u64) -> u64 {
        let spans: u64 = self.spare_spans.iter().map(|&(_, pages)| pages).sum();
        ((self.pages.len() + self.spare_handles.len()) as u64 + spans) * page_bytes
    }

    fn region(&mut self, region: Region) -> &mut FreeRanges {
        match region {
            Region::Large => &mut self.large,
            Region::Carriers => &mut self.carriers,
        }
    }

    /// Idle pages of both regions (the large blocks' smallest holes first, then the carriers'
    /// region's), none inside `[keep.0, keep.1)`.
    fn idle_pages(&self, keep: (u64, u64)) -> Vec<u64> {
        let mut pages = self.large.idle_pages(keep.0, keep.1);
        pages.extend(self.carriers.idle_pages(keep.0, keep.1));
        pages
    }

    /// Pages blocked (mapped without access) in either region.
    fn blocked_pages(&self) -> Vec<(Region, u64)> {
        let large = self.large.blocked_pages().into_iter();
        let carriers = self.carriers.blocked_pages().into_iter();
        large
            .map(|p| (Region::Large, p))
            .chain(carriers.map(|p| (Region::Carriers, p)))
            .collect()
    }
}

/// Who looks at the ranges ([`VmmResource::update_ranges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// A thread of the program (a trim, a synchronisation, a sleep): it may record fences on its
    /// streams.
    Program,
    /// A thread of the program at an allocation that found nothing free: as `Program`, but it
    /// polls the fences of a bounded number of streams ([`crate::stream_order::Fences::poll_some`];
    /// during a known capture, every stream's, as `Program`). Memory freed on streams it did not
    /// reach is still lent behind a GPU-side wait.
    Miss,
    /// The device's background thread: it records no fence on the program's streams (one may
    /// begin a capture at any moment); streams that have finished all their work complete their
    /// pending fences instead.
    Background,
}

impl VmmResource {
    /// The resource of `device` (of `total_bytes` memory), with its first address reservation.
    pub fn create(
        driver: &Arc<dyn Driver>,
        device: usize,
        settings: &VmmSettings,
        total_bytes: u64,
        limit_bytes: Arc<AtomicU64>,
        recorder: Arc<Recorder>,
    ) -> Result<Arc<VmmResource>> {
        if !driver.vmm_supported(device)? {
            return Err(Error::DriverUnavailable(format!(
                "device {device} does not support CUDA virtual memory management \
                 (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): set \
                 STREAMPOOL_BACKEND=pool"
            )));
        }
        let (page_bytes, extent_bytes, spec) =
            (settings.page_bytes, settings.extent_bytes, settings.spec);
        let resource = Arc::new(VmmResource {
            driver: Arc::clone(driver),
            device,
            page_bytes,
            span_pages: spec.span_max_bytes.map(|b| (b / page_bytes).max(1)),
            small_max_bytes: spec.small_max_bytes,
            slab_max_bytes: match spec.small_max_bytes >= slabs::SLAB_BYTES
                && page_bytes >= slabs::SLAB_BYTES
            {
                true => slabs::SLAB_MAX_BYTES,
                false => 0,
            },
            extent_bytes,
            max_physical_bytes: spec.max_physical_bytes,
            device_total_bytes: total_bytes,
            cold_after_ms: spec.cold_after_ms,
            growth_slack_percent: spec.growth_slack_percent,
            headroom_bytes: spec.headroom_bytes,
            exportable: driver.mem_export_supported(device).unwrap_or(false),
            limit_bytes,
            asleep_now: Default::default(),
            recorder,
            state: Mutex::new(VmmState {
                large: FreeRanges::new(page_bytes),
                carriers: FreeRanges::new(page_bytes),
                small: FreeRanges::new(page_bytes),
                clock: clock::PageClock::new(page_bytes),
                ..VmmState::default()
            }),
            release_threshold_bytes: AtomicU64::new(spec.release_threshold_bytes),
        });
        resource.reserve(&mut resource.state.lock(), Region::Large, extent_bytes)?;
        let carrier_bytes = (extent_bytes / ADDRESS_SPACE_PER_DEVICE_MEMORY).max(page_bytes);
        resource.reserve(&mut resource.state.lock(), Region::Carriers, carrier_bytes)?;
        log::info!(
            "device {device}: created the virtual memory resource ({} pages, blocks up to {} on \
             shared pages, {} of addresses, release threshold {})",
            format_bytes(page_bytes),
            format_bytes(resource.small_max_bytes),
            format_bytes(extent_bytes),
            format_limit(spec.release_threshold_bytes),
        );
        Ok(resource)
    }

    /// Reserves another extent of at least `bytes` of addresses for `region`.
    fn reserve(&self, st: &mut VmmState, region: Region, bytes: u64) -> Result<()> {
        let bytes = bytes.div_ceil(self.page_bytes) * self.page_bytes;
        let base = self.driver.address_reserve(self.device, bytes)?;
        st.region(region).add_extent(base.0, bytes);
        st.clock.add_extent(base.0, bytes);
        Ok(())
    }

    /// The physical memory it may hold: the pool cap and the device's memory limit.
    fn physical_cap_bytes(&self) -> u64 {
        self.max_physical_bytes
            .min(self.limit_bytes.load(Ordering::Relaxed))
    }

    /// True while a known capture is under way on the device (ended ones are forgotten: asking
    /// whether a stream captures is allowed during a capture). A stream the driver cannot answer
    /// for (destroyed, say) is not capturing: a capture ends before its stream can be destroyed.
    fn capturing(&self, st: &mut VmmState) -> bool {
        st.captures.refresh(self.driver.as_ref(), self.device)
    }

    /// Ledger `[start, start + bytes)` as a live block, with the allocating thread's tag
    /// ([`crate::tag`]). (Its pages are marked used when it is freed: until then they are not
    /// idle, whatever their mark.)
    #[inline(always)]
    fn hand_out(&self, st: &mut VmmState, start: u64, bytes: u64) -> DevicePtr {
        st.live.insert(start, bytes, crate::tag::current());
        st.used_bytes += bytes;
        st.used_high_bytes = st.used_high_bytes.max(st.used_bytes);
        st.used_max_bytes = st.used_max_bytes.max(st.used_bytes);
        DevicePtr(start)
    }

    /// Gives a freed block back to the ranges it came from, in `state`.
    fn give_back(&self, st: &mut VmmState, start: u64, bytes: u64, state: State, now_ms: u64) {
        if self.in_slab(bytes) {
            return self.give_to_slab(st, start, state, now_ms);
        }
        match bytes <= self.small_max_bytes {
            true => self.give_small(st, start, bytes, state, now_ms),
            false => {
                st.large.give(start, bytes, state);
                st.clock.mark(start, bytes, now_ms);
            }
        }
    }

    /// The resource's lock for an entry point, unless a panic while it was held left the state
    /// half-updated: then every entry that maps, hands out or takes back memory refuses
    /// (`crate::sync::Mutex`; views stay readable).
    #[inline]
    fn lock_enabled(&self) -> Result<crate::sync::MutexGuard<'_, VmmState>> {
        match self.state.lock_unpoisoned() {
            Some(st) => Ok(st),
            None => Err(Error::Disabled {
                device: self.device,
                part: "virtual-memory resource",
            }),
        }
    }

    /// The resource's lock if it is free now and no panic poisoned it (the fast path: the caller
    /// falls back to the calls that wait for it, and report a poisoned state).
    #[inline(always)]
    fn try_lock_enabled(&self) -> Option<crate::sync::MutexGuard<'_, VmmState>> {
        let Some(st) = self.state.try_lock() else {
            // (Counted in the call-counting build: how often the fast path finds it held.)
            return timed_section!("vmm fast path: lock held", None);
        };
        (!self.state.is_poisoned()).then_some(st)
    }

    /// A block of `bytes` that `stream` may use at once without a driver call: a fit in a
    /// carrier or a whole free page for a new carrier (small), a mapped range (large).
    #[inline]
    fn take_at_hand(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Option<u64> {
        if self.in_slab(bytes) {
            return self.slot_at_hand(st, bytes, stream);
        }
        if bytes <= self.small_max_bytes {
            return self.carve_at_hand(st, bytes, stream);
        }
        let start = st.large.best_fit(bytes, stream)?;
        st.large.take(start, bytes);
        Some(start)
    }

    /// True if a block of `bytes` is a slot of a slab ([`slabs`]): 1 to `slab_max_bytes` (none
    /// where slabs are off).
    #[inline(always)]
    fn in_slab(&self, bytes: u64) -> bool {
        (1..=self.slab_max_bytes).contains(&bytes)
    }
}

/// `0..len` cut into runs: item `i` joins the run of item `i - 1` where `joins(i)`.
fn runs(len: usize, joins: impl Fn(usize) -> bool) -> impl Iterator<Item = std::ops::Range<usize>> {
    let mut start = 0;
    (1..=len).filter_map(move |i| {
        if i < len && joins(i) {
            return None;
        }
        let run = start..i;
        start = i;
        Some(run)
    })
}

#[cfg(all(test, feature = "sim"))]
mod tests;

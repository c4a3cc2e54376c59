//! A model of PyTorch's caching allocator with expandable segments
//! (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`), replayed beside streampool's backends so
//! that "at or below expandable segments" can be judged on the CPU (docs/replay.md, "Expandable
//! segments, modeled"). It keeps PyTorch's rules as `CUDACachingAllocator.cpp` states them:
//! - a request is rounded up to 512 B; up to 1 MiB it goes to its stream's small pool, above to
//!   its large pool; each pool is one segment of virtual addresses mapped in granules of 2 MiB
//!   (small) or 20 MiB (large);
//! - best fit over the pool's free blocks by (size, address), except that a free block followed
//!   by unmapped space counts as the size it could grow to, so a block that fits without growing
//!   is taken first;
//! - with no fit, the segment grows: the first unmapped block (by address) with enough free and
//!   unmapped space from the free block before it gets the granules the request
//!   still lacks mapped, merged with that free block;
//! - the block found is split when what is left is at least 512 B (in both pools: with
//!   expandable segments PyTorch splits large blocks so too), the request at its low end; a free
//!   merges with free neighbours;
//! - a block used on another stream (`r`) is reusable only once that stream's work is done:
//!   here, at the next device synchronisation (PyTorch asks its events at each allocation, so the
//!   model holds such blocks a little longer than PyTorch does);
//! - `empty_cache()` unmaps every whole granule inside a free block.
//!
//! Invariant: blocks of a segment tile its address space (no gap, no overlap), a free block is
//! in the pool's size index and only there, and mapped bytes are the sum of the mapped granules;
//! the peak is read after every allocation, above the mapped bytes after the trace's
//! `before_start` allocations, as the replay measures streampool.

use super::run::{Outcome, Setting};
use super::trace::{Event, Trace, IN_TRACE, WORKSPACE_BYTES};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The setting that selects this model in `--config`.
const VARIABLE: &str = "PYTORCH_CUDA_ALLOC_CONF";
const VALUE: &str = "expandable_segments:True";

const MIN_BLOCK_BYTES: u64 = 512;
const SMALL_MAX_BYTES: u64 = 1 << 20;
const SMALL_GRANULE_BYTES: u64 = 2 << 20;
const LARGE_GRANULE_BYTES: u64 = 20 << 20;
/// A segment's address space: far above any trace's memory.
const SEGMENT_BYTES: u64 = 1 << 46;
/// The largest request the model takes: a segment always keeps an unmapped block above it.
const MAX_REQUEST_BYTES: u64 = 1 << 45;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Free,
    Used,
    Unmapped,
    /// Freed, used on another stream, waiting for that stream's work.
    Waiting,
}

/// One pool's expandable segment.
struct Segment {
    granule_bytes: u64,
    /// Address -> (size, kind); the blocks tile [0, SEGMENT_BYTES).
    blocks: BTreeMap<u64, (u64, Kind)>,
    /// (size, address) of every free block.
    free: BTreeSet<(u64, u64)>,
    /// The address of every unmapped block (PyTorch keeps them in address order).
    unmapped: BTreeSet<u64>,
}

impl Segment {
    fn new(granule_bytes: u64) -> Segment {
        Segment {
            granule_bytes,
            blocks: BTreeMap::from([(0, (SEGMENT_BYTES, Kind::Unmapped))]),
            free: BTreeSet::new(),
            unmapped: BTreeSet::from([0]),
        }
    }

    fn set(&mut self, addr: u64, size: u64, kind: Kind) {
        if let Some((old_size, old_kind)) = self.blocks.insert(addr, (size, kind)) {
            self.unindex(addr, old_size, old_kind);
        }
        match kind {
            Kind::Free => self.free.insert((size, addr)),
            Kind::Unmapped => self.unmapped.insert(addr),
            Kind::Used | Kind::Waiting => true,
        };
    }

    fn remove(&mut self, addr: u64) -> (u64, Kind) {
        let (size, kind) = self.blocks.remove(&addr).expect("a block at the address");
        self.unindex(addr, size, kind);
        (size, kind)
    }

    fn unindex(&mut self, addr: u64, size: u64, kind: Kind) {
        match kind {
            Kind::Free => self.free.remove(&(size, addr)),
            Kind::Unmapped => self.unmapped.remove(&addr),
            Kind::Used | Kind::Waiting => true,
        };
    }

    fn prev(&self, addr: u64) -> Option<(u64, u64, Kind)> {
        let (&a, &(s, k)) = self.blocks.range(..addr).next_back()?;
        Some((a, s, k))
    }

    /// The block at `addr` as `kind`, merged with neighbours of the same kind (free or
    /// unmapped); its address after the merge.
    fn settle(&mut self, addr: u64, kind: Kind) -> u64 {
        let (mut start, mut size) = (addr, self.remove(addr).0);
        if let Some((a, s, k)) = self.prev(start) {
            if k == kind && matches!(kind, Kind::Free | Kind::Unmapped) {
                self.remove(a);
                (start, size) = (a, s + size);
            }
        }
        if let Some(&(s, k)) = self.blocks.get(&(start + size)) {
            if k == kind && matches!(kind, Kind::Free | Kind::Unmapped) {
                self.remove(start + size);
                size += s;
            }
        }
        self.set(start, size, kind);
        start
    }

    /// What a free block could grow to for best fit: its size, and the unmapped block after it.
    fn growable(&self, addr: u64, size: u64) -> u64 {
        match self.blocks.get(&(addr + size)) {
            Some(&(s, Kind::Unmapped)) => size + s,
            _ => size,
        }
    }

    /// PyTorch's best fit (`get_free_block`): the first free block of at least `size` by (size,
    /// address), moved on while the next one could grow to less.
    fn best_fit(&self, size: u64) -> Option<u64> {
        let mut it = self.free.range((size, 0)..);
        let &(mut s, mut a) = it.next()?;
        for &(ns, na) in it {
            if self.growable(na, ns) >= self.growable(a, s) {
                break;
            }
            (s, a) = (ns, na);
        }
        Some(a)
    }

    /// PyTorch's `find_expandable_block`: the first unmapped block by address, started at the
    /// free block before it if there is one, with `size` bytes of free and unmapped blocks from
    /// there (the segment's last unmapped block ends it, larger than any request `malloc`
    /// takes).
    fn expandable(&self, size: u64) -> u64 {
        for &a in &self.unmapped {
            let start = match self.prev(a) {
                Some((p, _, Kind::Free)) => p,
                _ => a,
            };
            let (mut at, mut room) = (start, 0u64);
            while room < size {
                match self.blocks.get(&at) {
                    Some(&(s, Kind::Free | Kind::Unmapped)) => (at, room) = (at + s, room + s),
                    _ => break,
                }
            }
            if room >= size {
                return start;
            }
        }
        unreachable!("the segment's last unmapped block is larger than any request")
    }

    /// Maps the first granules of the unmapped block at `addr` that cover `bytes`, merged with
    /// free neighbours; returns (the free block's address, bytes newly mapped).
    fn map(&mut self, addr: u64, bytes: u64) -> (u64, u64) {
        let (size, kind) = self.blocks[&addr];
        debug_assert_eq!(kind, Kind::Unmapped);
        let mapped = bytes.div_ceil(self.granule_bytes) * self.granule_bytes;
        let mapped = mapped.min(size);
        self.remove(addr);
        if mapped < size {
            self.set(addr + mapped, size - mapped, Kind::Unmapped);
        }
        self.set(addr, mapped, Kind::Free);
        (self.settle(addr, Kind::Free), mapped)
    }

    /// PyTorch's `empty_cache()` on this segment: every whole granule inside a free block
    /// unmapped; returns the bytes unmapped.
    fn unmap_free(&mut self) -> u64 {
        let g = self.granule_bytes;
        let frees: Vec<(u64, u64)> = self.free.iter().map(|&(s, a)| (a, s)).collect();
        let mut unmapped = 0;
        for (a, s) in frees {
            let (lo, hi) = (a.div_ceil(g) * g, (a + s) / g * g);
            if hi <= lo {
                continue;
            }
            self.remove(a);
            if lo > a {
                self.set(a, lo - a, Kind::Free);
            }
            if a + s > hi {
                self.set(hi, a + s - hi, Kind::Free);
            }
            self.set(lo, hi - lo, Kind::Unmapped);
            self.settle(lo, Kind::Unmapped);
            unmapped += hi - lo;
        }
        unmapped
    }
}

/// The model's state: a segment per (stream, small), what is live, what is mapped.
#[derive(Default)]
struct Model {
    segments: HashMap<(u32, bool), Segment>,
    /// Trace ID -> (pool, address, whether a stream besides its own used it).
    live: HashMap<u64, ((u32, bool), u64, bool)>,
    waiting: Vec<((u32, bool), u64)>,
    mapped_bytes: u64,
}

impl Model {
    /// An allocation; a request the model's segment cannot hold (above [`MAX_REQUEST_BYTES`]) is
    /// refused, changing nothing.
    fn malloc(&mut self, id: u64, bytes: u64, stream: u32) -> Result<(), String> {
        let size = match bytes.max(1).div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES {
            size if bytes <= MAX_REQUEST_BYTES => size,
            _ => {
                return Err(format!(
                    "allocation {id} of {bytes} B: above the model's segment"
                ))
            }
        };
        let small = size <= SMALL_MAX_BYTES;
        let granule = match small {
            true => SMALL_GRANULE_BYTES,
            false => LARGE_GRANULE_BYTES,
        };
        let seg = (self.segments.entry((stream, small))).or_insert_with(|| Segment::new(granule));
        let addr = match seg.best_fit(size) {
            Some(addr) => addr,
            None => {
                // Grow: from the free block before the unmapped one, granules until it fits.
                let mut at = seg.expandable(size);
                if seg.blocks[&at].1 == Kind::Unmapped {
                    let (a, m) = seg.map(at, size);
                    (at, self.mapped_bytes) = (a, self.mapped_bytes + m);
                }
                while seg.blocks[&at].0 < size {
                    let have = seg.blocks[&at].0;
                    let (a, m) = seg.map(at + have, size - have);
                    (at, self.mapped_bytes) = (a, self.mapped_bytes + m);
                }
                at
            }
        };
        let (found, _) = seg.remove(addr);
        let left = found - size;
        match left >= MIN_BLOCK_BYTES {
            true => {
                seg.set(addr, size, Kind::Used);
                seg.set(addr + size, left, Kind::Free);
            }
            false => seg.set(addr, found, Kind::Used),
        }
        self.live.insert(id, ((stream, small), addr, false));
        Ok(())
    }

    fn free(&mut self, id: u64) {
        let (pool, addr, used_elsewhere) = self.live.remove(&id).expect("a live allocation");
        let seg = self.segments.get_mut(&pool).expect("its segment");
        match used_elsewhere {
            true => {
                let size = seg.blocks[&addr].0;
                seg.set(addr, size, Kind::Waiting);
                self.waiting.push((pool, addr));
            }
            false => {
                seg.settle(addr, Kind::Free);
            }
        }
    }

    fn record(&mut self, id: u64, stream: u32) {
        if let Some(entry) = self.live.get_mut(&id) {
            entry.2 |= entry.0 .0 != stream;
        }
    }

    fn synchronize(&mut self) {
        for (pool, addr) in std::mem::take(&mut self.waiting) {
            let seg = self.segments.get_mut(&pool).expect("its segment");
            seg.settle(addr, Kind::Free);
        }
    }

    fn empty_cache(&mut self) {
        self.synchronize();
        for seg in self.segments.values_mut() {
            self.mapped_bytes -= seg.unmap_free();
        }
    }
}

/// True if `setting` asks for this model (it names [`VARIABLE`]).
pub fn selected(setting: &Setting) -> bool {
    setting.env.iter().any(|(k, _)| k == VARIABLE)
}

/// A setting of the model must say only that.
pub fn check(setting: &Setting) -> Result<(), String> {
    match setting.env.as_slice() {
        [(k, v)] if k == VARIABLE && v == VALUE => Ok(()),
        _ => Err(format!(
            "configuration {:?}: {VARIABLE} replays PyTorch's expandable segments as a model, \
             alone: `{}:{VARIABLE}={VALUE}` with no other variable (--env included)",
            setting.name, setting.name
        )),
    }
}

/// Replays `trace` through the model: the outcome's peak reserved bytes (the most mapped, above
/// the live bytes of the allocations made before the start: what was held idle from the start
/// counts, as in the benchmark) and its live peak; no driver calls nor times. A request the
/// model cannot hold is the outcome's error.
pub fn replay(trace: &Trace, out: &mut Outcome) {
    if let Err(e) = replay_events(trace, out) {
        out.error = Some(e);
    }
    out.timing = "none (a model of memory only)".into();
}

fn replay_events(trace: &Trace, out: &mut Outcome) -> Result<(), String> {
    let mut m = Model::default();
    let mut before_bytes = 0u64;
    // cuBLAS's workspace of the default stream, made by the benchmark's warm-up before the
    // trace began (unless the trace holds it), came first in the segment the workload grows.
    if trace.before_start.is_empty() && !trace.headers.iter().any(|h| h == IN_TRACE) {
        m.malloc(u64::MAX, WORKSPACE_BYTES, 0)?;
        before_bytes += WORKSPACE_BYTES;
    }
    for event in &trace.events {
        if let Event::Alloc { id, bytes, stream } = *event {
            if trace.before_start.contains(&id) {
                m.malloc(id, bytes, stream)?;
                before_bytes += bytes;
            }
        }
    }
    let (mut live_bytes, mut sizes) = (0u64, HashMap::new());
    for event in &trace.events {
        match *event {
            Event::Alloc { id, .. } if trace.before_start.contains(&id) => {}
            Event::Alloc { id, bytes, stream } => {
                m.malloc(id, bytes, stream)?;
                sizes.insert(id, bytes);
                live_bytes += bytes;
                out.allocated_peak_bytes = out.allocated_peak_bytes.max(live_bytes);
                let held = m.mapped_bytes.saturating_sub(before_bytes);
                out.peak_reserved_bytes = out.peak_reserved_bytes.max(held);
            }
            Event::Free { id } => {
                live_bytes -= sizes.remove(&id).unwrap_or(0);
                if m.live.contains_key(&id) && !trace.before_start.contains(&id) {
                    m.free(id);
                }
            }
            Event::Record { id, stream } => m.record(id, stream),
            Event::Sync => m.synchronize(),
            Event::EmptyCache => m.empty_cache(),
            Event::Wait { .. } | Event::Step => {}
        }
    }
    Ok(())
}

/// Self-checks of the model, run by checks.rs: each fails on a plausible slip in a rule.
pub fn checks() -> Result<(), String> {
    let mib = 1u64 << 20;
    // Traces that hold their libraries' allocations: no workspace before them.
    let trace = |text: &str| {
        let text = format!("# {IN_TRACE}\n{text}");
        Trace::parse("check", &text).map_err(|e| e.to_string())
    };
    let held = |text: &str| -> Result<u64, String> {
        let mut out = Outcome::default();
        replay(&trace(text)?, &mut out);
        Ok(out.peak_reserved_bytes / mib)
    };
    let expect = |what: &str, got: u64, want: u64| match got == want {
        true => Ok(()),
        false => Err(format!(
            "expandable model: {what}: {got} MiB held, not {want}"
        )),
    };
    // A large request maps whole 20 MiB granules; a small one 2 MiB.
    expect("one 21 MiB block", held("a 1 22020096 0\n")?, 40)?;
    expect("one 1 KiB block", held("a 1 1024 0\n")?, 2)?;
    // A free block is reused before the segment grows; a freed tail grows in place.
    let reuse = format!("a 1 {} 0\nf 1\na 2 {} 0\n", 30 * mib, 10 * mib);
    expect("reuse of a freed block", held(&reuse)?, 40)?;
    let grow = format!("a 1 {} 0\nf 1\na 2 {} 0\n", 30 * mib, 50 * mib);
    expect("a freed tail grown in place", held(&grow)?, 60)?;
    // Best fit takes a block that fits without growing before the growable tail, which then
    // grows for the larger request: 40 MiB (taking the tail first would leave 20).
    let fit = format!(
        "a 1 {} 0\na 2 {} 0\nf 1\na 3 {} 0\na 4 {} 0\n",
        10 * mib,
        4 * mib,
        5 * mib,
        10 * mib
    );
    expect("best fit before the tail", held(&fit)?, 40)?;
    // A large block splits off what is left down to 512 B: half a MiB left after 19.5 MiB
    // joins the next growth, so 10 and then 10.5 MiB fit in 40 (60 if the half MiB stayed in
    // the first block).
    let split = format!(
        "a 1 {} 0\na 2 {} 0\na 3 {} 0\n",
        39 * mib / 2,
        10 * mib,
        21 * mib / 2
    );
    expect("what is left of a large block split off", held(&split)?, 40)?;
    // Streams have pools of their own.
    expect("two streams", held("a 1 1024 0\na 2 1024 1\n")?, 4)?;
    // Without that header, the benchmark's cuBLAS workspace (32 MiB) came first, in 40 MiB: an
    // 8 MiB block fits in the rest, which counts as held from the start (20 without it).
    let warmed = Trace::parse("check", &format!("a 1 {} 0\n", 8 * mib))?;
    let mut out = Outcome::default();
    replay(&warmed, &mut out);
    expect(
        "a block beside the workspace",
        out.peak_reserved_bytes / mib,
        8,
    )?;
    // 1 MiB is still a small block; a large one is rounded to 512 B: 10 MiB + 1 B and then
    // 10 MiB - 256 B take 40 MiB (20 unrounded, as the second would fit the first's rest).
    expect("a 1 MiB block", held(&format!("a 1 {mib} 0\n"))?, 2)?;
    let rounded = format!("a 1 {} 0\na 2 {} 0\n", 10 * mib + 1, 10 * mib - 256);
    expect("large blocks rounded to 512 B", held(&rounded)?, 40)?;
    // A request the segment cannot hold is an error, not a panic.
    let mut out = Outcome::default();
    replay(&trace("a 1 100000000000000 0\n")?, &mut out);
    if out.error.is_none() {
        return Err("expandable model: a 91 TiB request was taken".into());
    }
    // A block used on another stream waits for the next synchronisation before reuse.
    let used = format!("a 1 {} 0\nr 1 1\nf 1\na 2 {} 0\n", 20 * mib, 20 * mib);
    expect("a block used on another stream", held(&used)?, 40)?;
    let synced = format!("a 1 {} 0\nr 1 1\nf 1\ns\na 2 {} 0\n", 20 * mib, 20 * mib);
    expect("the same after a synchronisation", held(&synced)?, 20)?;
    // empty_cache() unmaps the whole granules of free blocks.
    let mut m = Model::default();
    m.malloc(1, 40 * mib, 0)?;
    m.malloc(2, 10 * mib, 0)?;
    m.free(1);
    m.empty_cache();
    expect("mapped after empty_cache", m.mapped_bytes / mib, 20)?;
    // Growth looks at the unmapped blocks by address: after holes of 40 and 20 MiB, a 10 MiB
    // block goes in the lower, larger one.
    let mut m = Model::default();
    for (id, mibs) in [(1, 40), (2, 20), (3, 20), (4, 20)] {
        m.malloc(id, mibs * mib, 0)?;
    }
    m.free(1);
    m.free(3);
    m.empty_cache();
    m.malloc(5, 10 * mib, 0)?;
    match m.live[&5].1 {
        0 => Ok(()),
        at => Err(format!(
            "expandable model: the growth went to {} MiB, not to the lowest hole at 0",
            at / mib
        )),
    }
}

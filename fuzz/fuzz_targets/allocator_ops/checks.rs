//! The allocator_ops harness's checks: the quarantine of freed blocks (stream safety), where a
//! new block may lie (no overlap, alignment, usable on its stream), and the statistics against
//! the model.

use super::{Block, Harness, Quarantine, CACHE_LIMIT_BYTES, DEVICES};
use streampool::driver::{DevicePtr, Stream, StreamDriver};
use streampool::StreampoolStats;

impl Harness {
    /// Records harness events on every stream that used `block` (faults set aside meanwhile).
    pub(super) fn quarantine_before_free(&mut self, device: usize, ptr: DevicePtr, block: &Block) {
        if block.captured {
            return; // graph memory: freed straight to the driver, outside the cache's rules
        }
        let left = self.drain_faults();
        let mut waits = Vec::new();
        for s in std::iter::once(block.stream).chain(block.recorded.iter().copied()) {
            let e = self.sim.event_create(device).expect("harness event");
            self.sim
                .event_record(device, e, s)
                .expect("harness event record");
            waits.push((s, e));
        }
        self.reinject(left);
        self.quarantine.push(Quarantine {
            device,
            start: ptr.0,
            end: ptr.0 + block.bytes,
            waits,
        });
    }

    pub(super) fn prune_quarantine(&mut self) {
        let sim = &self.sim;
        self.quarantine.retain(|q| {
            let done = q
                .waits
                .iter()
                .all(|(_, e)| sim.event_query(q.device, *e).expect("harness event query"));
            if done {
                for (_, e) in &q.waits {
                    sim.event_destroy(q.device, *e);
                }
            }
            !done
        });
    }

    pub(super) fn check_new_block(
        &self,
        device: usize,
        ptr: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) {
        assert_eq!(ptr.0 % 512, 0, "pointer {ptr:#x} is not 512-byte aligned");
        // Work on its stream may use every byte: allocated, mapped, accessible from the device.
        if let Err(e) = self.sim.touch(device, device, ptr, bytes, stream) {
            panic!("device {device}: new block {ptr:#x}+{bytes} cannot be used: {e}");
        }
        let end = ptr.0 + bytes;
        if let Some(((d, p), b)) = self.live.range(..=(device, ptr)).next_back() {
            if *d == device && p.0 + b.bytes > ptr.0 {
                panic!(
                    "device {device}: new block {ptr:#x}+{bytes} overlaps live block {p:#x}+{}",
                    b.bytes
                );
            }
        }
        if let Some(((d, p), b)) = self.live.range((device, ptr)..).next() {
            if *d == device && p.0 < end {
                panic!(
                    "device {device}: new block {ptr:#x}+{bytes} overlaps live block {p:#x}+{}",
                    b.bytes
                );
            }
        }
        for q in &self.quarantine {
            if q.device != device || q.end <= ptr.0 || end <= q.start {
                continue;
            }
            // Safe once that work has completed, or once `stream` waited for it on the GPU (as
            // the vmm backend makes a stream wait for another's fence before reusing its memory).
            for (s, e) in &q.waits {
                if *s != stream && !self.sim.event_precedes(device, *e, stream) {
                    panic!(
                        "device {device}: block {ptr:#x}+{bytes} handed to stream {stream:#x} overlaps \
                         freed block {:#x}..{:#x} that stream {s:#x} may still be using",
                        q.start, q.end
                    );
                }
            }
        }
    }

    pub(super) fn current(&self, device: usize) -> (u64, u64) {
        self.live_on(device)
            .fold((0, 0), |(b, n), (_, blk)| (b + blk.bytes, n + 1))
    }

    /// Requested bytes of live blocks held from a pool (not graph memory), shareable included.
    pub(super) fn pool_live_bytes(&self, device: usize) -> u64 {
        self.live_on(device)
            .filter(|(_, b)| !b.captured)
            .map(|(_, b)| b.bytes)
            .sum()
    }

    /// Requested bytes of live blocks of the shareable pool (`true`) or of the main pool.
    pub(super) fn live_bytes_of(&self, device: usize, shareable: bool) -> u64 {
        self.live_on(device)
            .filter(|(_, b)| !b.captured && b.shareable == shareable)
            .map(|(_, b)| b.bytes)
            .sum()
    }

    pub(super) fn check_stats(&self, stats: &[StreampoolStats; DEVICES]) {
        for (d, s) in stats.iter().enumerate() {
            let c = &self.counts[d];
            let (cur, n) = self.current(d);
            let got = (
                s.allocated_bytes,
                s.allocations_current,
                s.num_allocs,
                s.num_frees,
                s.allocated_bytes_total,
                s.freed_bytes_total,
            );
            let want = (cur, n, c.allocs, c.frees, c.bytes_total, c.freed_total);
            assert_eq!(
                got, want,
                "device {d}: (allocated_bytes, allocations_current, num_allocs, num_frees, \
                 allocated_bytes_total, freed_bytes_total) differ from the model"
            );
            assert_eq!(
                (s.allocated_bytes_peak, s.allocations_peak),
                (c.peak_bytes, c.peak_count),
                "device {d}: peaks differ from the model"
            );
            assert_eq!(
                s.memory_limit_bytes,
                c.limit.unwrap_or(u64::MAX),
                "device {d}: memory limit"
            );
            assert!(
                s.active_bytes >= s.allocated_bytes,
                "device {d}: active {} < allocated {}",
                s.active_bytes,
                s.allocated_bytes
            );
            let pool_live = self.live_bytes_of(d, false);
            let shared_live = self.live_bytes_of(d, true);
            assert!(
                s.ipc_used_bytes >= shared_live,
                "device {d}: shareable pool used {} < its live {shared_live}",
                s.ipc_used_bytes
            );
            assert!(
                s.pool_used_bytes >= pool_live + s.cached_bytes,
                "device {d}: pool used {} < live {pool_live} + cached {}",
                s.pool_used_bytes,
                s.cached_bytes
            );
            // Asleep, the live blocks' pages are given back: nothing is reserved under them.
            assert!(
                self.asleep[d] || s.reserved_bytes >= s.pool_used_bytes,
                "device {d}: reserved {} < used {}",
                s.reserved_bytes,
                s.pool_used_bytes
            );
            assert!(
                s.cached_bytes <= CACHE_LIMIT_BYTES,
                "device {d}: cache {} over its budget",
                s.cached_bytes
            );
        }
    }
}

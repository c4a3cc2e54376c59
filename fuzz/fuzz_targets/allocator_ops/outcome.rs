//! The allocator_ops harness's verdict on one operation: what it returned and what it changed,
//! against what the model expects (`Outcome`), with the faults that fired during it.

use super::{is_injected, is_oom, Block, Harness, DEVICES};
use crate::input::Op;
use streampool::driver::{DevicePtr, Stream};
use streampool::{Error, StreampoolStats};

#[derive(Debug)]
pub(crate) enum Expect {
    UnknownPointer,
    BadDevice(i64),
    Invalid(&'static str),
}

pub(crate) enum Outcome {
    /// Nothing to check beyond the invariants.
    None,
    /// Must succeed unless an injected fault fired.
    MustSucceed(Result<(), Error>),
    /// Must fail as expected and change nothing.
    Rejected(Result<(), Error>, Expect),
    /// Must succeed (no injected fault can reach it) and change nothing.
    Unchanged(Result<(), Error>),
    /// A malloc above `MAX_ALLOCATION_BYTES`: out of memory with the reason, counted in
    /// `num_ooms` of `device`, nothing else changed (no injected fault can reach it).
    AboveMaximum {
        result: Result<(), Error>,
        device: usize,
    },
    Malloc {
        result: Result<DevicePtr, Error>,
        device: usize,
        bytes: u64,
        stream: Stream,
    },
    MallocShareable {
        result: Result<DevicePtr, Error>,
        device: usize,
        bytes: u64,
        stream: Stream,
    },
}

pub(crate) enum OutcomeKind {
    MallocShareable,
    Other,
}

impl Harness {
    /// Checks `outcome` of `op`, given the statistics before it and the cache hits then.
    pub(super) fn judge(
        &mut self,
        op: Op,
        outcome: Outcome,
        before: [StreampoolStats; DEVICES],
        hits_before: [u64; DEVICES],
    ) {
        // Which injected faults fired during this operation.
        let left = self.drain_faults();
        let mut fired = false;
        for (now, before) in left.iter().zip(&self.pending_faults) {
            assert!(now <= before, "faults appeared");
            fired |= now < before;
        }
        self.reinject(left);
        self.pending_faults = left;

        let after = self.all_stats();
        let outcome_kind = match &outcome {
            Outcome::MallocShareable { .. } => OutcomeKind::MallocShareable,
            _ => OutcomeKind::Other,
        };
        match outcome {
            Outcome::None => {}
            Outcome::MustSucceed(r) => {
                if let Err(e) = r {
                    assert!(
                        fired && is_injected(&e),
                        "{op:?} failed unexpectedly: {e} ({e:?})"
                    );
                }
            }
            Outcome::Unchanged(r) => {
                if let Err(e) = r {
                    panic!("{op:?} failed: {e} ({e:?}); expected success without effect");
                }
                assert_eq!(before, after, "{op:?} must change no statistic");
            }
            Outcome::AboveMaximum { result, device } => {
                match &result {
                    Err(e @ Error::OutOfMemory(_)) => {
                        let m = e.to_string();
                        assert!(
                            m.starts_with("CUDA out of memory. Tried to allocate ")
                                && m.contains("which is larger than streampool's maximum"),
                            "{op:?}: {m}"
                        );
                    }
                    other => panic!("{op:?} gave {other:?}; expected out of memory"),
                }
                let mut expected = before;
                expected[device].num_ooms += 1;
                assert_eq!(
                    expected, after,
                    "{op:?} must change num_ooms and nothing else"
                );
            }
            Outcome::Rejected(r, want) => {
                let e = match r {
                    Ok(()) => panic!("{op:?} was accepted; expected {want:?}"),
                    Err(e) => e,
                };
                let ok = match want {
                    Expect::UnknownPointer => matches!(e, Error::UnknownPointer { .. }),
                    Expect::BadDevice(d) => {
                        matches!(&e, Error::InvalidArgument(m)
                            if m.contains(&format!("device index {d} is out of range")))
                    }
                    Expect::Invalid(text) => {
                        matches!(&e, Error::InvalidArgument(m) if m.contains(text))
                    }
                };
                assert!(ok, "{op:?}: expected {want:?}, got {e} ({e:?})");
                assert_eq!(
                    before, after,
                    "{op:?} was rejected ({e}) but changed statistics"
                );
            }
            Outcome::Malloc {
                result,
                device,
                bytes,
                stream,
            }
            | Outcome::MallocShareable {
                result,
                device,
                bytes,
                stream,
            } => {
                let shareable_scope = matches!(outcome_kind, OutcomeKind::MallocShareable);
                match result {
                    Ok(ptr) => {
                        let d = device;
                        // Graph memory, or (vmm backend) a block its resource could not map
                        // during a capture, which the driver's own pool served instead.
                        let captured =
                            self.is_capturing(d, stream) || self.sim.is_driver_memory(d, ptr);
                        self.check_new_block(d, ptr, bytes, stream);
                        self.live.insert(
                            (d, ptr),
                            Block {
                                bytes,
                                stream,
                                captured,
                                shareable: shareable_scope && !captured,
                                recorded: Vec::new(),
                                id: self.next_id,
                            },
                        );
                        self.next_id += 1;
                        let (cur, n) = self.current(d);
                        let pool_live = self.pool_live_bytes(d);
                        let c = &mut self.counts[d];
                        c.allocs += 1;
                        c.bytes_total += bytes;
                        c.peak_bytes = c.peak_bytes.max(cur);
                        c.peak_count = c.peak_count.max(n);
                        // A block from the pool (not the cache, not a graph) must fit under the cap.
                        if let (Some(limit), false) = (c.limit, captured) {
                            if after[d].num_cache_hits == hits_before[d] {
                                let held = pool_live + after[d].cached_bytes;
                                assert!(
                                    held <= limit,
                                    "device {d}: {held} B held after a pool allocation, over the \
                                 memory-fraction cap of {limit} B"
                                );
                            }
                        }
                    }
                    Err(e) => {
                        assert!(
                        is_oom(&e) || (fired && is_injected(&e)),
                        "{op:?} failed with an unexpected error: {e} ({e:?}), fault fired: {fired}"
                    );
                        let (b, a) = (&before[device], &after[device]);
                        assert_eq!(
                            (b.allocated_bytes, b.allocations_current, b.num_allocs),
                            (a.allocated_bytes, a.allocations_current, a.num_allocs),
                            "{op:?} failed ({e}) but changed the live statistics"
                        );
                    }
                }
            }
        }
        self.prune_quarantine();
        self.check_stats(&after);
        if self.history_on {
            if let Some(e) = self.alloc.history(1).0.last() {
                let d = e.device as usize;
                assert_eq!(
                    e.allocated_bytes, after[d].allocated_bytes,
                    "device {d}: the newest timeline event's allocated_bytes gauge is stale: {e:?}"
                );
            }
        }
    }
}

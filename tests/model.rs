//! Random alloc/free/record_stream/sync sequences checked against a simple reference model.

mod common;
use common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use streampool::driver::DevicePtr;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        bytes: u64,
        stream: usize,
        device: i64,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: usize,
    },
    CompleteAll,
    EmptyCache,
    ResetPeaks,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..=(6 << 20), 0usize..3, 0i64..2).prop_map(|(bytes, stream, device)| Op::Alloc { bytes, stream, device }),
        5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), 0usize..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => Just(Op::CompleteAll),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeaks),
    ]
}

/// What PyTorch-style statistics must say, computed the obvious way.
#[derive(Default)]
struct Reference {
    live: BTreeMap<(i64, DevicePtr), u64>,
    peak: [u64; 2],
    count_peak: [u64; 2],
    allocs: [u64; 2],
    frees: [u64; 2],
    total_bytes: [u64; 2],
    freed_bytes: [u64; 2],
    ooms: [u64; 2],
}

impl Reference {
    fn current(&self, d: i64) -> (u64, u64) {
        let blocks: Vec<u64> = self
            .live
            .iter()
            .filter(|((dev, _), _)| *dev == d)
            .map(|(_, b)| *b)
            .collect();
        (blocks.iter().sum(), blocks.len() as u64)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn stats_and_pointers_match_the_reference(ops in proptest::collection::vec(op(), 1..120)) {
        let r = rig(256 << 20);
        let mut m = Reference::default();
        for op in ops {
            match op {
                Op::Alloc { bytes, stream, device } => match r.alloc.malloc(bytes, device, s(stream)) {
                    Ok(p) => {
                        for (&(d, q), &qb) in &m.live {
                            prop_assert!(d != device || !overlaps(p, bytes, q, qb), "overlap");
                        }
                        m.live.insert((device, p), bytes);
                        let di = device as usize;
                        m.allocs[di] += 1;
                        m.total_bytes[di] += bytes;
                        let (cur, n) = m.current(device);
                        m.peak[di] = m.peak[di].max(cur);
                        m.count_peak[di] = m.count_peak[di].max(n);
                    }
                    Err(e) => {
                        prop_assert!(e.to_string().starts_with("CUDA out of memory."), "{e}");
                        m.ooms[device as usize] += 1;
                    }
                },
                Op::Free { pick } if !m.live.is_empty() => {
                    let (&(d, p), &b) = m.live.iter().nth(pick % m.live.len()).unwrap();
                    r.alloc.free(p, d).unwrap();
                    m.live.remove(&(d, p));
                    m.frees[d as usize] += 1;
                    m.freed_bytes[d as usize] += b;
                }
                Op::RecordStream { pick, stream } if !m.live.is_empty() => {
                    let (&(_, p), _) = m.live.iter().nth(pick % m.live.len()).unwrap();
                    r.alloc.record_stream(p, s(stream)).unwrap();
                }
                Op::CompleteAll => r.sim.complete_all(),
                Op::EmptyCache => {
                    r.alloc.empty_cache().unwrap();
                    for d in 0..2 {
                        let s = r.stats(d);
                        // Synchronised and flushed: nothing cached, nothing waiting for events.
                        prop_assert_eq!(s.cached_bytes, 0);
                        prop_assert_eq!(s.active_bytes, s.allocated_bytes);
                    }
                }
                Op::ResetPeaks => {
                    for d in 0..2 {
                        r.device(d).reset_peak_stats().unwrap();
                        let (cur, n) = m.current(d);
                        m.peak[d as usize] = cur;
                        m.count_peak[d as usize] = n;
                    }
                }
                _ => {}
            }
            for d in 0..2i64 {
                let s = r.stats(d);
                let di = d as usize;
                let (cur, n) = m.current(d);
                prop_assert_eq!(s.allocated_bytes, cur);
                prop_assert_eq!(s.allocations_current, n);
                prop_assert_eq!(s.allocated_bytes_peak, m.peak[di]);
                prop_assert_eq!(s.allocations_peak, m.count_peak[di]);
                prop_assert_eq!((s.num_allocs, s.num_frees), (m.allocs[di], m.frees[di]));
                prop_assert_eq!((s.allocated_bytes_total, s.freed_bytes_total), (m.total_bytes[di], m.freed_bytes[di]));
                prop_assert!(s.active_bytes >= s.allocated_bytes);
                prop_assert!(s.pool_used_bytes >= s.cached_bytes);
                // Every allocation was served by the cache or by the pool, never both.
                prop_assert_eq!(s.num_allocs, s.num_cache_hits + s.num_device_allocs);
                prop_assert!(s.num_device_frees <= s.num_device_allocs);
                prop_assert_eq!(s.num_ooms, m.ooms[di]);
                prop_assert!(s.num_alloc_retries >= s.num_ooms, "an OOM is reported only after a retry");
                prop_assert!(s.cached_bytes <= 64 << 20, "the cache budget");
                prop_assert!(s.reserved_bytes >= s.pool_used_bytes && s.reserved_bytes_peak >= s.reserved_bytes);
            }
        }
        for &(d, p) in m.live.keys() {
            r.alloc.free(p, d).unwrap();
        }
        r.sim.complete_all();
        r.finish();
    }
}

//! 8 threads x 100k operations on shared devices and streams end with nothing live or leaked.

mod common;
use common::*;
use std::sync::Arc;

#[test]
fn eight_threads_hundred_thousand_ops_each() {
    let r = Arc::new(rig(8 << 30));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                let mut live: Vec<(u64, i64)> = Vec::new();
                for i in 0..100_000u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let device = (rng % 2) as i64;
                    if live.len() < 32 && !(rng >> 8).is_multiple_of(3) {
                        let bytes = 1 + (rng >> 16) % (256 << 10);
                        let stream = ((t + i) % 4) as usize;
                        let p = r.alloc.malloc(bytes, device, stream).unwrap();
                        if (rng >> 40).is_multiple_of(16) {
                            r.alloc.record_stream(p, 9).unwrap();
                        }
                        live.push((p, device));
                    } else if let Some((p, d)) = live.pop() {
                        r.alloc.free(p, d).unwrap();
                    }
                    if i % 10_000 == 0 && t == 0 {
                        r.sim.complete_all();
                    }
                }
                for (p, d) in live {
                    r.alloc.free(p, d).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    r.sim.complete_all();
    for d in 0..2 {
        let s = r.stats(d);
        assert_eq!((s.allocated_bytes, s.allocations_current), (0, 0));
        assert_eq!(s.num_allocs, s.num_frees);
    }
    let r = Arc::into_inner(r).unwrap();
    r.finish();
}

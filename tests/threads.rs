//! 8 threads x 100k operations on shared devices and streams: no two live blocks ever overlap,
//! blocks are freed by threads other than their allocator's too, and at the end nothing is live
//! or leaked.
//!
//! The overlap registry follows each block through its free: a block is marked "freeing" just
//! before `free` is called and leaves the registry only after `free` returned. A new block may
//! overlap a freeing one (the allocator may hand it out as soon as its free has begun), never a
//! live one — so a block handed out twice, or handed out before its owner called free, is caught
//! whenever it happens.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::sync::Mutex;
use streampool::driver::{DevicePtr, Stream};

/// The largest request below (256 KiB), rounded to 512: how far back an overlapping block starts.
const MAX_BLOCK_BYTES: u64 = 256 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Freeing,
}

/// One device's blocks that a caller owns or is freeing: start address -> (bytes, state) of each.
type Blocks = BTreeMap<DevicePtr, Vec<(u64, State)>>;

/// Every block of every device that a caller owns or is freeing.
#[derive(Default)]
struct Registry {
    devices: [Mutex<Blocks>; 2],
}

impl Registry {
    fn allocated(&self, device: i64, ptr: DevicePtr, bytes: u64) {
        let mut blocks = self.devices[device as usize].lock().unwrap();
        let from = DevicePtr(ptr.0.saturating_sub(MAX_BLOCK_BYTES));
        let end = DevicePtr(ptr.0 + bytes);
        for (&other, entries) in blocks.range(from..end) {
            for &(other_bytes, state) in entries {
                assert!(
                    state == State::Freeing || !overlaps(ptr, bytes, other, other_bytes),
                    "device {device}: new block {ptr:#x}+{bytes} overlaps live {other:#x}+{other_bytes}"
                );
            }
        }
        blocks.entry(ptr).or_default().push((bytes, State::Live));
    }

    fn set_state(&self, device: i64, ptr: DevicePtr, bytes: u64, from: State, to: Option<State>) {
        let mut blocks = self.devices[device as usize].lock().unwrap();
        let entries = blocks.get_mut(&ptr).expect("a registered block");
        let i = entries
            .iter()
            .position(|&e| e == (bytes, from))
            .expect("the block in its state");
        match to {
            Some(state) => entries[i].1 = state,
            None => {
                entries.swap_remove(i);
                if entries.is_empty() {
                    blocks.remove(&ptr);
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.devices.iter().all(|d| d.lock().unwrap().is_empty())
    }
}

#[test]
fn eight_threads_hundred_thousand_ops_each_with_cross_thread_frees_never_overlap() {
    const THREADS: u64 = 8;
    let r = rig(8 << 30);
    let registry = Registry::default();
    // Blocks handed from one thread to another, which frees them.
    let handoff: Mutex<Vec<(DevicePtr, i64, u64)>> = Mutex::new(Vec::new());
    let free = |p: DevicePtr, d: i64, bytes: u64| {
        registry.set_state(d, p, bytes, State::Live, Some(State::Freeing));
        r.free(p, d);
        registry.set_state(d, p, bytes, State::Freeing, None);
    };
    let cross_thread_frees = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (r, registry, handoff, free) = (&r, &registry, &handoff, &free);
                scope.spawn(move || {
                    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                    let mut live: Vec<(DevicePtr, i64, u64)> = Vec::new();
                    let mut freed_for_others = 0u64;
                    for i in 0..100_000u64 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let device = (rng % 2) as i64;
                        if live.len() < 32 && !(rng >> 8).is_multiple_of(3) {
                            let bytes = 1 + (rng >> 16) % MAX_BLOCK_BYTES;
                            let stream = Stream(((t + i) % 4) as usize);
                            let p = r.alloc.malloc(bytes, device, stream).unwrap();
                            registry.allocated(device, p, bytes);
                            if (rng >> 40).is_multiple_of(16) {
                                r.alloc.record_stream(p, s(9)).unwrap();
                            }
                            if (rng >> 44).is_multiple_of(8) {
                                handoff.lock().unwrap().push((p, device, bytes));
                            } else {
                                live.push((p, device, bytes));
                            }
                        } else if (rng >> 48).is_multiple_of(4) {
                            let theirs = handoff.lock().unwrap().pop();
                            if let Some((p, d, bytes)) = theirs {
                                free(p, d, bytes);
                                freed_for_others += 1;
                            }
                        } else if let Some((p, d, bytes)) = live.pop() {
                            free(p, d, bytes);
                        }
                        if i % 10_000 == 0 && t == 0 {
                            r.sim.complete_all();
                        }
                    }
                    for (p, d, bytes) in live {
                        free(p, d, bytes);
                    }
                    freed_for_others
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>()
    });
    // Some blocks were freed by another thread than their allocator's (a thread may take back its
    // own, too); the rest of the handoff is freed here, on the main thread.
    assert!(cross_thread_frees > 1000, "{cross_thread_frees}");
    for (p, d, bytes) in handoff.into_inner().unwrap() {
        free(p, d, bytes);
    }
    assert!(registry.is_empty());
    r.sim.complete_all();
    for d in 0..2 {
        let st = r.stats(d);
        assert_eq!((st.allocated_bytes, st.allocations_current), (0, 0));
        assert_eq!(st.num_allocs, st.num_frees);
    }
    r.finish();
}

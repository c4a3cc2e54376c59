//! At the program's synchronisation (`torch.cuda.synchronize()` under install() calls
//! `DeviceAllocator::synchronizing`, then `DeviceAllocator::synchronized`), on the vmm backend:
//! blocks that waited for other streams (record_stream) go back, ready for every stream where
//! their own stream has finished too; what was freed before the synchronisation began is ready
//! for every stream without a driver query, unless something was freed while it ran. On a
//! simulator that refuses a touch racing unfinished work of another stream.

use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);

struct Rig {
    sim: Arc<SimDriver>,
    alloc: Allocator,
}

fn rig() -> Rig {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB).strict().check_races());
    let config = Config {
        backend: Backend::Vmm,
        background: false,
        ..Config::default()
    };
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    Rig { sim, alloc }
}

impl Rig {
    /// A block of `bytes` on `stream`, written there.
    fn malloc(&self, bytes: u64, stream: Stream) -> DevicePtr {
        let ptr = self.alloc.malloc(bytes, 0, stream).unwrap();
        self.sim.touch(0, 0, ptr, bytes, stream).unwrap();
        ptr
    }

    /// A block of `bytes` allocated and written on S1, read on S2 once S1's write is done
    /// (record_stream), freed.
    fn freed_after_use_on_s2(&self, bytes: u64) -> DevicePtr {
        let ptr = self.malloc(bytes, S1);
        self.sim.complete_stream(0, S1);
        self.alloc.record_stream(ptr, S2).unwrap();
        self.sim.touch(0, 0, ptr, bytes, S2).unwrap();
        self.alloc.free(ptr, 0).unwrap();
        ptr
    }

    /// The driver's `cuStreamQuery` calls made by one synchronisation hook.
    fn stream_queries_of_a_synchronisation(&self) -> u64 {
        let before = self.sim.calls("cuStreamQuery");
        self.alloc.device(0).unwrap().synchronized().unwrap();
        self.sim.calls("cuStreamQuery") - before
    }
}

/// A step of multistream hands back five blocks of one stream at each synchronisation: the
/// stream is asked once whether it has finished, not once a block (each query is a driver call
/// on the program's thread).
#[test]
fn each_stream_is_asked_once_however_many_of_its_blocks_go_back() {
    let queries = |blocks: usize| {
        let r = rig();
        for _ in 0..blocks {
            r.freed_after_use_on_s2(2 * MIB);
        }
        r.sim.complete_all();
        let queries = r.stream_queries_of_a_synchronisation();
        assert_eq!(r.alloc.device(0).unwrap().stats().unwrap().active_bytes, 0);
        queries
    };
    let one = queries(1);
    assert!(one >= 1, "the block's stream is asked");
    assert_eq!(queries(5), one);
}

/// Two streams' blocks in one synchronisation, each stream asked for itself: S3's, whose work is
/// done, serves S2 at once; S1's, whose work still runs, does not (the simulator refuses S2's
/// touch of it otherwise).
#[test]
fn each_block_goes_back_as_its_own_stream_stands() {
    const S3: Stream = Stream(3);
    let r = rig();
    let busy = r.malloc(4 * MIB, S1);
    r.alloc.record_stream(busy, S2).unwrap();
    r.alloc.free(busy, 0).unwrap();
    let done = r.malloc(6 * MIB, S3);
    r.sim.complete_stream(0, S3);
    r.alloc.record_stream(done, S2).unwrap();
    r.alloc.free(done, 0).unwrap();
    r.sim.complete_stream(0, S2);
    r.sim.complete_stream(0, S3);
    r.alloc.device(0).unwrap().synchronized().unwrap();
    let waits = r.sim.calls("cuStreamWaitEvent");
    let b = r.malloc(6 * MIB, S2);
    assert_eq!(
        (b, r.sim.calls("cuStreamWaitEvent")),
        (done, waits),
        "S3's, at once"
    );
    let c = r.malloc(4 * MIB, S2);
    r.alloc.free(b, 0).unwrap();
    r.alloc.free(c, 0).unwrap();
    r.sim.complete_all();
}

/// A block whose other stream is done but whose own stream still runs work that uses it is not
/// ready for another stream at the synchronisation: S2 gets other memory, or waits for S1 on
/// the GPU (the simulator refuses S2's touch otherwise).
#[test]
fn a_block_whose_own_stream_still_runs_is_not_handed_to_another_at_once() {
    let r = rig();
    let a = r.malloc(4 * MIB, S1);
    r.alloc.record_stream(a, S2).unwrap();
    r.alloc.free(a, 0).unwrap();
    r.sim.complete_stream(0, S2);
    // S1's write of `a` has not completed: a synchronisation of another thread's, say.
    r.alloc.device(0).unwrap().synchronized().unwrap();
    let b = r.malloc(4 * MIB, S2);
    r.alloc.free(b, 0).unwrap();
    r.sim.complete_all();
}

/// Both streams done: the block serves S2 at once, without a wait.
#[test]
fn a_block_whose_streams_are_all_done_serves_another_stream_at_once() {
    let r = rig();
    let a = r.freed_after_use_on_s2(4 * MIB);
    r.sim.complete_all();
    r.alloc.device(0).unwrap().synchronized().unwrap();
    let waits = r.sim.calls("cuStreamWaitEvent");
    let b = r.malloc(4 * MIB, S2);
    assert_eq!(b, a, "the freed block, for S2");
    assert_eq!(r.sim.calls("cuStreamWaitEvent"), waits, "with no wait");
    r.alloc.free(b, 0).unwrap();
    r.sim.complete_all();
}

/// The driver's answers about completion, the fences recorded and the device's synchronisations:
/// what a settling, or a release threshold's trim, asks.
fn asked(r: &Rig) -> u64 {
    [
        "cuEventQuery",
        "cuStreamQuery",
        "cuEventRecord",
        "cuCtxSynchronize",
    ]
    .iter()
    .map(|call| r.sim.calls(call))
    .sum()
}

/// Without a release threshold (a settling at the synchronisation), and with one (a trim there,
/// which asks as a settling does and may synchronise again).
const THRESHOLDS: [Option<u64>; 2] = [None, Some(1 << 30)];

fn rig_at(threshold: Option<u64>) -> Rig {
    let r = rig();
    if let Some(bytes) = threshold {
        r.alloc
            .device(0)
            .unwrap()
            .set_release_threshold(bytes)
            .unwrap();
    }
    r
}

/// Under install(), `torch.cuda.synchronize()` tells the library as it begins: where nothing was
/// freed since, what was freed before it is ready for every stream at its end without a query,
/// a record or a synchronisation of its own (multistream's step asked some 1.3 queries a
/// synchronisation).
#[test]
fn what_was_freed_before_the_synchronisation_began_is_ready_at_its_end_unasked() {
    for threshold in THRESHOLDS {
        let r = rig_at(threshold);
        let a = r.malloc(4 * MIB, S1);
        r.alloc.free(a, 0).unwrap();
        let c = r.malloc(2 * MIB, S2);
        r.alloc.free(c, 0).unwrap();
        let device = r.alloc.device(0).unwrap();
        device.synchronizing().unwrap();
        r.sim.complete_all(); // PyTorch's synchronisation
        let before = asked(&r);
        device.synchronized().unwrap();
        assert_eq!(asked(&r), before, "nothing asked (threshold {threshold:?})");
        let waits = r.sim.calls("cuStreamWaitEvent");
        let b = r.malloc(4 * MIB, S2);
        assert_eq!(b, a, "S1's block, for S2 (threshold {threshold:?})");
        assert_eq!(r.sim.calls("cuStreamWaitEvent"), waits, "with no wait");
        r.alloc.free(b, 0).unwrap();
        r.sim.complete_all();
    }
}

/// A block another thread freed while the synchronisation ran, after work it queued since the
/// synchronisation began: not ready at its end (the simulator refuses S2's touch of it while
/// S1's write runs).
#[test]
fn a_block_freed_after_the_synchronisation_began_is_not_handed_to_another_stream_at_once() {
    for threshold in THRESHOLDS {
        let r = rig_at(threshold);
        // S1's fence was just recorded (at the free of `a`): the free of `b` below records none.
        let a = r.malloc(4 * MIB, S1);
        r.alloc.free(a, 0).unwrap();
        let b = r.malloc(8 * MIB, S1);
        let c = r.malloc(2 * MIB, S2);
        r.alloc.free(c, 0).unwrap();
        let device = r.alloc.device(0).unwrap();
        device.synchronizing().unwrap();
        r.sim.complete_all();
        // Another thread writes `b` on S1 and frees it, after the synchronisation began.
        r.sim.touch(0, 0, b, 8 * MIB, S1).unwrap();
        r.alloc.free(b, 0).unwrap();
        device.synchronized().unwrap();
        let d = r.malloc(8 * MIB, S2);
        r.alloc.free(d, 0).unwrap();
        r.sim.complete_all();
    }
}

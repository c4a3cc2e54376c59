//! Streams the program destroys while streampool still knows them (serving code that makes a
//! stream per request): a capture stream that no longer exists is a capture that ended, and a
//! block that waited for a stream that no longer exists is still reclaimed (simulated driver).
//!
//! Either answer of a failed capture query must be the same everywhere: a stream the driver
//! cannot answer for is not capturing (a capture ends before its stream can be destroyed).

use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{Driver, Stream};
use streampool::{Allocator, Config};

const MIB: u64 = 1 << 20;
const S1: Stream = Stream(1);
const S2: Stream = Stream(2);
const CAPTURING: Stream = Stream(9);

fn config(backend: Backend) -> Config {
    Config {
        backend,
        background: false,
        ..Config::default()
    }
}

/// Was (vmm backend): the resource kept a capture stream it could no longer query as capturing,
/// so it never mapped memory again (every later block came from the driver's own pool).
#[test]
fn a_destroyed_capture_stream_does_not_keep_the_vmm_backend_from_mapping() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config(Backend::Vmm)).unwrap();
    sim.begin_capture(0, CAPTURING);
    let graph = alloc.malloc(2 * MIB, 0, CAPTURING).unwrap(); // the capture is known now
    alloc.free(graph, 0).unwrap();
    sim.destroy_stream(0, CAPTURING); // ends the capture; its handle is invalid from now on
    let p = alloc.malloc(8 * MIB, 0, S1).unwrap();
    assert!(
        !sim.is_driver_memory(0, p),
        "served by the driver's pool: the resource still thinks a capture is under way"
    );
    assert!(alloc.device(0).unwrap().stats().unwrap().num_maps > 0);
    alloc.free(p, 0).unwrap();
    sim.complete_all();
    alloc.empty_cache().unwrap();
}

/// A block used on S2 (record_stream) is freed during a capture, so it waits for the capture's
/// end before events can be recorded on S2; S2 is destroyed meanwhile, so no event can ever be
/// recorded on it. The block is not leaked: an allocation that needs its memory gets it after
/// the out-of-memory retry's synchronisation, on either backend.
#[test]
fn a_block_waiting_for_a_destroyed_stream_is_reclaimed_when_its_memory_is_needed() {
    for backend in [Backend::Pool, Backend::Vmm] {
        let sim = Arc::new(SimDriver::new(1, 64 * MIB));
        let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config(backend)).unwrap();
        let a = alloc.malloc(40 * MIB, 0, S1).unwrap();
        alloc.record_stream(a, S2).unwrap();
        sim.begin_capture(0, CAPTURING);
        let graph = alloc.malloc(MIB, 0, CAPTURING).unwrap();
        alloc.free(a, 0).unwrap(); // waits for the capture's end
        alloc.free(graph, 0).unwrap();
        sim.destroy_stream(0, S2);
        sim.end_capture(0, CAPTURING);
        sim.complete_all();
        let b = alloc
            .malloc(40 * MIB, 0, S1)
            .unwrap_or_else(|e| panic!("{backend:?}: a's memory was never reclaimed: {e}"));
        let st = alloc.device(0).unwrap().stats().unwrap();
        assert_eq!(st.allocated_bytes, 40 * MIB, "{backend:?}");
        alloc.free(b, 0).unwrap();
        sim.complete_all();
        alloc.empty_cache().unwrap();
        assert_eq!(
            alloc.device(0).unwrap().stats().unwrap().active_bytes,
            0,
            "{backend:?}"
        );
    }
}

/// vmm backend: blocks freed on a stream (the last of them too soon after its previous fence to
/// get one of their own) and the stream destroyed before any fence covers them: no fence can
/// ever be recorded for them, but after the synchronisation of `empty_cache` their work is done,
/// and their pages go back.
#[test]
fn blocks_freed_on_a_stream_destroyed_before_their_fence_go_back_at_empty_cache() {
    let sim = Arc::new(SimDriver::new(1, 256 * MIB));
    sim.stop_clock(); // every free after the first falls inside the fence interval
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config(Backend::Vmm)).unwrap();
    let blocks: Vec<_> = (0..3)
        .map(|_| alloc.malloc(8 * MIB, 0, S2).unwrap())
        .collect();
    for p in blocks {
        alloc.free(p, 0).unwrap();
    }
    sim.destroy_stream(0, S2);
    alloc.empty_cache().unwrap();
    assert_eq!(
        sim.physical_bytes(0),
        0,
        "pages of a destroyed stream's frees kept"
    );
}

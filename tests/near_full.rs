//! A device near full, on both backends: most of its free memory in blocks of 256 MiB, every
//! other one freed, then one request of 40% of the card, which only the freed memory can serve
//! (the checkerboard of bench/trace_capture.py). It is served, or refused with a typed
//! out-of-memory error, and the device keeps the headroom the CUDA runtime needs
//! (`STREAMPOOL_VMM_HEADROOM`): the vmm backend moves idle pages instead of creating past it,
//! never asks for a page again after the device refused one, and gives the surplus back.

mod common;
use common::*;
use streampool::config::Backend;
use streampool::driver::{DeviceDriver, DevicePtr, Stream};
use streampool::Error;

const GIB: u64 = 1 << 30;
const CARD_BYTES: u64 = 8 * GIB;
const BLOCK_BYTES: u64 = 256 * MIB;
/// The default headroom: 1% of the card.
const HEADROOM_BYTES: u64 = CARD_BYTES / 100;

fn rig_for(backend: Backend) -> Rig {
    let config = streampool::Config {
        backend,
        ..base_config()
    };
    rig_with(1, CARD_BYTES, config)
}

/// Allocates and uses the block on stream 1, as a kernel would (the strict simulator fails the
/// use of memory that is not mapped or not accessible).
fn used(r: &Rig, bytes: u64) -> Result<DevicePtr, Error> {
    let ptr = r.alloc.malloc(bytes, 0, Stream(1))?;
    r.sim.touch(0, 0, ptr, bytes, Stream(1)).unwrap();
    Ok(ptr)
}

/// Fills 88% of the free memory with 256 MiB blocks (with a 1 MiB block after each if `small`,
/// which pins a page of its own under vmm), frees every other large one, and lets the GPU
/// finish: the blocks still live, and the bytes freed.
fn checkerboard(r: &Rig, small: bool) -> (Vec<(DevicePtr, u64)>, u64) {
    let free_bytes = r.sim.mem_info(0).unwrap().free_bytes;
    let count = free_bytes / 100 * 88 / BLOCK_BYTES;
    let mut blocks = Vec::new();
    for _ in 0..count {
        blocks.push((used(r, BLOCK_BYTES).unwrap(), BLOCK_BYTES));
        if small {
            blocks.push((used(r, MIB).unwrap(), MIB));
        }
    }
    let mut freed_bytes = 0;
    let mut i = 0;
    blocks.retain(|&(ptr, bytes)| {
        let keep = bytes != BLOCK_BYTES || i % 2 == 1;
        if bytes == BLOCK_BYTES {
            i += 1;
        }
        if !keep {
            r.free(ptr, 0);
            freed_bytes += bytes;
        }
        keep
    });
    r.sim.complete_all();
    (blocks, freed_bytes)
}

/// Device memory that was never in use at once (the least free memory so far).
fn least_free_bytes(r: &Rig) -> u64 {
    CARD_BYTES - r.sim.in_use_high_bytes(0)
}

/// `cuMemCreate` calls the device refused.
fn failed_creates(r: &Rig) -> u64 {
    r.sim.calls("cuMemCreate") - r.stats(0).num_mem_creates
}

fn finish(r: Rig, blocks: Vec<(DevicePtr, u64)>) {
    for (ptr, _) in blocks {
        r.free(ptr, 0);
    }
    r.finish();
}

#[test]
fn forty_percent_of_the_card_is_served_from_a_checkerboard_and_the_headroom_stays_free() {
    for backend in [Backend::Pool, Backend::Vmm] {
        for small in [false, true] {
            let r = rig_for(backend);
            let (blocks, freed_bytes) = checkerboard(&r, small);
            let big_bytes = CARD_BYTES / 100 * 40 / (2 * MIB) * (2 * MIB);
            assert!(
                big_bytes < freed_bytes,
                "only the freed memory can serve it"
            );
            let reads_before = r.sim.calls("cuMemGetInfo");
            let big =
                used(&r, big_bytes).unwrap_or_else(|e| panic!("{backend:?}, small {small}: {e}"));
            let what = format!("{backend:?}, small blocks {small}");
            assert!(
                least_free_bytes(&r) >= HEADROOM_BYTES,
                "{what}: the device's free memory fell to {} MiB",
                least_free_bytes(&r) / MIB
            );
            assert_eq!(failed_creates(&r), 0, "{what}: creates refused");
            assert_eq!(
                r.stats(0).num_alloc_retries,
                0,
                "{what}: served at the first try"
            );
            if backend == Backend::Vmm {
                // The device was found full: idle pages went back until twice the headroom is
                // free, for what runs beside the allocator.
                let free_bytes = r.sim.mem_info(0).unwrap().free_bytes;
                assert!(
                    free_bytes >= 2 * HEADROOM_BYTES,
                    "{what}: {free_bytes} B free"
                );
                assert!(
                    r.sim.calls("cuMemGetInfo") - reads_before <= 3,
                    "{what}: the free memory is read once to plan and once to release"
                );
            }
            r.free(big, 0);
            finish(r, blocks);
        }
    }
}

#[test]
fn the_free_memory_is_read_only_near_the_headroom() {
    let r = rig_for(Backend::Vmm);
    let mut blocks = vec![(used(&r, BLOCK_BYTES).unwrap(), BLOCK_BYTES)];
    // Growths far from the headroom go by the first reading and the resource's own creates.
    let reads_before = r.sim.calls("cuMemGetInfo");
    for _ in 0..16 {
        blocks.push((used(&r, BLOCK_BYTES).unwrap(), BLOCK_BYTES));
    }
    assert_eq!(r.sim.calls("cuMemGetInfo"), reads_before);
    // Near it, every growth asks the device.
    let near = 31 - blocks.len();
    for _ in 0..near {
        blocks.push((used(&r, BLOCK_BYTES).unwrap(), BLOCK_BYTES));
    }
    let reads = r.sim.calls("cuMemGetInfo") - reads_before;
    assert!(reads > 0 && reads <= near as u64, "{reads} reads");
    finish(r, blocks);
}

#[test]
fn a_request_that_fits_only_in_the_headroom_is_a_typed_out_of_memory_error() {
    for backend in [Backend::Pool, Backend::Vmm] {
        let r = rig_for(backend);
        let (blocks, _) = checkerboard(&r, false);
        let live_bytes: u64 = blocks.iter().map(|&(_, bytes)| bytes).sum();
        let too_big = CARD_BYTES - live_bytes + MIB;
        match r.alloc.malloc(too_big, 0, Stream(1)) {
            Err(Error::OutOfMemory(_)) => {}
            other => panic!("{backend:?}: {other:?}"),
        }
        assert_eq!(
            failed_creates(&r),
            0,
            "{backend:?}: no create the device refused"
        );
        if backend == Backend::Vmm {
            // What fits beside the headroom is served, what fits only in it is refused.
            let fits = CARD_BYTES - live_bytes - 2 * HEADROOM_BYTES;
            let in_headroom = CARD_BYTES - live_bytes - HEADROOM_BYTES / 2;
            assert!(matches!(
                r.alloc.malloc(in_headroom, 0, Stream(1)),
                Err(Error::OutOfMemory(_))
            ));
            let ptr = used(&r, fits).unwrap();
            assert!(least_free_bytes(&r) >= HEADROOM_BYTES);
            r.free(ptr, 0);
        }
        // Still usable afterwards.
        let ptr = used(&r, BLOCK_BYTES).unwrap();
        r.free(ptr, 0);
        finish(r, blocks);
    }
}

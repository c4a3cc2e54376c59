//! The contract's cases about blocks, stream order, usage, trim and exhaustion.
//!
//! Invariant: each case holds for every resource, reading where resources differ from their
//! [`Traits`](crate::resource::Traits) only (see the module above).

use super::rig::{Rig, Rng, S, T, U};
use super::{Factory, GRANULE_BYTES, MEMORY_BYTES};

/// Sizes of every kind: one 512-byte unit, odd multiples of it, small and large, straddling the
/// granule.
const SIZES: [u64; 9] = [
    512,
    3 * 512,
    1001 * 512,
    1 << 20,
    (1 << 20) + 512,
    (2 << 20) - 512,
    (3 << 20) + 3 * 512,
    5 << 20,
    9 << 20,
];

pub(super) fn blocks_are_aligned_sized_and_usable(make: Factory) {
    let mut rig = Rig::new(make);
    for (i, bytes) in SIZES.into_iter().enumerate() {
        rig.alloc(bytes, [S, T][i % 2]);
        rig.check_usage();
    }
    rig.use_all();
    rig.free_all();
    rig.check_usage();
    rig.finish();
}

pub(super) fn huge_requests_are_out_of_memory_and_change_nothing(make: Factory) {
    let mut rig = Rig::new(make);
    rig.alloc(4096, S);
    let before = rig.snapshot();
    for bytes in [
        MEMORY_BYTES + 512,
        2 * MEMORY_BYTES,
        1 << 50,
        u64::MAX - 511,
    ] {
        let label = rig.label();
        match rig.resource.allocate(bytes, S) {
            Ok(ptr) => {
                panic!("{label}: {bytes} B served at {ptr:#x} on a device of {MEMORY_BYTES} B")
            }
            Err(e) => assert!(
                e.is_device_oom(),
                "{label}: {bytes} B: not out of memory: {e}"
            ),
        }
        assert_eq!(
            rig.snapshot(),
            before,
            "{label}: {bytes} B changed something"
        );
    }
    rig.alloc(4096, S);
    rig.free_all();
    rig.finish();
}

pub(super) fn live_blocks_never_overlap_under_random_use(make: Factory) {
    let mut rig = Rig::new(make);
    let mut rng = Rng::new(0x5eed_c0ff_ee00_0042);
    let streams = [S, T, U];
    let mut served = 0;
    for step in 0..600 {
        match rng.below(10) {
            0..=5 if rig.live_bytes() < MEMORY_BYTES / 2 => {
                let (bytes, stream) = (rng.pick(&SIZES[..8]), rng.pick(&streams));
                match rig.try_alloc(bytes, stream) {
                    Ok(_) => served += 1,
                    Err(e) => {
                        assert!(e.is_device_oom(), "{}: {e}", rig.label());
                        let victim = rig.live[rng.below(rig.live.len())].ptr;
                        rig.free(victim);
                    }
                }
            }
            0..=8 if !rig.live.is_empty() => {
                let victim = rig.live[rng.below(rig.live.len())].ptr;
                rig.free(victim);
            }
            9 => match rng.below(3) {
                0 => rig.sim.complete_stream(0, rng.pick(&streams)),
                1 => rig.sim.complete_other_streams(0, rng.pick(&streams)),
                _ => rig.sync(),
            },
            _ => {}
        }
        if step % 25 == 0 {
            rig.check_usage();
        }
    }
    assert!(served > 200, "{}: only {served} blocks served", rig.label());
    rig.free_all();
    rig.finish();
}

pub(super) fn a_block_freed_on_a_stream_serves_that_stream_at_once(make: Factory) {
    let mut rig = Rig::new(make);
    for bytes in [4096, 3 << 20] {
        let p = rig.alloc(bytes, S);
        let free_bytes = rig.device_free_bytes();
        rig.free(p);
        // S's work still uses the block; its next work comes after, in stream order.
        let q = rig.alloc(bytes, S);
        let now = rig.device_free_bytes();
        assert!(
            now >= free_bytes,
            "{}: {bytes} B freed on S did not serve S again at once (device memory free: \
             {free_bytes} -> {now} B)",
            rig.label()
        );
        rig.free(q);
    }
    rig.finish();
}

pub(super) fn a_block_freed_on_a_stream_serves_another_only_once_ordered(make: Factory) {
    let mut rig = Rig::new(make);
    for bytes in [4096, 3 << 20] {
        // S frees two blocks its work still uses: T gets other memory, or S's after a GPU-side
        // wait (the rig's use of T's block checks that).
        let (p1, p2) = (rig.alloc(bytes, S), rig.alloc(bytes, S));
        rig.free(p1);
        rig.free(p2);
        let q = rig.alloc(bytes, T);
        // Other streams' work completing does not complete S's.
        rig.sim.complete_other_streams(0, S);
        let r = rig.alloc(bytes, T);
        rig.free(q);
        rig.free(r);
        // T waits on the GPU for S's work: what S freed may serve T at once.
        let p3 = rig.alloc(bytes, S);
        rig.free(p3);
        let event = rig.driver.event_create(0).unwrap();
        rig.driver.event_record(0, event, S).unwrap();
        rig.driver.stream_wait_event(0, T, event).unwrap();
        let w = rig.alloc(bytes, T);
        rig.driver.event_destroy(0, event);
        rig.free(w);
        // After a synchronisation, memory any stream freed serves any stream.
        rig.sync();
        let free_bytes = rig.device_free_bytes();
        let x = rig.alloc(bytes, U);
        let now = rig.device_free_bytes();
        // (Graph memory holds nothing: what it frees goes back to the device.)
        if rig.traits.held && rig.traits.reuses_across_streams {
            assert!(
                now >= free_bytes,
                "{}: {bytes} B on U after a synchronisation took more device memory ({free_bytes} \
                 -> {now} B free)",
                rig.label()
            );
        }
        rig.free(x);
    }
    rig.finish();
}

pub(super) fn usage_follows_the_live_blocks(make: Factory) {
    let mut rig = Rig::new(make);
    let mut blocks = Vec::new();
    for (i, bytes) in SIZES.into_iter().enumerate() {
        blocks.push(rig.alloc(bytes, [S, T, U][i % 3]));
        rig.check_usage();
    }
    for ptr in blocks.iter().step_by(2) {
        rig.free(*ptr);
        rig.check_usage();
    }
    rig.sync();
    let (usage, live) = (rig.usage(), rig.live_bytes());
    if rig.traits.held {
        assert_eq!(
            usage.used_bytes,
            live,
            "{}: after a synchronisation what is in use is what is live",
            rig.label()
        );
    }
    rig.free_all();
    rig.sync();
    if rig.traits.held {
        assert_eq!(rig.usage().used_bytes, 0, "{}", rig.label());
    }
    rig.finish();
}

pub(super) fn trim_after_a_synchronisation_gives_back_what_is_free(make: Factory) {
    let mut rig = Rig::new(make);
    let a = rig.alloc(3 << 20, S);
    rig.alloc(4096, S);
    rig.alloc(5 << 20, T);
    let d = rig.alloc(1 << 20, T);
    rig.alloc(1001 * 512, S);
    rig.free(a);
    rig.free(d);
    rig.sync();
    let label = rig.label();
    let before = rig.usage();
    rig.resource.trim(u64::MAX).unwrap();
    assert_eq!(
        rig.usage(),
        before,
        "{label}: trim keeping everything gave back"
    );
    rig.resource.trim(0).unwrap();
    let now = rig.usage();
    // What a live block may keep reserved: its bytes to the granule, and a granule it straddles.
    let bound: u64 = (rig.live.iter())
        .map(|b| b.bytes.next_multiple_of(GRANULE_BYTES) + GRANULE_BYTES)
        .sum();
    match rig.traits.trims {
        true => assert!(
            now.reserved_bytes <= bound,
            "{label}: trim(0) kept {now:?} for {} B live",
            rig.live_bytes()
        ),
        false => assert_eq!(now, before, "{label}: it does not trim"),
    }
    rig.use_all();
    rig.check_usage();
    rig.free_all();
    rig.sync();
    rig.resource.trim(0).unwrap();
    if rig.traits.trims {
        assert_eq!(
            rig.usage().reserved_bytes,
            0,
            "{label}: trim(0) of nothing live"
        );
    }
    rig.finish();
}

/// A resource that applies its frees by itself (`frees_applied_at_sync` false: the device's idle
/// release trims it without synchronising first) gives back on `trim(0)` everything free, with
/// work still queued on the blocks and no synchronisation before the trim.
pub(super) fn a_trim_with_no_synchronisation_before_it_gives_back_what_its_traits_say(
    make: Factory,
) {
    let mut rig = Rig::new(make);
    rig.alloc(3 << 20, S);
    rig.alloc(4096, T);
    rig.alloc(1 << 20, S);
    rig.use_all();
    rig.free_all();
    rig.resource.trim(0).unwrap();
    if rig.traits.trims && !rig.traits.frees_applied_at_sync {
        assert_eq!(
            rig.usage().reserved_bytes,
            0,
            "{}: trim(0) with no synchronisation before it kept memory (frees_applied_at_sync \
             should say so)",
            rig.label()
        );
    }
    rig.finish();
}

pub(super) fn exhaustion_then_recovery_after_frees(make: Factory) {
    const BLOCK_BYTES: u64 = 4 << 20;
    let mut rig = Rig::new(make);
    let label = rig.label();
    let error = loop {
        match rig.try_alloc(BLOCK_BYTES, S) {
            Ok(_) => assert!(rig.live.len() < 1000, "{label}: never ran out"),
            Err(e) => break e,
        }
    };
    assert!(error.is_device_oom(), "{label}: ran out with {error}");
    let n = rig.live.len();
    assert!(
        n as u64 >= MEMORY_BYTES / BLOCK_BYTES * 3 / 4,
        "{label}: ran out after {n} blocks of {BLOCK_BYTES} B on a device of {MEMORY_BYTES} B"
    );
    let before = rig.snapshot();
    assert!(rig.resource.allocate(BLOCK_BYTES, S).is_err());
    assert_eq!(
        rig.snapshot(),
        before,
        "{label}: a refused request changed something"
    );
    rig.use_all();
    // The memory S freed serves S again at once.
    rig.free_all();
    for _ in 0..n {
        rig.alloc(BLOCK_BYTES, S);
    }
    rig.free_all();
    // After a synchronisation and a trim, it serves other streams too.
    rig.sync();
    rig.resource.trim(0).unwrap();
    if rig.traits.reuses_across_streams {
        for _ in 0..n {
            rig.alloc(BLOCK_BYTES, T);
        }
    }
    rig.finish();
}

/// A block handed back at a synchronisation with the work of all its streams done
/// (`deallocate_idle`): a resource that takes idle blocks hands it to another stream at once,
/// with no GPU-side wait; any other frees it as `deallocate` does (the rig's use of the next
/// block on T checks the order either way). A large block: small ones may come from carriers
/// of their stream's own (the vmm resource's slabs).
pub(super) fn a_block_given_back_idle_serves_another_stream_as_its_traits_say(make: Factory) {
    let mut rig = Rig::new(make);
    {
        let bytes = 3 << 20;
        let p = rig.alloc(bytes, S);
        let b = rig.block(p);
        rig.use_on_gpu(b.ptr, b.bytes, b.stream);
        rig.sim.complete_all();
        let label = rig.label();
        if let Err(e) = rig.resource.deallocate_idle(b.ptr, b.bytes, b.stream) {
            panic!("{label}: giving {p:#x} back idle: {e}");
        }
        rig.forget(p);
        let waits = rig.sim.calls("cuStreamWaitEvent");
        let q = rig.alloc(bytes, T);
        if rig.traits.takes_idle_blocks {
            assert_eq!(
                (q, rig.sim.calls("cuStreamWaitEvent") - waits),
                (p, 0),
                "{label}: {bytes} B given back idle on S did not serve T at once"
            );
        }
        rig.free(q);
    }
    rig.finish();
}

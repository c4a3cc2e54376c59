//! Cache eviction before the replay's timed calls (`REPLAY_EVICT_BYTES`), so that callgrind's
//! cache simulation counts the lines an allocation touches from cold (docs/replay.md, "Cache
//! lines, beside instructions"; `scripts/hot-path-gate --cold-lines`).
//!
//! Invariant: unset or 0, nothing is written; the buffer is each thread's own.

/// With `REPLAY_EVICT_BYTES=N`, writes a line of every 64 bytes of an N-byte buffer before each
/// timed call, as a workload's own host code between two allocations does: under callgrind's
/// cache simulation (`--cache-sim=yes`), the misses counted inside the timed calls are then the
/// cache lines the allocator touches from cold, which instruction counts do not see.
pub fn evict_caches() {
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; evict_bytes()]);
    }
    BUFFER.with_borrow_mut(|buffer| {
        if buffer.is_empty() {
            return;
        }
        for line in buffer.chunks_mut(64) {
            // SAFETY: a valid, exclusive pointer to the line's first byte.
            unsafe { std::ptr::write_volatile(line.as_mut_ptr(), line[0].wrapping_add(1)) };
        }
        warm_stack();
    });
}

/// `REPLAY_EVICT_BYTES`: bytes, a whole number (0 or unset: nothing evicted).
fn evict_bytes() -> usize {
    match std::env::var("REPLAY_EVICT_BYTES") {
        Err(_) => 0,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            panic!("REPLAY_EVICT_BYTES={v:?}: a whole number of bytes, such as 4194304")
        }),
    }
}

/// Writes the 32 KiB of stack below the caller: the workload's own deep calls (kernel launches)
/// keep the stack the allocator's frames use in cache, so those lines are no misses of its.
#[inline(never)]
fn warm_stack() {
    let mut stack = [0u8; 32 << 10];
    for line in stack.chunks_mut(64) {
        // SAFETY: a valid, exclusive pointer to the line's first byte.
        unsafe { std::ptr::write_volatile(line.as_mut_ptr(), 1) };
    }
    std::hint::black_box(&stack);
}

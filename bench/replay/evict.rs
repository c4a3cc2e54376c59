//! Cache eviction before the replay's timed calls (`REPLAY_EVICT_BYTES`, `REPLAY_EVICT_CODE`), so
//! that callgrind's cache simulation counts the lines of data and of code an allocation touches
//! from cold (docs/replay.md, "Cache lines, beside instructions"; `scripts/hot-path-gate
//! --cold-lines`).
//!
//! Invariant: unset or 0, nothing is written or run; the buffer is each thread's own.

/// With `REPLAY_EVICT_BYTES=N`, writes a line of every 64 bytes of an N-byte buffer before each
/// timed call, as a workload's own host code between two allocations does: under callgrind's
/// cache simulation (`--cache-sim=yes`), the misses counted inside the timed calls are then the
/// cache lines the allocator touches from cold, which instruction counts do not see.
pub fn evict_caches() {
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; evict_bytes()]);
    }
    thread_local! {
        static CODE: bool = evict_code_asked();
    }
    if CODE.with(|asked| *asked) {
        run_straight_code();
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

/// `REPLAY_EVICT_CODE`: 1 runs 40 KiB of code before each timed call (0 or unset: none).
fn evict_code_asked() -> bool {
    match std::env::var("REPLAY_EVICT_CODE").as_deref() {
        Err(_) | Ok("0") => false,
        Ok("1") => true,
        Ok(v) => panic!("REPLAY_EVICT_CODE={v:?}: 1 (evict the code cache) or 0"),
    }
}

/// Runs 40 KiB of straight-line code (5,120 eight-byte no-ops), more than the 32 KiB level-1
/// code cache that docs/replay.md has callgrind simulate (`--I1=32768,8,64`), as the workload's
/// own host code between two allocations does: the allocator's code is then fetched from cold
/// too, and callgrind's I1 misses in the timed calls count its lines.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn run_straight_code() {
    // SAFETY: no-op instructions only: no memory, stack, register or flag is touched.
    unsafe {
        std::arch::asm!(
            ".rept 5120",
            ".byte 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00",
            ".endr",
            options(nomem, nostack, preserves_flags)
        )
    };
}

/// (Other targets: the no-ops above are x86-64's.)
#[cfg(not(target_arch = "x86_64"))]
fn run_straight_code() {
    panic!("REPLAY_EVICT_CODE=1: the code eviction is written for x86-64 only");
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

//! The C-ABI fuzz target's model: the blocks callers own (shared by the threads, for the overlap
//! check) and one thread's operations with the outcome each must have.

use super::calls::{export_import, queries};
use super::*;

/// A block a caller owns: `bytes` as requested.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub ptr: u64,
    pub bytes: u64,
    pub device: c_int,
    pub stream: u8,
    /// Allocated inside a shareable scope: exportable.
    pub shareable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// malloc returned it, free was not called yet: nothing may overlap it.
    Live,
    /// free was called and has not returned: the allocator may hand it out again.
    Freeing,
}

/// Every block the threads own or are freeing, with its state.
#[derive(Default)]
pub struct Registry(Mutex<Vec<(Block, State)>>);

impl Registry {
    fn allocated(&self, block: Block) {
        let mut blocks = self.0.lock().unwrap();
        for (other, state) in blocks.iter() {
            let overlap = other.device == block.device
                && block.ptr < other.ptr + other.bytes
                && other.ptr < block.ptr + block.bytes;
            assert!(
                !overlap || *state == State::Freeing,
                "device {}: new block {:#x}+{} overlaps live block {:#x}+{}",
                block.device,
                block.ptr,
                block.bytes,
                other.ptr,
                other.bytes
            );
        }
        blocks.push((block, State::Live));
    }

    fn set_state(&self, block: Block, from: State, to: Option<State>) {
        let mut blocks = self.0.lock().unwrap();
        let i = blocks
            .iter()
            .position(|(b, s)| b.ptr == block.ptr && b.device == block.device && *s == from)
            .expect("a registered block");
        match to {
            Some(state) => blocks[i].1 = state,
            None => {
                blocks.swap_remove(i);
            }
        }
    }

    /// Requested bytes of the live blocks on `device`.
    fn live_bytes(&self, device: c_int) -> u64 {
        let blocks = self.0.lock().unwrap();
        blocks
            .iter()
            .filter(|(b, s)| b.device == device && *s == State::Live)
            .map(|(b, _)| b.bytes)
            .sum()
    }
}

/// Frees `block` through `streampool_free` or `my_free`: marked freeing before the call, out of
/// the registry after it.
pub fn free(registry: &Registry, block: Block, with_my_free: bool) {
    registry.set_state(block, State::Live, Some(State::Freeing));
    let (ptr, s) = (block.ptr as *mut c_void, stream(block.stream));
    if with_my_free {
        clear_last_error();
        // SAFETY: a block this library returned for that device.
        unsafe { my_free(ptr, block.bytes as isize, block.device, s) };
        assert_eq!(last_error(), "", "my_free of a live block");
    } else {
        // SAFETY: as above.
        let status = unsafe { streampool_free(ptr, block.bytes as usize, block.device, s) };
        expect("streampool_free", status, OK);
    }
    registry.set_state(block, State::Freeing, None);
}

/// One thread's view: its blocks, its shareable scope depth.
pub struct Thread<'a> {
    registry: &'a Registry,
    handoff: &'a Mutex<Vec<Block>>,
    /// The only thread: the statistics must follow the model after every operation.
    alone: bool,
    owned: Vec<Block>,
    depth: c_int,
}

impl<'a> Thread<'a> {
    pub fn new(registry: &'a Registry, handoff: &'a Mutex<Vec<Block>>, alone: bool) -> Self {
        Thread {
            registry,
            handoff,
            alone,
            owned: Vec::new(),
            depth: 0,
        }
    }

    fn pick(&mut self, pick: u16) -> Option<Block> {
        let n = self.owned.len();
        (n > 0).then(|| self.owned[usize::from(pick) % n])
    }

    fn take(&mut self, pick: u16) -> Option<Block> {
        let n = self.owned.len();
        (n > 0).then(|| self.owned.swap_remove(usize::from(pick) % n))
    }

    /// A foreign address: NULL, inside an owned block (never a block's start: blocks are
    /// 512-byte aligned), or where nothing is.
    fn foreign(&mut self, what: Foreign) -> u64 {
        match what {
            Foreign::Null => 0,
            Foreign::Inside(pick) => self.pick(pick).map_or(SIM_BASE + 256, |b| b.ptr + 256),
            Foreign::Nowhere(x) => SIM_BASE + u64::from(x) * 512 + 256,
        }
    }

    /// Checks what a malloc of `bytes` on `device` returned (`message` is the error's, from the
    /// last error or the exception) and keeps the block.
    fn malloc_returned(
        &mut self,
        call: &str,
        p: *mut c_void,
        bytes: u64,
        device: c_int,
        s: u8,
        message: &str,
    ) {
        let ptr = p as u64;
        match malloc_verdict(bytes, device) {
            Err(why) => {
                assert_eq!(
                    ptr, 0,
                    "{call}({bytes}, {device}) succeeded; expected {why}"
                );
                // A bad device is refused first, whatever the size but 0; a size above the
                // maximum is an out-of-memory error.
                assert!(
                    message.contains(why)
                        && (bytes <= MAX_ALLOCATION_BYTES
                            || why == "device index"
                            || message.starts_with("CUDA out of memory. Tried to allocate ")),
                    "{call}({bytes}, {device}): {message:?} lacks {why:?}"
                );
            }
            Ok(()) if bytes == 0 => assert_eq!((ptr, message), (0, ""), "{call}(0)"),
            Ok(()) if ptr == 0 => assert!(
                message.starts_with("CUDA out of memory."),
                "{call}({bytes}, {device}) failed: {message:?}"
            ),
            Ok(()) => {
                assert_eq!(ptr % 512, 0, "{call}: {ptr:#x} is not 512-byte aligned");
                let block = Block {
                    ptr,
                    bytes,
                    device,
                    stream: s,
                    shareable: self.depth > 0,
                };
                self.registry.allocated(block);
                self.owned.push(block);
            }
        }
    }

    pub fn step(&mut self, op: Op) {
        match op {
            Op::Malloc {
                size,
                device,
                stream: s,
            } => {
                let (bytes, d) = (size.bits(), device.index());
                // SAFETY: a simulated stream; any size and device.
                let p = unsafe { streampool_malloc(bytes as usize, d, stream(s)) };
                let message = if p.is_null() {
                    last_error()
                } else {
                    String::new()
                };
                self.malloc_returned("streampool_malloc", p, bytes, d, s, &message);
            }
            Op::MyMalloc {
                size,
                device,
                stream: s,
            } => {
                let (size, d) = (size.bits() as isize, device.index());
                let mut message = [0 as c_char; 512];
                let mut threw = -1;
                // SAFETY: the buffer is 512 bytes; my_malloc's exceptions stop in the shim.
                let p = unsafe {
                    fuzz_catch_my_malloc(
                        my_malloc,
                        size,
                        d,
                        stream(s),
                        message.as_mut_ptr(),
                        512,
                        &mut threw,
                    )
                };
                // SAFETY: the shim NUL-terminates the buffer.
                let message = unsafe { CStr::from_ptr(message.as_ptr()) }.to_string_lossy();
                assert_ne!(
                    threw, 2,
                    "my_malloc threw something else than a std::exception"
                );
                // It returns NULL for size 0 (whatever the device), and throws for every failure.
                let null_without_error = size == 0;
                assert_eq!(
                    threw == 1,
                    p.is_null() && !null_without_error,
                    "my_malloc({size}, {d}) gave {p:?}: {message}"
                );
                if size < 0 {
                    assert!(
                        message.contains("must not be negative"),
                        "my_malloc({size}): {message}"
                    );
                } else {
                    self.malloc_returned("my_malloc", p, size as u64, d, s, &message);
                }
            }
            Op::Free { pick, with_my_free } => {
                if let Some(block) = self.take(pick) {
                    free(self.registry, block, with_my_free);
                }
            }
            Op::FreeForeign {
                what,
                device,
                with_my_free,
            } => {
                let (addr, d) = (self.foreign(what), device.index());
                let want = match (addr, valid(d)) {
                    (0, _) => None,
                    (_, false) => Some((INVALID, "device index")),
                    (_, true) => Some((UNKNOWN, "unknown pointer")),
                };
                let ptr = addr as *mut c_void;
                if with_my_free {
                    clear_last_error();
                    // SAFETY: a foreign pointer must be refused, not touched.
                    unsafe { my_free(ptr, 0, d, stream(0)) };
                    match want {
                        None => assert_eq!(last_error(), ""),
                        Some((_, message)) => expect_message("my_free", message),
                    }
                } else {
                    // SAFETY: as above.
                    let status = unsafe { streampool_free(ptr, 0, d, stream(0)) };
                    expect(
                        "streampool_free",
                        status,
                        want.map_or(OK, |(status, _)| status),
                    );
                }
            }
            Op::Handoff { pick } => {
                if let Some(block) = self.take(pick) {
                    self.handoff.lock().unwrap().push(block);
                }
            }
            Op::FreeHandedOff => {
                let block = self.handoff.lock().unwrap().pop();
                if let Some(block) = block {
                    free(self.registry, block, false);
                }
            }
            Op::RecordStream { pick, stream: s } => {
                if let Some(block) = self.pick(pick) {
                    clear_last_error();
                    // SAFETY: a live block and a simulated stream.
                    unsafe { streampool_record_stream(block.ptr as *mut c_void, stream(s)) };
                    assert_eq!(last_error(), "", "record_stream of a live block");
                }
            }
            Op::RecordStreamForeign { what, stream: s } => {
                let addr = self.foreign(what);
                clear_last_error();
                // SAFETY: a foreign pointer must be refused.
                unsafe { streampool_record_stream(addr as *mut c_void, stream(s)) };
                match addr {
                    0 => assert_eq!(last_error(), ""),
                    _ => expect_message("streampool_record_stream", "unknown pointer"),
                }
            }
            Op::EmptyCache => {
                clear_last_error();
                // SAFETY: no arguments.
                unsafe { streampool_empty_cache() };
                assert_eq!(last_error(), "", "empty_cache");
            }
            Op::Trim { device, keep } => {
                let d = device.index();
                // SAFETY: no pointers.
                let status = unsafe { streampool_trim(d, keep) };
                expect(
                    "streampool_trim",
                    status,
                    if valid(d) { OK } else { INVALID },
                );
            }
            Op::SetReleaseThreshold { device, bytes } => {
                let d = device.index();
                // SAFETY: no pointers.
                let status = unsafe { streampool_set_release_threshold(d, bytes) };
                expect(
                    "streampool_set_release_threshold",
                    status,
                    if valid(d) { OK } else { INVALID },
                );
            }
            Op::SetMemoryFraction { device, fraction } => {
                let (d, f) = (device.index(), fraction.value());
                clear_last_error();
                // SAFETY: no pointers.
                unsafe { streampool_set_memory_fraction(f, d) };
                if !valid(d) {
                    expect_message("streampool_set_memory_fraction", "device index");
                } else if !(0.0..=1.0).contains(&f) {
                    expect_message("streampool_set_memory_fraction", "memory fraction");
                } else {
                    assert_eq!(last_error(), "", "set_memory_fraction({f}, {d})");
                    if self.alone {
                        let want = (MEMORY_BYTES as f64 * f) as u64;
                        assert_eq!(stats(d).memory_limit_bytes, want, "fraction {f}");
                    }
                }
            }
            Op::ResetPeakStats { device } => {
                let d = device.index();
                clear_last_error();
                // SAFETY: no pointers.
                unsafe { streampool_reset_peak_stats(d) };
                if !valid(d) {
                    expect_message("streampool_reset_peak_stats", "device index");
                } else if self.alone {
                    let s = stats(d);
                    assert_eq!(s.allocated_bytes_peak, s.allocated_bytes);
                }
            }
            Op::GetStats { device, null_out } => {
                let d = device.index();
                let mut s = StreampoolStats::default();
                let out = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut s as *mut _
                };
                // SAFETY: NULL or writable.
                let status = unsafe { streampool_get_stats(d, out) };
                expect(
                    "streampool_get_stats",
                    status,
                    if valid(d) && !null_out { OK } else { INVALID },
                );
            }
            Op::ParseBytes {
                spec,
                device,
                null_out,
            } => {
                let text = match spec {
                    Spec::Known(i) => SPECS[usize::from(i) % SPECS.len()].to_string(),
                    Spec::Text(t) => t,
                };
                let Ok(text) = CString::new(text) else { return };
                let mut bytes = 0u64;
                let out = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut bytes as *mut u64
                };
                // SAFETY: a NUL-terminated string; NULL or writable.
                let status = unsafe { streampool_parse_bytes(text.as_ptr(), device.index(), out) };
                let allowed = !null_out && valid(device.index());
                let want = if status == OK && allowed { OK } else { INVALID };
                expect("streampool_parse_bytes", status, want);
            }
            Op::EnablePeerAccess { device } => {
                let d = device.index();
                // SAFETY: no pointers.
                let status = unsafe { streampool_enable_peer_access(d) };
                expect(
                    "streampool_enable_peer_access",
                    status,
                    if d == -1 || valid(d) { OK } else { INVALID },
                );
            }
            Op::RecordHistory { on, max_entries } => {
                // SAFETY: no pointers.
                let status =
                    unsafe { streampool_record_history(c_int::from(on), usize::from(max_entries)) };
                expect(
                    "streampool_record_history",
                    status,
                    if on && max_entries == 0 { INVALID } else { OK },
                );
            }
            Op::History { capacity, null_out } => self.history(usize::from(capacity), null_out),
            Op::Blocks {
                device,
                capacity,
                null_out,
            } => self.blocks(device.index(), usize::from(capacity), null_out),
            Op::ShareableBegin => {
                // SAFETY: no arguments.
                self.depth += 1;
                assert_eq!(unsafe { streampool_shareable_begin() }, self.depth);
            }
            Op::ShareableEnd => {
                // SAFETY: no arguments.
                let depth = unsafe { streampool_shareable_end() };
                match self.depth {
                    0 => expect("streampool_shareable_end", depth, INVALID),
                    _ => {
                        self.depth -= 1;
                        assert_eq!(depth, self.depth);
                    }
                }
            }
            Op::ExportImport { pick, stream: s } => {
                if let Some(block) = self.pick(pick) {
                    export_import(block, stream(s));
                }
            }
            Op::Queries { device } => queries(device.index()),
            Op::Init { device_count } => {
                clear_last_error();
                // SAFETY: no pointers.
                unsafe { streampool_init(c_int::from(device_count)) };
                assert_eq!(last_error(), "", "streampool_init only warns");
            }
        }
        if self.alone {
            for d in 0..DEVICES {
                let (got, want) = (stats(d).allocated_bytes, self.registry.live_bytes(d));
                assert_eq!(got, want, "device {d}: allocated_bytes against the model");
            }
        }
    }

    fn history(&self, capacity: usize, null_out: bool) {
        let mut events = vec![StreampoolEvent::default(); capacity];
        let out = if null_out {
            std::ptr::null_mut()
        } else {
            events.as_mut_ptr()
        };
        let (mut count, mut dropped) = (usize::MAX, 0u64);
        // SAFETY: NULL or room for `capacity` events; count and dropped writable.
        let status = unsafe { streampool_history(out, capacity, &mut count, &mut dropped) };
        expect("streampool_history", status, OK);
        if !null_out {
            assert!(count <= capacity);
            let events = &events[..count];
            assert!(
                events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns),
                "timeline out of time order: {events:?}"
            );
            assert!(events.iter().all(|e| valid(e.device)));
        }
    }

    fn blocks(&self, d: c_int, capacity: usize, null_out: bool) {
        let mut blocks = vec![StreampoolBlock::default(); capacity];
        let out = if null_out {
            std::ptr::null_mut()
        } else {
            blocks.as_mut_ptr()
        };
        let mut count = usize::MAX;
        // SAFETY: NULL or room for `capacity` blocks; count writable.
        let status = unsafe { streampool_blocks(d, out, capacity, &mut count) };
        expect(
            "streampool_blocks",
            status,
            if valid(d) { OK } else { INVALID },
        );
        if status == OK && !null_out {
            assert!(count <= capacity);
            for b in &blocks[..count] {
                assert!(
                    b.address % 512 == 0 && b.device == d && b.block_bytes >= b.requested_bytes,
                    "{b:?}"
                );
            }
        }
    }

    /// Frees what is left and leaves the shareable scopes.
    pub fn finish(mut self) {
        for block in std::mem::take(&mut self.owned) {
            free(self.registry, block, false);
        }
        while self.depth > 0 {
            self.depth -= 1;
            // SAFETY: no arguments.
            assert_eq!(unsafe { streampool_shareable_end() }, self.depth);
        }
    }
}

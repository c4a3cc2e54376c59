//! The simulated device's own state: its streams' clocks (what each submitted and completed),
//! which streams' work each is ordered after (the waits not yet satisfied), and its address
//! space.
//!
//! Invariant: a stream's completed tick never passes its submitted one, and completing a
//! stream's work completes the work it waited for (its events' streams, up to the waited tick).

use super::*;

impl SimDevice {
    pub(super) fn tick(&mut self, stream: Stream) -> u64 {
        let clock = self.streams.entry(stream).or_default();
        clock.submitted += 1;
        let seq = clock.submitted;
        if self.keeps_up {
            self.complete_stream_to(stream, seq);
        }
        seq
    }

    pub(super) fn completed(&self, (stream, seq): (Stream, u64)) -> bool {
        self.streams
            .get(&stream)
            .is_some_and(|c| c.completed >= seq)
    }

    pub(super) fn complete_all_streams(&mut self) {
        for clock in self.streams.values_mut() {
            clock.completed = clock.submitted;
        }
        self.waits.clear();
        if !self.frees_applied_at_sync {
            self.retire_completed();
        }
    }

    /// Everything submitted to `stream` completes, and with it what it waited for.
    pub(super) fn complete_stream(&mut self, stream: Stream) {
        let to = self.streams.get(&stream).map_or(0, |c| c.submitted);
        self.complete_stream_to(stream, to);
    }

    /// `stream`'s work up to tick `to` completes, and with it what it waited for.
    pub(super) fn complete_stream_to(&mut self, stream: Stream, to: u64) {
        let mut work = vec![(stream, to)];
        while let Some((s, to)) = work.pop() {
            let clock = self.streams.entry(s).or_default();
            clock.completed = clock.completed.max(to.min(clock.submitted));
            let done = clock.completed;
            self.waits
                .retain(|w| match w.stream == s && w.from_tick <= done {
                    true => {
                        work.push(w.on);
                        false
                    }
                    false => true,
                });
        }
        if !self.frees_applied_at_sync {
            self.retire_completed();
        }
    }

    /// Keeps the high-water mark of memory in use; called where it can grow.
    pub(super) fn note_in_use(&mut self) {
        self.in_use_high_bytes = self.in_use_high_bytes.max(self.memory_in_use_bytes());
    }

    /// Bytes of device memory in use: pools' reservations, graph memory, physical handles,
    /// managed memory.
    pub(super) fn memory_in_use_bytes(&self) -> u64 {
        self.pools.iter().map(|p| p.reserved_bytes).sum::<u64>()
            + self.captured_live.values().sum::<u64>()
            + self.captured_pending.iter().map(|f| f.bytes).sum::<u64>()
            + self.vmm.physical_bytes()
            + self.managed.bytes()
    }

    /// `bytes` (rounded to 512) of fresh address space.
    pub(super) fn claim_range(&mut self, bytes: u64) -> Option<DevicePtr> {
        let bytes = round_up(bytes, ALIGN_BYTES)?;
        let fit = self
            .free_ranges
            .iter()
            .find(|(_, len)| **len >= bytes)
            .map(|(a, l)| (*a, *l));
        match fit {
            Some((addr, len)) => {
                self.free_ranges.remove(&addr);
                if len > bytes {
                    self.free_ranges.insert(addr + bytes, len - bytes);
                }
                Some(DevicePtr(addr))
            }
            None => {
                let addr = self.next_addr;
                let end = addr
                    .checked_add(bytes)
                    .filter(|&end| end <= self.addr_end)?;
                self.next_addr = end;
                Some(DevicePtr(addr))
            }
        }
    }

    pub(super) fn release_range(&mut self, addr: DevicePtr, bytes: u64) {
        let mut start = addr.0;
        let mut len = round_up(bytes, ALIGN_BYTES).expect("a range that was claimed");
        if let Some((&prev, &prev_len)) = self.free_ranges.range(..start).next_back() {
            if prev + prev_len == start {
                self.free_ranges.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.free_ranges.remove(&(start + len)) {
            len += next_len;
        }
        self.free_ranges.insert(start, len);
    }

    /// Pool memory and graph memory: allocated, and accessible from `from`.
    pub(super) fn touch_pool_memory(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        from: usize,
        device: usize,
    ) -> std::result::Result<(), String> {
        if self.captured_live.contains_key(&ptr)
            || self.imported.contains_key(&ptr)
            || self.is_managed(ptr, bytes)
        {
            return Ok(());
        }
        let pool = self.pools.iter().find(|p| p.holds(ptr, bytes));
        match pool {
            None => Err(format!(
                "{ptr:#x}+{bytes} is not allocated on device {device}"
            )),
            Some(p) if from != device && !p.peers.contains(&from) => Err(format!(
                "device {from} has no access to device {device}'s pool memory at {ptr:#x}"
            )),
            Some(_) => Ok(()),
        }
    }
}

/// True if `stream`'s new work is ordered after `work` of another stream: it waited for that
/// work or later work of its stream, directly or through streams that did, by `waits` (the
/// device's waits not yet satisfied: ask whether `work` completed first).
pub(super) fn ordered_after(waits: &[StreamWait], stream: Stream, work: (Stream, u64)) -> bool {
    // A stream and the last of its ticks whose work counts: its waits from that tick or before.
    let mut todo = vec![(stream, u64::MAX)];
    // Per stream, the latest tick searched from: an earlier one would find nothing more.
    let mut searched: HashMap<Stream, u64> = HashMap::new();
    while let Some((waiter, up_to_tick)) = todo.pop() {
        if searched
            .get(&waiter)
            .is_some_and(|&tick| tick >= up_to_tick)
        {
            continue;
        }
        searched.insert(waiter, up_to_tick);
        let waits = (waits.iter()).filter(|w| w.stream == waiter && w.from_tick <= up_to_tick);
        for w in waits {
            if w.on.0 == work.0 && w.on.1 >= work.1 {
                return true;
            }
            todo.push(w.on);
        }
    }
    false
}

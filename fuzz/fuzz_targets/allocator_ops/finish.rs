//! The end of an allocator_ops run: captures end, sleeping devices wake, held exports of pages
//! are released, every live block is freed, all work completes and the cache is emptied; then
//! the statistics must be back to zero and the simulator must hold and map nothing.

use super::{Harness, DEVICES};

impl Harness {
    /// Ends every capture, frees everything, completes all work, empties the cache: nothing may
    /// be left in the simulator.
    pub(super) fn finish(mut self) {
        let left = self.drain_faults(); // no more faults from here on
        assert_eq!(left, self.pending_faults);
        for (d, s) in std::mem::take(&mut self.capturing) {
            self.sim.end_capture(d, s);
        }
        self.wake_all();
        for (d, p, _, event) in std::mem::take(&mut self.page_exports) {
            (self.alloc.device(d as i64))
                .and_then(|dev| dev.release_export(event))
                .unwrap_or_else(|e| panic!("final release of the export of {p:#x}: {e}"));
        }
        let live: Vec<_> = self.live.keys().copied().collect();
        for (d, p) in live {
            self.alloc
                .free(p, d as i64)
                .unwrap_or_else(|e| panic!("final free of {p:#x} on device {d}: {e}"));
            let b = self.live.remove(&(d, p)).expect("live");
            self.counts[d].frees += 1;
            self.counts[d].freed_total += b.bytes;
        }
        self.sim.complete_all();
        self.alloc
            .empty_cache()
            .unwrap_or_else(|e| panic!("final empty_cache: {e}"));
        self.sim.complete_all();
        let stats = self.all_stats();
        self.check_stats(&stats);
        for (d, s) in stats.iter().enumerate() {
            assert_eq!(
                (s.allocated_bytes, s.active_bytes, s.cached_bytes),
                (0, 0, 0),
                "device {d}: bytes left after freeing everything and emptying the cache"
            );
            assert_eq!(s.num_allocs, s.num_frees, "device {d}: allocs != frees");
        }
        let leaked = self.sim.outstanding_bytes();
        assert_eq!(leaked, 0, "{leaked} bytes still allocated in the simulator");
        for d in 0..DEVICES {
            let mapped = self.sim.physical_bytes(d);
            assert_eq!(
                mapped, 0,
                "device {d}: {mapped} bytes still mapped after empty_cache"
            );
        }
    }
}

//! The simulator's race check (`SimDriver::check_races`): a "kernel" ([`SimDriver::touch`]) may
//! not use bytes that unfinished work of another stream still uses, unless its stream waited for
//! that work on the GPU — the mistake a stream-ordered allocator makes when it hands memory freed
//! on one stream to another too early. It works on addresses, for every kind of memory (pool,
//! graph, managed and mapped memory alike); the mapping check of `vmm.rs` covers the same
//! physical page mapped at two addresses.
//!
//! Invariant: off unless a test turns it on; the log keeps, per stream and range, the latest
//! unfinished use only, and forgets a use once its work has completed.
//!
//! [`SimDriver::touch`]: super::SimDriver::touch

use super::SimDevice;
use crate::driver::{DevicePtr, Stream};

/// One use of `[start, end)` by `stream`'s work up to tick `seq`.
#[derive(Debug, Clone, Copy)]
struct Use {
    start: u64,
    end: u64,
    stream: Stream,
    seq: u64,
}

/// The unfinished uses of a device's memory, when the check is on.
#[derive(Default)]
pub(super) struct Touches {
    pub(super) enabled: bool,
    uses: Vec<Use>,
}

impl SimDevice {
    /// Work of `stream` at tick `seq` uses `[ptr, ptr + bytes)`: an error naming the race if
    /// unfinished work of another stream uses any of it and `stream` did not wait for that work.
    pub(super) fn check_race(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: Stream,
        seq: u64,
    ) -> std::result::Result<(), String> {
        if !self.touches.enabled {
            return Ok(());
        }
        let end = ptr.0.checked_add(bytes).ok_or("range overflows")?;
        let mut uses = std::mem::take(&mut self.touches.uses);
        uses.retain(|u| !self.completed((u.stream, u.seq)));
        let waited = |u: &Use| super::device::ordered_after(&self.waits, stream, (u.stream, u.seq));
        let race = (uses.iter())
            .find(|u| u.stream != stream && u.start < end && ptr.0 < u.end && !waited(u))
            .copied();
        self.touches.uses = uses;
        let uses = &mut self.touches.uses;
        if let Some(u) = race {
            return Err(format!(
                "stream {stream:#x} used {ptr:#x}+{bytes} while unfinished work of stream {:#x} \
                 (tick {}) still uses {:#x}+{}, and it did not wait for that work",
                u.stream,
                u.seq,
                u.start,
                u.end - u.start
            ));
        }
        let same = |u: &&mut Use| u.stream == stream && u.start == ptr.0 && u.end == end;
        match uses.iter_mut().find(same) {
            Some(u) => u.seq = seq,
            None => uses.push(Use {
                start: ptr.0,
                end,
                stream,
                seq,
            }),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::driver::sim::SimDriver;
    use crate::driver::{PoolDriver, Stream, StreamDriver};

    const S: Stream = Stream(1);
    const T: Stream = Stream(2);

    #[test]
    fn a_use_by_another_stream_races_until_it_waited_or_the_work_completed() {
        let sim = SimDriver::new(1, 64 << 20).check_races();
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        let p = sim.alloc_async(0, pool, 4096, S).unwrap();
        sim.touch(0, 0, p, 4096, S).unwrap();
        sim.touch(0, 0, p, 4096, S).unwrap();
        let err = sim.touch(0, 0, p.offset(512), 512, T).unwrap_err();
        assert!(err.to_string().contains("did not wait"), "{err}");
        sim.touch(0, 0, p.offset(1024), 1024, S).unwrap();
        // Bytes S never used are free to use.
        let q = sim.alloc_async(0, pool, 512, T).unwrap();
        sim.touch(0, 0, q, 512, T).unwrap();
        // After a GPU-side wait for S's work, T may.
        let event = sim.event_create(0).unwrap();
        sim.event_record(0, event, S).unwrap();
        sim.stream_wait_event(0, T, event).unwrap();
        sim.touch(0, 0, p, 4096, T).unwrap();
        // S's new work did not wait for T's.
        assert!(sim.touch(0, 0, p, 512, S).is_err());
        // Once T's work completed, S may.
        sim.complete_stream(0, T);
        sim.touch(0, 0, p, 512, S).unwrap();
        sim.complete_all();
        sim.free_async(0, p, S).unwrap();
        sim.free_async(0, q, T).unwrap();
        sim.event_destroy(0, event);
        sim.complete_all();
        assert_eq!(sim.events_alive(0), 0);
        sim.pool_destroy(0, pool).unwrap();
    }

    #[test]
    fn a_wait_orders_after_what_the_waited_stream_had_waited_for_not_after_its_later_work() {
        const U: Stream = Stream(3);
        let sim = SimDriver::new(1, 64 << 20).check_races();
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        let p = sim.alloc_async(0, pool, 4096, S).unwrap();
        let [before_s, s_done, t_early, t_late] = [(); 4].map(|()| sim.event_create(0).unwrap());
        sim.event_record(0, before_s, S).unwrap();
        sim.touch(0, 0, p, 4096, S).unwrap();
        sim.event_record(0, s_done, S).unwrap();
        // T waits for S only up to before its use: not enough.
        sim.stream_wait_event(0, T, before_s).unwrap();
        let err = sim.touch(0, 0, p, 512, T).unwrap_err();
        assert!(err.to_string().contains("did not wait"), "{err}");
        // T's event recorded before it waits for S's use orders U after T's work only.
        sim.event_record(0, t_early, T).unwrap();
        sim.stream_wait_event(0, T, s_done).unwrap();
        sim.event_record(0, t_late, T).unwrap();
        sim.stream_wait_event(0, U, t_early).unwrap();
        assert!(sim.touch(0, 0, p, 512, U).is_err());
        // Waiting for T's later event orders U after S's use too, through T.
        sim.stream_wait_event(0, U, t_late).unwrap();
        sim.touch(0, 0, p, 512, U).unwrap();
        sim.complete_all();
        sim.free_async(0, p, S).unwrap();
        for event in [before_s, s_done, t_early, t_late] {
            sim.event_destroy(0, event);
        }
        sim.complete_all();
        sim.pool_destroy(0, pool).unwrap();
    }

    #[test]
    fn graph_memory_freed_on_a_stream_serves_it_at_once_and_others_once_its_work_completed() {
        let sim = SimDriver::new(1, 64 << 20).check_races();
        let p = sim.alloc_captured(0, 4096, S).unwrap();
        sim.touch(0, 0, p, 4096, S).unwrap();
        sim.free_async(0, p, S).unwrap();
        assert_eq!(
            sim.outstanding_bytes(),
            4096,
            "pending until S's work completes"
        );
        let q = sim.alloc_captured(0, 4096, T).unwrap();
        assert_ne!(q, p, "S's work still uses p");
        sim.touch(0, 0, q, 4096, T).unwrap();
        assert_eq!(
            sim.alloc_captured(0, 512, S).unwrap(),
            p,
            "S reuses its own free at once"
        );
        sim.free_async(0, p, S).unwrap();
        sim.free_async(0, q, T).unwrap();
        sim.complete_all();
        assert_eq!(sim.outstanding_bytes(), 0);
        let r = sim.alloc_captured(0, 4096, T).unwrap();
        sim.touch(0, 0, r, 4096, T).unwrap();
        sim.free_async(0, r, T).unwrap();
    }

    #[test]
    fn without_the_check_a_race_goes_unnoticed_and_other_streams_complete_alone() {
        let sim = SimDriver::new(1, 64 << 20);
        let pool = sim.pool_create(0, u64::MAX, false).unwrap();
        let p = sim.alloc_async(0, pool, 512, S).unwrap();
        sim.touch(0, 0, p, 512, S).unwrap();
        sim.touch(0, 0, p, 512, T).unwrap();
        sim.complete_other_streams(0, S);
        assert!(sim.stream_query(0, T).unwrap());
        assert!(!sim.stream_query(0, S).unwrap(), "S's work is not done");
        sim.complete_all();
        sim.free_async(0, p, S).unwrap();
        sim.complete_all();
        sim.pool_destroy(0, pool).unwrap();
    }
}

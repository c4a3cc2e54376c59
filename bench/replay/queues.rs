//! The replay's GPU (timing.rs) as the simulator sees it: per stream, the simulator's ticks
//! (what the allocator and the kernels submitted) noted so far, and those not completed yet with
//! when the modeled GPU completes them.
//!
//! Invariant: a stream's pending ticks are in stream order and each completes in the simulator
//! only once the modeled GPU has reached its time; nothing the simulator got on a stream is
//! completed before the work queued ahead of it.

use super::timing::Gpu;
use std::collections::VecDeque;
use streampool::driver::sim::SimDriver;
use streampool::driver::Stream;

/// The GPU's queues (timing.rs) and, per stream, the simulator's ticks noted so far and those
/// not completed yet with when the GPU completes them, in stream order.
pub struct GpuQueues {
    pub gpu: Gpu,
    streams: Vec<StreamQueue>,
}

/// A stream's ticks noted so far, and those noted and not completed yet: (tick, done at, us).
struct StreamQueue {
    stream: Stream,
    noted: u64,
    pending: VecDeque<(u64, u64)>,
}

impl GpuQueues {
    /// Empty queues for `streams`, on `gpu`.
    pub fn new(gpu: Gpu, streams: impl Iterator<Item = Stream>) -> Self {
        let streams = streams
            .map(|stream| StreamQueue {
                stream,
                noted: 0,
                pending: VecDeque::new(),
            })
            .collect();
        Self { gpu, streams }
    }

    /// What the simulator got on stream `i` since the last note completes at `done_us`.
    fn push(&mut self, sim: &SimDriver, i: usize, done_us: f64) {
        let q = &mut self.streams[i];
        let tick = sim.stream_tick(0, q.stream);
        if tick > q.noted {
            q.noted = tick;
            q.pending.push_back((tick, done_us as u64));
        }
    }

    /// What the allocator submitted to any stream since the last note (fence records): done
    /// once the work queued before it is.
    pub fn note_records(&mut self, sim: &SimDriver, now_us: f64) {
        for i in 0..self.streams.len() {
            let (stream, noted) = (self.streams[i].stream, self.streams[i].noted);
            if sim.stream_tick(0, stream) > noted {
                let done_us = self.gpu.run(stream.0 as u32, now_us, 0.0);
                self.push(sim, i, done_us);
            }
        }
    }

    /// Kernels of `work_us` queued on `stream` now: what the simulator got on it since the last
    /// note (`touch`) completes when they do. Note the allocator's records first.
    pub fn run(&mut self, sim: &SimDriver, stream: u32, now_us: f64, work_us: f64) {
        let done_us = self.gpu.run(stream, now_us, work_us);
        if let Some(i) = (self.streams.iter()).position(|q| q.stream.0 == stream as usize) {
            self.push(sim, i, done_us);
        }
    }

    /// The work the GPU has completed by `now_us` completes in the simulator.
    pub fn complete(&mut self, sim: &SimDriver, now_us: u64) {
        for q in &mut self.streams {
            let mut done = None;
            while let Some(&(tick, _)) = q.pending.front().filter(|(_, at_us)| *at_us <= now_us) {
                done = Some(tick);
                q.pending.pop_front();
            }
            if let Some(tick) = done {
                sim.complete_stream_to(0, q.stream, tick);
            }
        }
    }
}

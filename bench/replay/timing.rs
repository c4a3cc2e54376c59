//! When each event of a replay happens: the host's clock, and a GPU with one queue per stream
//! (microseconds).
//!
//! - Host: a trace's own timestamps (format 2) give the gap before each event; a trace without
//!   them is modeled: every event `host_us` after the one before (lowered to the measured time
//!   per step over the events of a step if the steps are faster than that), `x` markers none.
//!   A synchronisation `s` returns when every stream's queue is empty.
//! - GPU: after an allocation on stream S (or an `r` naming S) the program queues kernels on S
//!   that take `us_per_byte` × the allocation's bytes (kernels write what they allocate, and an
//!   `r` means reading it); a stream runs its queue in order, starting work no earlier than
//!   `latency_us` after the host queued it; `w` makes a stream's later work wait for another's.
//!   `us_per_byte` is calibrated per segment (the events up to a synchronisation) so that the
//!   segment ends when the trace's `s` says it did; without timestamps it is one figure, at
//!   least HBM's bandwidth, so that all segments take the measured time per step (`timing.txt`
//!   beside the traces) on average.
//! - Repeats: every host gap and every piece of GPU work is scaled by its own factor drawn
//!   uniformly from `[1 - jitter, 1 + jitter]`, seeded by the repeat's number; the background
//!   thread's first look falls anywhere in its period.
//!
//! Invariants: gaps and work are never negative; without jitter a replay's synchronisations
//! return when the trace's did (timestamps) or when the measured steps add up to (modeled); the
//! same trace, model and repeat give the same plan.

use super::trace::{Event, Trace};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// How often the allocator's background thread looks at the devices (src/background.rs).
pub const TEND_EVERY_US: u64 = 50_000;
/// The least GPU time per byte allocated: writing it once at HBM3's 3.35 TB/s (H100 SXM).
pub const LEAST_US_PER_BYTE: f64 = 1e6 / 3.35e12;

/// The timing model's settings.
#[derive(Debug, Clone)]
pub struct Model {
    /// Host time per event for traces without timestamps (at most; see the module notes).
    pub host_us: f64,
    /// An empty GPU queue's latency: work queued at `t` starts at `t + latency_us` at best.
    pub latency_us: f64,
    /// Relative spread of the repeats' factors (0: every repeat is the same).
    pub jitter: f64,
    /// The seed of repeat 0 (repeat `k` uses `seed + k`).
    pub seed: u64,
    /// Measured time per step of each workload (`timing.txt`), for traces without timestamps.
    pub step_us: BTreeMap<String, f64>,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            // The host-bound workloads measured on the GPU (churn, llama_decode) spend 7.3 and
            // 7.7 us of host time per allocator event (timing.txt's step times over the events
            // of their traces).
            host_us: 8.0,
            latency_us: 5.0,
            jitter: 0.5,
            seed: 1,
            step_us: BTreeMap::new(),
        }
    }
}

/// Reads `WORKLOAD STEP_US` lines (`#` comments) of `path` into `step_us`; a missing file is
/// no error (traces without timestamps then keep the host model and a GPU at HBM speed).
pub fn load_step_times(path: &Path, step_us: &mut BTreeMap<String, f64>) -> Result<(), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let us = match words.as_slice() {
            [_, us] => us.parse::<f64>().ok().filter(|us| *us > 0.0),
            _ => None,
        };
        let Some(us) = us else {
            return Err(format!(
                "{}:{}: {line:?} is not `WORKLOAD STEP_US` (a positive number)",
                path.display(),
                i + 1
            ));
        };
        step_us.insert(words[0].to_string(), us);
    }
    Ok(())
}

/// The GPU: one queue per stream, each busy until some time.
#[derive(Debug, Clone, Default)]
pub struct Gpu {
    pub latency_us: f64,
    busy_us: HashMap<u32, f64>,
}

impl Gpu {
    pub fn new(latency_us: f64) -> Gpu {
        Gpu {
            latency_us,
            busy_us: HashMap::new(),
        }
    }

    /// When `stream`'s queue is empty.
    pub fn busy_until(&self, stream: u32) -> f64 {
        self.busy_us.get(&stream).copied().unwrap_or(0.0)
    }

    /// Work of `work_us` queued on `stream` at `now_us`: when it completes.
    pub fn run(&mut self, stream: u32, now_us: f64, work_us: f64) -> f64 {
        let busy = self.busy_us.entry(stream).or_insert(0.0);
        *busy = busy.max(now_us + self.latency_us) + work_us;
        *busy
    }

    /// `stream`'s later work waits for what `other` has queued so far.
    pub fn wait(&mut self, stream: u32, other: u32) {
        let other_us = self.busy_until(other);
        let busy = self.busy_us.entry(stream).or_insert(0.0);
        *busy = busy.max(other_us);
    }

    /// When every queue is empty.
    pub fn idle_at(&self) -> f64 {
        self.busy_us.values().copied().fold(0.0, f64::max)
    }
}

/// A trace's timing before jitter: the host's gap before each event and each event's GPU work.
#[derive(Debug, Clone)]
pub struct Base {
    gaps_us: Vec<f64>,
    work_us: Vec<f64>,
    /// Where the times came from, for reports.
    pub source: String,
}

/// The bytes of GPU work each event queues (an allocation's on its stream, an `r`'s on the
/// stream it names), and that stream.
fn work_bytes(trace: &Trace) -> Vec<(u64, u32)> {
    let mut bytes_of: HashMap<u64, u64> = HashMap::new();
    (trace.events.iter())
        .map(|e| match *e {
            Event::Alloc { id, bytes, stream } => {
                bytes_of.insert(id, bytes);
                (bytes, stream)
            }
            Event::Record { id, stream } => (bytes_of.get(&id).copied().unwrap_or(0), stream),
            _ => (0, 0),
        })
        .collect()
}

/// How long the segment `range` (its last event a sync, or the trace's end) takes from its
/// start when the GPU takes `us_per_byte`: when the sync returns.
fn segment_us(
    trace: &Trace,
    range: std::ops::Range<usize>,
    gaps_us: &[f64],
    work: &[(u64, u32)],
    us_per_byte: f64,
    latency_us: f64,
) -> f64 {
    let mut gpu = Gpu::new(latency_us);
    let mut now_us = 0.0;
    for i in range {
        now_us += gaps_us[i];
        match trace.events[i] {
            Event::Wait { stream, other } => gpu.wait(stream, other),
            _ if work[i].0 > 0 => {
                gpu.run(work[i].1, now_us, work[i].0 as f64 * us_per_byte);
            }
            _ => {}
        }
    }
    now_us.max(gpu.idle_at())
}

/// The least `us_per_byte >= least` for which `time` reaches `target` (bisection; `least` if it
/// already does). `time` grows with its argument.
fn solve(least: f64, target: f64, time: impl Fn(f64) -> f64) -> f64 {
    if time(least) >= target {
        return least;
    }
    let mut hi = least.max(1e-9);
    while time(hi) < target && hi < 1e3 {
        hi *= 2.0;
    }
    let mut lo = least;
    for _ in 0..50 {
        let mid = (lo + hi) / 2.0;
        match time(mid) < target {
            true => lo = mid,
            false => hi = mid,
        }
    }
    hi
}

/// The segments of a trace: event ranges, each ending with a sync (the last one with the trace).
fn segments(trace: &Trace) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, e) in trace.events.iter().enumerate() {
        if e.synchronises() {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < trace.events.len() {
        out.push(start..trace.events.len());
    }
    out
}

/// The calibrated timing of `trace` (see the module notes).
pub fn base(trace: &Trace, model: &Model) -> Base {
    let n = trace.events.len();
    let work = work_bytes(trace);
    let latency = model.latency_us;
    let timed = trace.times_us.len() == n && n > 0;
    let mut gaps_us: Vec<f64> = match timed {
        true => (0..n)
            .map(|i| {
                i.checked_sub(1)
                    .map_or(0, |p| trace.times_us[i] - trace.times_us[p]) as f64
            })
            .collect(),
        false => vec![0.0; n],
    };
    let mut per_byte = vec![LEAST_US_PER_BYTE; n];
    let source;
    if timed {
        for range in segments(trace) {
            let last = range.end - 1;
            if !trace.events[last].synchronises() {
                continue;
            }
            // The sync's own gap is its wait: the model computes it.
            let target = (range.clone()).map(|i| gaps_us[i]).sum::<f64>().max(0.0);
            gaps_us[last] = 0.0;
            let r = range.clone();
            let c = solve(0.0, target, |c| {
                segment_us(trace, r.clone(), &gaps_us, &work, c, latency)
            });
            per_byte[range].fill(c);
        }
        source = "timestamps".to_string();
    } else {
        let busy = (trace.events.iter())
            .filter(|e| !matches!(e, Event::Step) && !e.synchronises())
            .count();
        let per_step = busy as f64 / trace.steps.max(1) as f64;
        let step_us = (trace.header("workload")).and_then(|w| model.step_us.get(w).copied());
        let host_us = match step_us {
            Some(step_us) => model.host_us.min(step_us / per_step),
            None => model.host_us,
        };
        for (gap, e) in gaps_us.iter_mut().zip(&trace.events) {
            if !matches!(e, Event::Step) && !e.synchronises() {
                *gap = host_us;
            }
        }
        let all = segments(trace);
        let total = |c: f64| -> f64 {
            (all.iter())
                .map(|r| segment_us(trace, r.clone(), &gaps_us, &work, c, latency))
                .sum()
        };
        let target = step_us.unwrap_or(0.0) * trace.steps as f64;
        let c = solve(LEAST_US_PER_BYTE, target, total);
        per_byte.fill(c);
        source = format!(
            "modeled: {host_us:.1} us/event, GPU {:.2} us/MiB{}",
            c * (1u64 << 20) as f64,
            step_us.map_or(" (HBM speed: no step time)".into(), |s| format!(
                " ({s:.0} us/step)"
            ))
        );
    }
    let work_us = (work.iter().zip(&per_byte))
        .map(|((bytes, _), c)| *bytes as f64 * c)
        .collect();
    Base {
        gaps_us,
        work_us,
        source,
    }
}

/// A seeded generator (splitmix64): the repeats' factors, the same on every machine.
struct Factors {
    state: u64,
    jitter: f64,
}

impl Factors {
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [1 - jitter, 1 + jitter].
    fn next(&mut self) -> f64 {
        1.0 + self.jitter * (2.0 * self.unit() - 1.0)
    }
}

/// One repeat's timing.
#[derive(Debug, Clone)]
pub struct Plan {
    pub repeat: u64,
    /// The host's gap before each event (a sync's is 0: it returns when the GPU is done).
    pub gaps_us: Vec<f64>,
    /// The GPU work each event queues (see [`work_bytes`] for the stream).
    pub work_us: Vec<f64>,
    pub latency_us: f64,
    /// The first look of the background thread (then every [`TEND_EVERY_US`]).
    pub first_tend_us: u64,
    pub source: String,
}

/// The times of repeat `repeat`, from a trace's calibrated `base`.
pub fn plan(base: &Base, model: &Model, repeat: u64) -> Plan {
    let mut rng = Factors {
        state: model.seed.wrapping_add(repeat),
        jitter: model.jitter.clamp(0.0, 1.0),
    };
    let first_tend_us = match rng.jitter > 0.0 {
        true => (rng.unit() * TEND_EVERY_US as f64) as u64,
        false => 0,
    };
    let mut scaled = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x * rng.next()).collect() };
    let gaps_us = scaled(&base.gaps_us);
    let work_us = scaled(&base.work_us);
    Plan {
        repeat,
        gaps_us,
        work_us,
        latency_us: model.latency_us,
        first_tend_us,
        source: base.source.clone(),
    }
}

/// The host's clock at each event of `trace` under `plan`: the gaps, and each sync returning
/// when every queue is empty (the queues as in the replay, run.rs).
pub fn host_times(trace: &Trace, plan: &Plan) -> Vec<f64> {
    let work = work_bytes(trace);
    let mut gpu = Gpu::new(plan.latency_us);
    let mut now_us = 0.0;
    (trace.events.iter().enumerate())
        .map(|(i, event)| {
            now_us += plan.gaps_us[i];
            match *event {
                Event::Sync | Event::EmptyCache => now_us = f64::max(now_us, gpu.idle_at()),
                Event::Wait { stream, other } => gpu.wait(stream, other),
                _ if work[i].0 > 0 => {
                    gpu.run(work[i].1, now_us, plan.work_us[i]);
                }
                _ => {}
            }
            now_us
        })
        .collect()
}

//! One replay: a [`Trace`] through streampool's real [`Allocator`] over a strict simulated
//! driver, under one configuration, and what it cost (memory held, driver calls, modeled time).
//!
//! Time and completion (the simulator runs no kernels, so the replay decides when work is done):
//! the simulator's clock is stopped and set to each event's host time (timing.rs); the GPU has
//! one queue per stream, and what the simulator submits to a stream during an event completes
//! when that queue gets there — the allocator's fence records once the work queued before them
//! is done, the kernels that use an allocation (`SimDriver::touch` at every `a`, and on the
//! stream an `r` names) after their modeled time. `w` makes a stream's later work wait for
//! another's on the GPU (PyTorch does not tell the allocator about it); a GPU-side wait the
//! allocator makes is the simulator's (completing the waiting stream completes what it waited
//! for), not the model's. `s` waits for every queue and completes everything (a device
//! synchronisation, which also applies a CUDA pool's release threshold). The allocator is
//! tended, as by its background thread, every 50 ms of host time. Trace stream N is simulated
//! stream N.
//!
//! Invariants: every driver call counted is one the allocator made (the replay's own
//! synchronisations are subtracted); the replay runs with the simulator strict, so handing out
//! memory that is not mapped, unmapping memory in use or leaking at the end is a failed replay,
//! not a figure; the background releaser is off and times come from the plan, so a replay
//! depends only on the trace, the configuration, the model and the repeat's number.

use super::costs::{modeled_s, DEFAULT_COSTS_US};
use super::queues::GpuQueues;
use super::timing::{self, Gpu, Plan, TEND_EVERY_US};
use super::trace::{Event, Trace};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DeviceDriver, DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

/// The driver calls reported, in table order: (name in the simulator, column header).
pub const CALLS: [(&str, &str); 15] = [
    ("cuMemCreate", "create"),
    ("cuMemMap", "map"),
    ("cuMemUnmap", "unmap"),
    ("cuMemSetAccess", "set-access"),
    ("cuMemSetAccess handles", "handles"),
    ("cuMemRelease", "release"),
    ("cuEventRecord", "ev-record"),
    ("cuEventQuery", "ev-query"),
    ("cuStreamQuery", "stream-query"),
    ("cuStreamWaitEvent", "wait"),
    ("cuMemAllocFromPoolAsync", "pool-alloc"),
    ("cuMemFreeAsync", "pool-free"),
    ("cuStreamSynchronize", "stream-sync"),
    ("cuCtxSynchronize", "device-sync"),
    ("cuMemGetInfo", "mem-info"),
];

/// A named set of `STREAMPOOL_*` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub name: String,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// When events happen on the host and on the GPU.
    pub timing: timing::Model,
    /// Repeats per trace and configuration (each with its own jitter).
    pub repeats: u64,
    /// Call name -> microseconds.
    pub costs_us: BTreeMap<String, f64>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            timing: timing::Model::default(),
            repeats: 1,
            costs_us: DEFAULT_COSTS_US
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }
    }
}

/// What one replay measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub trace: String,
    pub setting: String,
    pub repeat: u64,
    /// Where the times came from (the trace's timestamps or the model).
    pub timing: String,
    pub peak_live_bytes: u64,
    /// The largest `reserved_bytes` of the allocator's stats, read after every allocation, above
    /// the live bytes at the start (`before_start`, trace.rs), as the benchmark counts it.
    pub peak_reserved_bytes: u64,
    /// The allocator's own peak of live bytes (must equal the trace's).
    pub allocated_peak_bytes: u64,
    pub steps: u64,
    pub events: u64,
    /// Driver calls the allocator made, by name (every name of [`CALLS`]).
    pub calls: BTreeMap<String, u64>,
    /// The same, made after the trace's warm-up steps (its `schedule_steps ... (warm-up N)`
    /// header; all of them if it has none), and their modeled time: the steady state.
    pub timed_calls: BTreeMap<String, u64>,
    pub timed_modeled_s: f64,
    /// Allocations made after the warm-up steps (through `timed_malloc`), and the driver calls
    /// made inside those and their frees (`timed_free`): the allocator's own, none of its
    /// background tending's.
    pub timed_allocations: u64,
    pub timed_allocator_calls: u64,
    /// Pages mapped and unmapped, as the stats report them.
    pub stats_maps: u64,
    pub stats_unmaps: u64,
    /// `cuMemCreate` calls the device refused (calls less the handles the stats count).
    pub failed_creates: u64,
    /// The device's least free memory during the replay (its memory less the most in use).
    pub least_free_bytes: u64,
    /// At the trace's end, its work done and a trim to 0 (what an idle release gives back):
    /// what is held beyond the bytes still live, above the start (after every count above).
    pub after_trim_beyond_live_bytes: u64,
    pub modeled_driver_s: f64,
    pub replay_wall_s: f64,
    pub error: Option<String>,
}

impl Outcome {
    pub fn ratio(&self) -> f64 {
        match self.peak_live_bytes {
            0 => 0.0,
            live => self.peak_reserved_bytes as f64 / live as f64,
        }
    }

    pub fn call(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

/// The allocator's configuration for `setting`: the simulated driver, one device of 80 GiB
/// unless the setting (or, in `replay_planned`, the trace's `device_total_bytes`) says
/// otherwise. A variable streampool does not read is an error.
pub fn config_for(setting: &Setting) -> Result<Config, String> {
    let mut env: HashMap<&str, &str> = HashMap::from([
        ("STREAMPOOL_DRIVER", "sim"),
        ("STREAMPOOL_SIM_DEVICES", "1"),
        ("STREAMPOOL_SIM_MEMORY", "80GiB"),
    ]);
    for (k, v) in &setting.env {
        env.insert(k, v);
    }
    let asked = std::cell::RefCell::new(Vec::new());
    let config = Config::from_lookup(|name| {
        asked.borrow_mut().push(name.to_string());
        env.get(name).map(|v| v.to_string())
    })
    .map_err(|e| format!("configuration {:?}: {e}", setting.name))?;
    let asked = asked.into_inner();
    if let Some((k, _)) = setting.env.iter().find(|(k, _)| !asked.contains(k)) {
        return Err(format!(
            "configuration {:?}: {k} is not a variable streampool's configuration reads \
             (it reads: {})",
            setting.name,
            asked.join(", ")
        ));
    }
    Ok(Config {
        background: false,
        ..config
    })
}

/// Checks `setting` before anything runs: streampool's configuration, or the model of
/// expandable segments alone.
pub fn check_setting(setting: &Setting) -> Result<(), String> {
    match super::expandable::selected(setting) {
        true => super::expandable::check(setting),
        false => config_for(setting).map(|_| ()),
    }
}

/// Replays repeat `repeat` of `trace` under `setting` (calibrating its timing: for one replay;
/// [`replay_planned`] for many).
pub fn replay(trace: &Trace, setting: &Setting, options: &Options, repeat: u64) -> Outcome {
    let base = timing::base(trace, &options.timing);
    let plan = timing::plan(&base, &options.timing, repeat);
    replay_planned(trace, setting, options, &plan)
}

/// Replays `trace` under `setting` with the times of `plan`. A failure (out of memory, misuse
/// the strict simulator caught) is the outcome's `error`, with the event that caused it.
pub fn replay_planned(trace: &Trace, setting: &Setting, options: &Options, plan: &Plan) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome {
        trace: trace.name.clone(),
        setting: setting.name.clone(),
        repeat: plan.repeat,
        timing: plan.source.clone(),
        peak_live_bytes: trace.peak_live_bytes,
        steps: trace.steps,
        events: trace.events.len() as u64,
        ..Outcome::default()
    };
    if super::expandable::selected(setting) {
        out.error = super::expandable::check(setting).err();
        if out.error.is_none() {
            super::expandable::replay(trace, &mut out);
        }
        out.replay_wall_s = started.elapsed().as_secs_f64();
        return out;
    }
    let result = match config_for(setting) {
        Err(e) => Err(e),
        Ok(mut config) => {
            // The card the trace was captured on, unless the configuration says otherwise.
            let card_bytes = trace
                .header("device_total_bytes")
                .and_then(|b| b.parse().ok());
            if let Some(bytes) = card_bytes
                .filter(|_| !(setting.env.iter()).any(|(k, _)| k == "STREAMPOOL_SIM_MEMORY"))
            {
                config.sim_memory_bytes = bytes;
            }
            let run = std::panic::AssertUnwindSafe(|| drive(trace, plan, config, &mut out));
            match std::panic::catch_unwind(run) {
                Ok(result) => result,
                Err(panic) => Err(format!(
                    "the simulated driver stopped it: {}",
                    panic_text(&panic)
                )),
            }
        }
    };
    out.error = result.err();
    out.modeled_driver_s = modeled_s(&out.calls, &options.costs_us);
    out.timed_modeled_s = modeled_s(&out.timed_calls, &options.costs_us);
    out.replay_wall_s = started.elapsed().as_secs_f64();
    out
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (_, Some(s)) => s.to_string(),
        _ => "a panic".into(),
    }
}

fn drive(trace: &Trace, plan: &Plan, config: Config, out: &mut Outcome) -> Result<(), String> {
    let sim = Arc::new(SimDriver::new(config.sim_devices, config.sim_memory_bytes).strict());
    let alloc = Allocator::new(Arc::clone(&sim) as Arc<dyn Driver>, config)
        .map_err(|e| format!("cannot create the allocator: {e}"))?;
    let before: Vec<u64> = CALLS.iter().map(|(c, _)| sim.calls(c)).collect();
    sim.stop_clock();
    // The stopped clock reads the machine's: move it on to a whole second, so that what rounds
    // it to milliseconds (page ages, the idle watch) sees the same phase in every replay.
    sim.advance_clock_us(1_000_000 - sim.now_us() % 1_000_000);
    let streams = trace.streams.iter().map(|&s| Stream(s as usize));
    let mut gpu = GpuQueues::new(Gpu::new(plan.latency_us), streams);
    let (mut clock_us, mut tend_us) = (0u64, plan.first_tend_us);
    let warmup_steps: u64 = trace
        .header("schedule_steps")
        .and_then(|h| h.split("warm-up ").nth(1))
        .and_then(|w| w.trim_end_matches(')').trim().parse().ok())
        .unwrap_or(0);
    let mut timed_before = before.clone();
    let mut steps_seen = 0u64;
    let mut live: HashMap<u64, (DevicePtr, u64)> = HashMap::new();
    let mut own_syncs = 0u64;
    // What the benchmark allocates before its start (trace.rs): made first, measured above.
    let mut before_start_bytes = 0u64;
    for event in &trace.events {
        if let Event::Alloc { id, bytes, stream } = *event {
            if trace.before_start.contains(&id) {
                let ptr = (alloc.malloc(bytes, 0, Stream(stream as usize)))
                    .map_err(|e| format!("allocating before the start: {e}"))?;
                live.insert(id, (ptr, bytes));
                before_start_bytes += bytes;
            }
        }
    }
    sim.complete_all();
    let history_path = std::env::var_os("REPLAY_HISTORY");
    if history_path.is_some() {
        alloc
            .record_history(true, 1 << 24)
            .map_err(|e| format!("history: {e}"))?;
    }
    let start = alloc
        .device(0)
        .unwrap()
        .stats()
        .map_err(|e| format!("stats: {e}"))?;
    let host_us = timing::host_times(trace, plan);
    for (index, event) in trace.events.iter().enumerate() {
        let at = |e: String| format!("{}:{}: {event:?}: {e}", trace.name, trace.lines[index]);
        let now_us = host_us[index];
        // The clock moves on to the event, the background thread looking in on the way.
        let event_us = now_us as u64;
        while tend_us <= event_us {
            sim.advance_clock_us(tend_us - clock_us);
            clock_us = tend_us;
            gpu.complete(&sim, clock_us);
            alloc.tend();
            tend_us += TEND_EVERY_US;
        }
        sim.advance_clock_us(event_us - clock_us);
        clock_us = event_us;
        gpu.complete(&sim, clock_us);
        let work_us = plan.work_us[index];
        match *event {
            Event::Alloc { id, .. } if trace.before_start.contains(&id) => {}
            Event::Alloc { id, bytes, stream } => {
                let s = Stream(stream as usize);
                let timed = steps_seen >= warmup_steps;
                out.timed_allocations += u64::from(timed);
                let calls = &mut out.timed_allocator_calls;
                let ptr = match timed {
                    true => counting(&sim, calls, || timed_malloc(&alloc, bytes, s)),
                    false => alloc.malloc(bytes, 0, s),
                };
                let ptr = ptr.map_err(|e| at(e.to_string()))?;
                gpu.note_records(&sim, now_us);
                if ptr != DevicePtr::NULL {
                    sim.touch(0, 0, ptr, bytes, s)
                        .map_err(|e| at(e.to_string()))?;
                }
                gpu.run(&sim, stream, now_us, work_us);
                live.insert(id, (ptr, bytes));
                let reserved = alloc
                    .device(0)
                    .unwrap()
                    .stats()
                    .map_err(|e| at(e.to_string()))?
                    .reserved_bytes;
                let above_start = reserved.saturating_sub(start.allocated_bytes);
                out.peak_reserved_bytes = out.peak_reserved_bytes.max(above_start);
            }
            Event::Free { id } => {
                let (ptr, _) = live.remove(&id).expect("a parsed trace frees live IDs");
                let calls = &mut out.timed_allocator_calls;
                match steps_seen >= warmup_steps {
                    true => counting(&sim, calls, || timed_free(&alloc, ptr)),
                    false => alloc.free(ptr, 0),
                }
                .map_err(|e| at(e.to_string()))?;
                gpu.note_records(&sim, now_us);
            }
            Event::Record { id, stream } => {
                let (ptr, bytes) = live[&id];
                let s = Stream(stream as usize);
                if ptr != DevicePtr::NULL {
                    alloc.record_stream(ptr, s).map_err(|e| at(e.to_string()))?;
                    gpu.note_records(&sim, now_us);
                    sim.touch(0, 0, ptr, bytes, s)
                        .map_err(|e| at(e.to_string()))?;
                    gpu.run(&sim, stream, now_us, work_us);
                }
            }
            Event::Wait { stream, other } => gpu.gpu.wait(stream, other),
            Event::Sync => {
                // What `torch.cuda.synchronize()` does under `install()`: streampool_synchronizing,
                // PyTorch's synchronisation, streampool_synchronized (with a release threshold,
                // the resources that release at a synchronisation do).
                let device = alloc.device(0).unwrap();
                device.synchronizing().map_err(|e| at(e.to_string()))?;
                sim.synchronize(0).map_err(|e| at(e.to_string()))?;
                own_syncs += 1;
                device.synchronized().map_err(|e| at(e.to_string()))?;
            }
            Event::EmptyCache => {
                sim.synchronize(0).map_err(|e| at(e.to_string()))?;
                own_syncs += 1;
                alloc.empty_cache().map_err(|e| at(e.to_string()))?;
            }
            Event::Step => {
                steps_seen += 1;
                if steps_seen == warmup_steps {
                    timed_before = CALLS.iter().map(|(c, _)| sim.calls(c)).collect();
                }
            }
        }
    }
    for (((name, _), before), timed_before) in CALLS.iter().zip(before).zip(timed_before) {
        let mut n = sim.calls(name) - before;
        if *name == "cuCtxSynchronize" {
            n -= own_syncs;
        }
        out.calls.insert(name.to_string(), n);
        let timed = (sim.calls(name) - timed_before).min(n);
        out.timed_calls.insert(name.to_string(), timed);
    }
    let stats = alloc
        .device(0)
        .unwrap()
        .stats()
        .map_err(|e| format!("stats: {e}"))?;
    out.allocated_peak_bytes = stats.allocated_bytes_peak - before_start_bytes;
    out.stats_maps = stats.num_maps;
    out.stats_unmaps = stats.num_unmaps;
    out.failed_creates = out
        .call("cuMemCreate")
        .saturating_sub(stats.num_mem_creates);
    out.least_free_bytes = stats
        .device_total_bytes
        .saturating_sub(sim.in_use_high_bytes(0));
    sim.complete_all();
    if let Some(path) = history_path {
        super::report::write_history(&alloc, &path)?;
    }
    let device = alloc.device(0).map_err(|e| format!("device 0: {e}"))?;
    device
        .trim(0)
        .map_err(|e| format!("trim at the end: {e}"))?;
    let held = device.stats().map_err(|e| format!("stats: {e}"))?;
    // Above the start, as the peak: what was made before it (still live) is in neither.
    let live_bytes = (live.values().map(|&(_, bytes)| bytes).sum::<u64>()) - before_start_bytes;
    out.after_trim_beyond_live_bytes = (held.reserved_bytes)
        .saturating_sub(start.reserved_bytes)
        .saturating_sub(live_bytes);
    // Tidy up so that the strict simulator's leak check judges the allocator, not the replay.
    for (_, (ptr, _)) in live.drain() {
        alloc
            .free(ptr, 0)
            .map_err(|e| format!("freeing at the end: {e}"))?;
    }
    sim.complete_all();
    alloc
        .empty_cache()
        .map_err(|e| format!("empty_cache at the end: {e}"))?;
    drop(alloc);
    drop(sim);
    Ok(())
}

/// An allocation of a timed step (after the warm-up): a function of its own, so that
/// `scripts/hot-path-gate --traces` counts the allocator's instructions in the timed steps alone
/// (callgrind's `--toggle-collect`).
#[inline(never)]
fn timed_malloc(alloc: &Allocator, bytes: u64, stream: Stream) -> streampool::Result<DevicePtr> {
    alloc.malloc(bytes, 0, stream)
}

/// `call` (a timed malloc or free), the driver calls it made added to `calls` (read outside it,
/// so that callgrind does not count the reading).
fn counting<T>(sim: &SimDriver, calls: &mut u64, call: impl FnOnce() -> T) -> T {
    crate::evict::evict_caches();
    let before = sim.calls_total();
    let done = call();
    *calls += sim.calls_total() - before;
    done
}

/// A free of a timed step (see [`timed_malloc`]).
#[inline(never)]
fn timed_free(alloc: &Allocator, ptr: DevicePtr) -> streampool::Result<()> {
    alloc.free(ptr, 0)
}

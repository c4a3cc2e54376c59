//! One replay: a [`Trace`] through streampool's real [`Allocator`] over a strict simulated
//! driver, under one configuration, and what it cost (memory held, driver calls, modeled time).
//!
//! Stream completion (the simulator runs no kernels, so the replay decides when work is done):
//! every allocation is used by work on its stream at once (`SimDriver::touch`), and on a stream
//! given by `r`; all streams complete their work after every `complete_every_events` events (by
//! default 1: the GPU keeps up with the program), at `s` (a device synchronisation, which also
//! applies a CUDA pool's release threshold) and at `x` (the end of a step). `w` is not replayed:
//! PyTorch does not tell the allocator about stream waits. Trace stream N is simulated stream N.
//!
//! Invariants: every driver call counted is one the allocator made (the replay's own
//! synchronisations are subtracted); the replay runs with the simulator strict, so handing out
//! memory that is not mapped, unmapping memory in use or leaking at the end is a failed replay,
//! not a figure; the background releaser is off, so a replay is deterministic.

use super::trace::{Event, Trace};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use streampool::driver::sim::SimDriver;
use streampool::driver::{DeviceDriver, DevicePtr, Driver, Stream};
use streampool::{Allocator, Config};

/// The driver calls reported, in table order: (name in the simulator, column header).
pub const CALLS: [(&str, &str); 13] = [
    ("cuMemCreate", "create"),
    ("cuMemMap", "map"),
    ("cuMemUnmap", "unmap"),
    ("cuMemSetAccess", "set-access"),
    ("cuMemSetAccess handles", "handles"),
    ("cuMemRelease", "release"),
    ("cuEventRecord", "ev-record"),
    ("cuEventQuery", "ev-query"),
    ("cuStreamWaitEvent", "wait"),
    ("cuMemAllocFromPoolAsync", "pool-alloc"),
    ("cuMemFreeAsync", "pool-free"),
    ("cuStreamSynchronize", "stream-sync"),
    ("cuCtxSynchronize", "device-sync"),
];

/// Modeled cost of each call on an H100 (driver 580), microseconds; `cuMemSetAccess handles`
/// prices each handle a call covers beyond its first. Calls not listed cost 0 (not measured:
/// `cuMemRelease`, `cuStreamWaitEvent`; synchronisations depend on the GPU's work).
pub const DEFAULT_COSTS_US: [(&str, f64); 9] = [
    ("cuMemSetAccess", 25.0),
    ("cuMemSetAccess handles", 21.0),
    ("cuMemUnmap", 16.0),
    ("cuMemCreate", 14.0),
    ("cuMemMap", 3.0),
    // cuEventRecord + cuEventQuery measured together: 1.1 us, split evenly.
    ("cuEventRecord", 0.55),
    ("cuEventQuery", 0.55),
    // cuMemAllocFromPoolAsync + cuMemFreeAsync measured together: 0.8-1.25 us.
    ("cuMemAllocFromPoolAsync", 0.5),
    ("cuMemFreeAsync", 0.5),
];

/// A named set of `STREAMPOOL_*` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub name: String,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// All streams complete their work after every this many events (1, the default: the GPU
    /// keeps up, which reproduces the GPU's page counts on churn best); 0: only at `s` and `x`.
    pub complete_every_events: u64,
    /// Call name -> microseconds.
    pub costs_us: BTreeMap<String, f64>,
    /// If set, the simulator's clock is stopped and moves on by this many microseconds per
    /// event, and the allocator is tended (as by its background thread) every 50 ms of it:
    /// what depends on time (cold pages, idle release, fence intervals) follows the trace.
    pub event_us: Option<f64>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            complete_every_events: 1,
            event_us: None,
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
    pub peak_live_bytes: u64,
    /// The largest `reserved_bytes` of the allocator's stats, read after every allocation.
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
    /// Pages mapped and unmapped, as the stats report them.
    pub stats_maps: u64,
    pub stats_unmaps: u64,
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
/// unless the setting says otherwise. A variable streampool does not read is an error.
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

/// Replays `trace` under `setting`. A failure (out of memory, misuse the strict simulator
/// caught) is the outcome's `error`, with the event that caused it.
pub fn replay(trace: &Trace, setting: &Setting, options: &Options) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome {
        trace: trace.name.clone(),
        setting: setting.name.clone(),
        peak_live_bytes: trace.peak_live_bytes,
        steps: trace.steps,
        events: trace.events.len() as u64,
        ..Outcome::default()
    };
    let result = match config_for(setting) {
        Err(e) => Err(e),
        Ok(config) => {
            let run = std::panic::AssertUnwindSafe(|| drive(trace, config, options, &mut out));
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

fn drive(
    trace: &Trace,
    config: Config,
    options: &Options,
    out: &mut Outcome,
) -> Result<(), String> {
    let sim = Arc::new(SimDriver::new(config.sim_devices, config.sim_memory_bytes).strict());
    let alloc = Allocator::new(Arc::clone(&sim) as Arc<dyn Driver>, config)
        .map_err(|e| format!("cannot create the allocator: {e}"))?;
    let before: Vec<u64> = CALLS.iter().map(|(c, _)| sim.calls(c)).collect();
    if options.event_us.is_some() {
        sim.stop_clock();
    }
    let (mut clock_us, mut tended_us) = (0.0f64, 0.0f64);
    let warmup_steps: u64 = trace
        .header("schedule_steps")
        .and_then(|h| h.split("warm-up ").nth(1))
        .and_then(|w| w.trim_end_matches(')').trim().parse().ok())
        .unwrap_or(0);
    let mut timed_before = before.clone();
    let mut steps_seen = 0u64;
    let mut live: HashMap<u64, (DevicePtr, u64)> = HashMap::new();
    let mut own_syncs = 0u64;
    for (index, event) in trace.events.iter().enumerate() {
        let at = |e: String| format!("{}:{}: {event:?}: {e}", trace.name, trace.lines[index]);
        match *event {
            Event::Alloc { id, bytes, stream } => {
                let s = Stream(stream as usize);
                let ptr = alloc.malloc(bytes, 0, s).map_err(|e| at(e.to_string()))?;
                if ptr != DevicePtr::NULL {
                    sim.touch(0, 0, ptr, bytes, s)
                        .map_err(|e| at(e.to_string()))?;
                }
                live.insert(id, (ptr, bytes));
                let reserved = alloc
                    .stats(0)
                    .map_err(|e| at(e.to_string()))?
                    .reserved_bytes;
                out.peak_reserved_bytes = out.peak_reserved_bytes.max(reserved);
            }
            Event::Free { id } => {
                let (ptr, _) = live.remove(&id).expect("a parsed trace frees live IDs");
                alloc.free(ptr, 0).map_err(|e| at(e.to_string()))?;
            }
            Event::Record { id, stream } => {
                let (ptr, bytes) = live[&id];
                let s = Stream(stream as usize);
                if ptr != DevicePtr::NULL {
                    alloc.record_stream(ptr, s).map_err(|e| at(e.to_string()))?;
                    sim.touch(0, 0, ptr, bytes, s)
                        .map_err(|e| at(e.to_string()))?;
                }
            }
            Event::Wait { .. } => {}
            Event::Sync => {
                sim.synchronize(0).map_err(|e| at(e.to_string()))?;
                own_syncs += 1;
            }
            Event::Step => {
                sim.complete_all();
                steps_seen += 1;
                if steps_seen == warmup_steps {
                    timed_before = CALLS.iter().map(|(c, _)| sim.calls(c)).collect();
                }
            }
        }
        let every = options.complete_every_events;
        if every > 0 && (index as u64 + 1).is_multiple_of(every) {
            sim.complete_all();
        }
        if let Some(event_us) = options.event_us {
            let before_ms = (clock_us / 1000.0) as u64;
            clock_us += event_us;
            sim.advance_clock_ms((clock_us / 1000.0) as u64 - before_ms);
            if clock_us - tended_us >= 50_000.0 {
                tended_us = clock_us;
                alloc.tend();
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
    let stats = alloc.stats(0).map_err(|e| format!("stats: {e}"))?;
    out.allocated_peak_bytes = stats.allocated_bytes_peak;
    out.stats_maps = stats.num_maps;
    out.stats_unmaps = stats.num_unmaps;
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

/// The driver time the calls would take on the GPU, by the cost model.
pub fn modeled_s(calls: &BTreeMap<String, u64>, costs_us: &BTreeMap<String, f64>) -> f64 {
    let call = |name: &str| calls.get(name).copied().unwrap_or(0);
    let us: f64 = costs_us
        .iter()
        .map(|(name, cost)| {
            let n = match name.as_str() {
                // The first handle of each call is in the call's own price.
                "cuMemSetAccess handles" => {
                    call("cuMemSetAccess handles").saturating_sub(call("cuMemSetAccess"))
                }
                other => call(other),
            };
            n as f64 * cost
        })
        .sum();
    us / 1e6
}

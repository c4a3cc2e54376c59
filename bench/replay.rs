//! Replays allocation traces (bench/traces, `python3 -m bench.trace_capture`) through
//! streampool's real allocator on the simulated driver, to tune the backends' policies without
//! a GPU: per trace and configuration, peak reserved ÷ peak live bytes, the driver calls that
//! cost time, and a modeled driver time from measured H100 costs (run.rs), on a microsecond
//! clock with a GPU that lags the host as the trace says or as modeled (timing.rs), repeated
//! with seeded jitter (median and range). `--gate` compares the medians with a committed
//! baseline (gate.rs; CI runs it). The method: docs/replay.md.
//!
//! ```text
//! cargo bench --bench replay -- [--env VAR=VALUE]... [--config NAME:VAR=VALUE,...]...
//!     [--repeats N] [--jitter J] [--seed S] [--host-us US] [--latency-us US]
//!     [--cost CALL=US]... [--json FILE] TRACE...
//! cargo bench --bench replay -- --gate BASELINE [--update]
//! ```
//!
//! Without `--bench` (as `cargo test` runs it) it runs its self-check instead (checks.rs).
//! Invariant: every configuration replays every trace from a fresh allocator and simulator, and
//! a bad option is an error naming it, the value and what is accepted, before anything runs.

#[path = "replay/checks.rs"]
mod checks;
#[path = "replay/costs.rs"]
mod costs;
#[path = "replay/evict.rs"]
mod evict;
#[path = "replay/expandable.rs"]
mod expandable;
#[path = "replay/gate.rs"]
mod gate;
#[path = "replay/inflate.rs"]
mod inflate;
#[path = "replay/queues.rs"]
mod queues;
#[path = "replay/report.rs"]
mod report;
#[path = "replay/run.rs"]
mod run;
#[path = "replay/timing.rs"]
mod timing;
#[path = "replay/trace.rs"]
mod trace;

use report::Summary;
use run::{Options, Setting, CALLS};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use trace::Trace;

const USAGE: &str = "usage: cargo bench --bench replay -- [--env VAR=VALUE]... \
[--config NAME:VAR=VALUE,...]... [--repeats N] [--jitter J] [--seed S] [--host-us US] \
[--latency-us US] [--cost CALL=US]... [--json FILE] TRACE...
       cargo bench --bench replay -- --gate BASELINE [--update]
  --env VAR=VALUE     a STREAMPOOL_* variable for every configuration
  --config NAME:VARS  a configuration to compare: NAME, then VAR=VALUE pairs separated by commas
                      (`base:` for none); default: one configuration, \"default\";
                      `NAME:PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` replays a model of
                      PyTorch's expandable segments instead (memory only)
  --repeats N         replays of each trace and configuration, each with its own jitter (1)
  --jitter J          every host gap, GPU lag and latency scaled by a factor in [1-J, 1+J] (0.5)
  --seed S            the first repeat's seed (1)
  --host-us US        host time per event of a trace without timestamps, at most (8)
  --latency-us US     an empty GPU queue's latency (5)
  --cost CALL=US      the modeled cost of a driver call in microseconds (e.g. cuMemRelease=10)
  --json FILE         also write the results as JSON
  --gate BASELINE     replay what BASELINE lists as it says; fail if a median moved past its
                      allowance (--update: write the figures of this build into BASELINE)";

struct Cli {
    traces: Vec<PathBuf>,
    settings: Vec<Setting>,
    options: Options,
    json: Option<PathBuf>,
    gate: Option<PathBuf>,
    update: bool,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if !args.iter().any(|a| a == "--bench") {
        return checks::main(&args);
    }
    let args: Vec<String> = args.into_iter().filter(|a| a != "--bench").collect();
    let cli = match parse_cli(&args) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("replay: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(baseline) = &cli.gate {
        return gate::main(baseline, cli.update);
    }
    let mut options = cli.options.clone();
    let mut traces = Vec::new();
    for path in &cli.traces {
        match load(path, &mut options) {
            Ok(t) => traces.push(t),
            Err(e) => {
                eprintln!("replay: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let summaries = replay_all(&traces, &cli.settings, &options, true);
    print!("{}", report::table(&summaries, &cli.settings));
    if let Some(path) = &cli.json {
        let text = report::json(&summaries, &cli.settings, model_json(&options));
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("replay: cannot write --json {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    match summaries.iter().any(|s| s.error().is_some()) {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}

/// Reads the trace at `path`, and the measured step times beside it (`timing.txt`) into the
/// timing model.
fn load(path: &Path, options: &mut Options) -> Result<Trace, String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    timing::load_step_times(&dir.join("timing.txt"), &mut options.timing.step_us)?;
    Trace::load(path)
}

/// Every repeat of every trace under every configuration, summed up per pair.
fn replay_all(
    traces: &[Trace],
    settings: &[Setting],
    options: &Options,
    verbose: bool,
) -> Vec<Summary> {
    let mut summaries = Vec::new();
    for trace in traces {
        if verbose {
            println!("{}", describe(trace));
        }
        let base = timing::base(trace, &options.timing);
        let plans: Vec<timing::Plan> = (0..options.repeats.max(1))
            .map(|repeat| timing::plan(&base, &options.timing, repeat))
            .collect();
        for setting in settings {
            summaries.push(Summary {
                trace: trace.name.clone(),
                setting: setting.name.clone(),
                outcomes: replay_repeats(trace, setting, options, &plans),
            });
        }
    }
    summaries
}

/// The repeats of one trace under one setting, on as many threads as the machine has (each
/// replay has its own allocator and simulator; the outcomes keep the plans' order). The model of
/// expandable segments knows no time: it is replayed once, and that outcome stands for each.
fn replay_repeats(
    trace: &Trace,
    setting: &Setting,
    options: &Options,
    plans: &[timing::Plan],
) -> Vec<run::Outcome> {
    if expandable::selected(setting) {
        let once = plans
            .first()
            .map(|plan| run::replay_planned(trace, setting, options, plan));
        let each = |plan: &timing::Plan| run::Outcome {
            repeat: plan.repeat,
            ..once.clone().unwrap_or_default()
        };
        return plans.iter().map(each).collect();
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = plans.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (plans.chunks(chunk))
            .map(|part| {
                scope.spawn(move || {
                    (part.iter())
                        .map(|plan| run::replay_planned(trace, setting, options, plan))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        (workers.into_iter().zip(plans.chunks(chunk)))
            .flat_map(|(w, part)| {
                w.join().unwrap_or_else(|_| {
                    (part.iter())
                        .map(|plan| run::Outcome {
                            trace: trace.name.clone(),
                            setting: setting.name.clone(),
                            repeat: plan.repeat,
                            error: Some("the replay's thread panicked".into()),
                            ..run::Outcome::default()
                        })
                        .collect()
                })
            })
            .collect()
    })
}

/// The timing model and costs, for JSON.
fn model_json(options: &Options) -> serde_json::Value {
    let m = &options.timing;
    serde_json::json!({
        "repeats": options.repeats,
        "jitter": m.jitter,
        "seed": m.seed,
        "host_us": m.host_us,
        "latency_us": m.latency_us,
        "step_us": m.step_us,
        "costs_us": options.costs_us,
    })
}

/// The number `text` of `flag`, if it is finite and `ok` accepts it.
fn number(flag: &str, text: &str, what: &str, ok: impl Fn(f64) -> bool) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && ok(*x))
        .ok_or_else(|| format!("{flag} {text:?} is not {what}"))
}

fn parse_cli(args: &[String]) -> Result<Cli, String> {
    let mut cli = Cli {
        traces: Vec::new(),
        settings: Vec::new(),
        options: Options::default(),
        json: None,
        gate: None,
        update: false,
    };
    let mut common = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let timing = &mut cli.options.timing;
        match arg.as_str() {
            "--env" => common.push(pair("--env", &value("--env")?)?),
            "--config" => cli.settings.push(parse_setting(&value("--config")?)?),
            "--repeats" => {
                let v = value(arg)?;
                let what = "a count of repeats (an integer 1..=1000)";
                cli.options.repeats = number(arg, &v, what, |x| {
                    x.fract() == 0.0 && (1.0..=1000.0).contains(&x)
                })? as u64;
            }
            "--jitter" => {
                let what = "a relative spread 0..=0.9";
                timing.jitter = number(arg, &value(arg)?, what, |x| (0.0..=0.9).contains(&x))?;
            }
            "--seed" => {
                let v = value(arg)?;
                timing.seed = v
                    .parse()
                    .map_err(|_| format!("--seed {v:?} is not an integer >= 0"))?;
            }
            "--host-us" => {
                let what = "a time in microseconds (> 0)";
                timing.host_us = number(arg, &value(arg)?, what, |x| x > 0.0)?;
            }
            "--latency-us" => {
                let what = "a time in microseconds (>= 0)";
                timing.latency_us = number(arg, &value(arg)?, what, |x| x >= 0.0)?;
            }
            "--cost" => {
                let (call, us) = pair("--cost", &value("--cost")?)?;
                let known: Vec<&str> = CALLS.iter().map(|(c, _)| *c).collect();
                if !known.contains(&call.as_str()) {
                    return Err(format!(
                        "--cost: {call:?} is not a call the replay counts (accepted: {})",
                        known.join(", ")
                    ));
                }
                let cost: f64 = us.parse().ok().filter(|c: &f64| *c >= 0.0).ok_or_else(|| {
                    format!("--cost {call}={us:?}: not a cost in microseconds (a number >= 0)")
                })?;
                cli.options.costs_us.insert(call, cost);
            }
            "--json" => cli.json = Some(PathBuf::from(value("--json")?)),
            "--gate" => cli.gate = Some(PathBuf::from(value("--gate")?)),
            "--update" => cli.update = true,
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag:?}")),
            path => cli.traces.push(PathBuf::from(path)),
        }
    }
    if cli.gate.is_some() {
        return match args.len() == 2 + usize::from(cli.update) {
            true => Ok(cli),
            false => Err("--gate takes its settings from BASELINE: no other option".into()),
        };
    }
    if cli.update {
        return Err("--update goes with --gate BASELINE".into());
    }
    if cli.traces.is_empty() {
        return Err("no TRACE given (e.g. bench/traces/churn.trace.gz)".into());
    }
    if cli.settings.is_empty() {
        cli.settings.push(Setting {
            name: "default".into(),
            env: Vec::new(),
        });
    }
    let names: Vec<&str> = cli.settings.iter().map(|s| s.name.as_str()).collect();
    if let Some(twice) = names
        .iter()
        .find(|n| names.iter().filter(|m| m == n).count() > 1)
    {
        return Err(format!(
            "--config {twice:?} is given twice: names must differ"
        ));
    }
    for setting in &mut cli.settings {
        let own = std::mem::take(&mut setting.env);
        setting.env = common.iter().cloned().chain(own).collect();
        run::check_setting(setting)?;
    }
    Ok(cli)
}

/// `VAR=VALUE` of `flag`.
fn pair(flag: &str, text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{flag} {text:?} is not VAR=VALUE")),
    }
}

/// `NAME:VAR=VALUE,VAR=VALUE` (or `NAME:`).
fn parse_setting(text: &str) -> Result<Setting, String> {
    let (name, vars) = text
        .split_once(':')
        .filter(|(name, _)| !name.trim().is_empty())
        .ok_or_else(|| {
            format!("--config {text:?} is not NAME:VAR=VALUE,... (e.g. big:STREAMPOOL_VMM_PAGE_SIZE=20MiB, or base:)")
        })?;
    let env = vars
        .split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| pair(&format!("--config {name}:"), v))
        .collect::<Result<_, _>>()?;
    Ok(Setting {
        name: name.trim().to_string(),
        env,
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn describe(t: &Trace) -> String {
    format!(
        "trace {}: {} events, {} allocations, {} steps, {} stream(s), peak live {:.1} MiB{}",
        t.name,
        t.events.len(),
        t.allocations,
        t.steps,
        t.streams.len(),
        mib(t.peak_live_bytes),
        t.header("workload")
            .map_or(String::new(), |w| format!(" (workload {w})")),
    )
}

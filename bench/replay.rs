//! Replays allocation traces (bench/traces, `python3 -m bench.trace_capture`) through
//! streampool's real allocator on the simulated driver, to tune the backends' policies without
//! a GPU: per trace and configuration, peak reserved ÷ peak live bytes, the driver calls that
//! cost time, and a modeled driver time from measured H100 costs (run.rs).
//!
//! ```text
//! cargo bench --bench replay -- [--env VAR=VALUE]... [--config NAME:VAR=VALUE,...]...
//!     [--complete-every EVENTS] [--cost CALL=US]... [--json FILE] TRACE...
//! ```
//!
//! Without `--bench` (as `cargo test` runs it) it runs its self-check instead (checks.rs).
//! Invariant: every configuration replays every trace from a fresh allocator and simulator, and
//! a bad option is an error naming it, the value and what is accepted, before anything runs.

#[path = "replay/checks.rs"]
mod checks;
#[path = "replay/inflate.rs"]
mod inflate;
#[path = "replay/run.rs"]
mod run;
#[path = "replay/trace.rs"]
mod trace;

use run::{Options, Outcome, Setting, CALLS};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use trace::Trace;

const USAGE: &str = "usage: cargo bench --bench replay -- [--env VAR=VALUE]... \
[--config NAME:VAR=VALUE,...]... [--complete-every EVENTS] [--cost CALL=US]... [--json FILE] \
TRACE...
  --env VAR=VALUE     a STREAMPOOL_* variable for every configuration
  --config NAME:VARS  a configuration to compare: NAME, then VAR=VALUE pairs separated by commas
                      (`base:` for none); default: one configuration, \"default\"
  --event-us US       the simulator's clock moves on by US microseconds per event, and the
                      allocator is tended every 50 ms of it (cold pages, idle release)
  --complete-every N  all streams complete their work every N events (default 1: the GPU keeps
                      up; 0: only at synchronisations `s` and step ends `x`, which they do always)
  --cost CALL=US      the modeled cost of a driver call in microseconds (e.g. cuMemRelease=10)
  --json FILE         also write the results as JSON";

struct Cli {
    traces: Vec<PathBuf>,
    settings: Vec<Setting>,
    options: Options,
    json: Option<PathBuf>,
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
    let mut outcomes = Vec::new();
    for path in &cli.traces {
        let trace = match Trace::load(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("replay: {e}");
                return ExitCode::from(2);
            }
        };
        println!("{}", describe(&trace));
        for setting in &cli.settings {
            outcomes.push(run::replay(&trace, setting, &cli.options));
        }
    }
    print!("{}", table(&outcomes, &cli.settings));
    if let Some(path) = &cli.json {
        let text = json(&outcomes, &cli.settings, &cli.options);
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("replay: cannot write --json {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    match outcomes.iter().any(|o| o.error.is_some()) {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}

fn parse_cli(args: &[String]) -> Result<Cli, String> {
    let mut cli = Cli {
        traces: Vec::new(),
        settings: Vec::new(),
        options: Options::default(),
        json: None,
    };
    let mut common = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match arg.as_str() {
            "--env" => common.push(pair("--env", &value("--env")?)?),
            "--config" => cli.settings.push(parse_setting(&value("--config")?)?),
            "--event-us" => {
                let v = value("--event-us")?;
                cli.options.event_us =
                    Some(v.parse().ok().filter(|x: &f64| *x >= 0.0).ok_or_else(|| {
                        format!("--event-us {v:?} is not a duration in microseconds (>= 0)")
                    })?);
            }
            "--complete-every" => {
                let v = value("--complete-every")?;
                cli.options.complete_every_events = v.parse().map_err(|_| {
                    format!("--complete-every {v:?} is not a count of events (an integer >= 0)")
                })?;
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
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag:?}")),
            path => cli.traces.push(PathBuf::from(path)),
        }
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
        run::config_for(setting)?;
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

/// The results as a text table, then each configuration's variables and any failure.
fn table(outcomes: &[Outcome], settings: &[Setting]) -> String {
    let mut head = vec![
        "trace".to_string(),
        "config".into(),
        "reserved MiB".into(),
        "live MiB".into(),
        "ratio".into(),
    ];
    head.extend(CALLS.iter().map(|(_, h)| h.to_string()));
    head.extend([
        "model ms".into(),
        "us/step".into(),
        "timed map".into(),
        "timed unmap".into(),
        "timed ms".into(),
    ]);
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let mut row = vec![
                o.trace.clone(),
                o.setting.clone(),
                format!("{:.1}", mib(o.peak_reserved_bytes)),
                format!("{:.1}", mib(o.peak_live_bytes)),
                format!("{:.3}", o.ratio()),
            ];
            row.extend(CALLS.iter().map(|(c, _)| o.call(c).to_string()));
            row.push(format!("{:.2}", o.modeled_driver_s * 1e3));
            row.push(match o.steps {
                0 => "-".into(),
                n => format!("{:.1}", o.modeled_driver_s * 1e6 / n as f64),
            });
            let timed = |c: &str| o.timed_calls.get(c).copied().unwrap_or(0).to_string();
            row.push(timed("cuMemMap"));
            row.push(timed("cuMemUnmap"));
            row.push(format!("{:.2}", o.timed_modeled_s * 1e3));
            if o.error.is_some() {
                row[2] = "FAILED".into();
            }
            row
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([head[i].len()])
                .max()
                .unwrap()
        })
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&head).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| match i < 2 {
                true => format!("{c:<w$}", w = widths[i]),
                false => format!("{c:>w$}", w = widths[i]),
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    for s in settings {
        let vars: Vec<String> = s.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "config {}: {}", s.name, vars.join(" "));
    }
    for o in outcomes.iter().filter(|o| o.error.is_some()) {
        let _ = writeln!(
            out,
            "FAILED {} under {}: {}",
            o.trace,
            o.setting,
            o.error.as_ref().unwrap()
        );
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out + "\""
}

fn json(outcomes: &[Outcome], settings: &[Setting], options: &Options) -> String {
    let object = |pairs: Vec<(String, String)>| {
        let inner: Vec<String> = pairs
            .into_iter()
            .map(|(k, v)| format!("{}: {v}", json_str(&k)))
            .collect();
        format!("{{{}}}", inner.join(", "))
    };
    let results: Vec<String> = outcomes
        .iter()
        .map(|o| {
            let env = &settings.iter().find(|s| s.name == o.setting).unwrap().env;
            object(vec![
                ("trace".into(), json_str(&o.trace)),
                ("config".into(), json_str(&o.setting)),
                (
                    "env".into(),
                    object(env.iter().map(|(k, v)| (k.clone(), json_str(v))).collect()),
                ),
                ("events".into(), o.events.to_string()),
                ("steps".into(), o.steps.to_string()),
                ("peak_live_bytes".into(), o.peak_live_bytes.to_string()),
                (
                    "peak_reserved_bytes".into(),
                    o.peak_reserved_bytes.to_string(),
                ),
                ("reserved_over_live".into(), format!("{:.6}", o.ratio())),
                (
                    "allocator_allocated_peak_bytes".into(),
                    o.allocated_peak_bytes.to_string(),
                ),
                (
                    "calls".into(),
                    object(
                        o.calls
                            .iter()
                            .map(|(k, v)| (k.clone(), v.to_string()))
                            .collect(),
                    ),
                ),
                ("pages_mapped".into(), o.stats_maps.to_string()),
                ("pages_unmapped".into(), o.stats_unmaps.to_string()),
                (
                    "modeled_driver_s".into(),
                    format!("{:.6}", o.modeled_driver_s),
                ),
                ("replay_wall_s".into(), format!("{:.3}", o.replay_wall_s)),
                (
                    "error".into(),
                    o.error.as_deref().map_or("null".into(), json_str),
                ),
            ])
        })
        .collect();
    let costs = object(
        options
            .costs_us
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
    );
    format!(
        "{{\"complete_every_events\": {}, \"costs_us\": {costs}, \"results\": [\n  {}\n]}}\n",
        options.complete_every_events,
        results.join(",\n  ")
    )
}

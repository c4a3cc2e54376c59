//! The replay gate (scripts/test runs it): the traces and configurations a committed baseline
//! lists are replayed as it says (repeats, jitter, seed, timing model), and each (trace,
//! configuration)'s median peak ratio and median modeled driver time are compared with the
//! baseline's. A median that rose by more than its allowance is a regression; one that fell by
//! more is an improvement the baseline must record (`--update`, in the same commit), so the
//! baseline always says where the code is.
//!
//! Allowance: the repeats differ only in their seeded jitter, so a change that moves the
//! allocator's decisions at all reshuffles them as a new seed would; the median then moves by
//! its sampling error even if nothing got worse. That error is estimated at `--update` from the
//! baseline's own repeats (the standard deviation of the median over seeded bootstrap
//! resamples), and the allowance is `SIGMAS` of it, at least `RATIO_FLOOR` for the peak ratio
//! and `DRIVER_FLOOR` of the median for the modeled time.
//!
//! Invariant: the gate fails, naming what and how to fix it, on any figure past its allowance,
//! on a failed replay, and on a (trace, configuration) the baseline has no figure for; it never
//! writes the baseline unless `--update` is given.

use super::report::{median, Summary};
use super::run::{Options, Setting};
use super::timing::Model;
use super::trace::Trace;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Standard deviations of the median a figure may move by.
pub const SIGMAS: f64 = 4.0;
/// The least allowance of a peak ratio: a quarter of a 2 MiB page on the smallest trace.
pub const RATIO_FLOOR: f64 = 0.005;
/// The least allowance of a modeled driver time, relative to its median.
pub const DRIVER_FLOOR: f64 = 0.02;
const BOOTSTRAP_SAMPLES: usize = 1000;

/// The standard deviation of the median of `values`, over seeded bootstrap resamples.
pub fn median_sd(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mut state = 0x5EED_u64;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % n as u64) as usize
    };
    let medians: Vec<f64> = (0..BOOTSTRAP_SAMPLES)
        .map(|_| {
            let sample: Vec<f64> = (0..values.len())
                .map(|_| values[next(values.len())])
                .collect();
            median(&sample)
        })
        .collect();
    let mean = medians.iter().sum::<f64>() / medians.len() as f64;
    (medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / medians.len() as f64).sqrt()
}

/// The allowances of a summary: (peak ratio, modeled driver milliseconds).
pub fn allowances(s: &Summary) -> (f64, f64) {
    let (ratios, times) = (s.ratios(), s.driver_ms());
    let ratio = (SIGMAS * median_sd(&ratios)).max(RATIO_FLOOR);
    let time = (SIGMAS * median_sd(&times)).max(DRIVER_FLOOR * median(&times));
    (ratio, time)
}

/// A path of the baseline, relative to the repository.
fn repo_path(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// What the baseline says to replay, and how.
struct Plan {
    traces: Vec<String>,
    settings: Vec<Setting>,
    options: Options,
}

fn plan_of(doc: &Value) -> Result<Plan, String> {
    let method = &doc["method"];
    let num = |key: &str| {
        method[key]
            .as_f64()
            .ok_or_else(|| format!("method.{key} is missing or not a number"))
    };
    let options = Options {
        repeats: num("repeats")? as u64,
        timing: Model {
            jitter: num("jitter")?,
            seed: num("seed")? as u64,
            host_us: num("host_us")?,
            latency_us: num("latency_us")?,
            ..Model::default()
        },
        ..Options::default()
    };
    let traces = doc["traces"]
        .as_array()
        .ok_or("traces is missing or not a list")?
        .iter()
        .map(|t| {
            t.as_str()
                .map(String::from)
                .ok_or("a trace that is not a path")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let configs = doc["configs"]
        .as_object()
        .ok_or("configs is missing or not an object")?;
    let mut settings = Vec::new();
    for (name, vars) in configs {
        let vars = vars
            .as_object()
            .ok_or(format!("configs.{name} is not an object"))?;
        let env = vars
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(v) => Ok((k.clone(), v.to_string())),
                None => Err(format!("configs.{name}.{k} is not a string")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let setting = Setting {
            name: name.clone(),
            env,
        };
        super::run::check_setting(&setting)?;
        settings.push(setting);
    }
    Ok(Plan {
        traces,
        settings,
        options,
    })
}

/// The baseline's figure for (trace, config), if any.
fn figure<'a>(doc: &'a Value, trace: &str, config: &str) -> Option<&'a Value> {
    doc["figures"]
        .as_array()?
        .iter()
        .find(|f| f["trace"] == trace && f["config"] == config)
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// Checks the summaries against the baseline: the report, and whether all passed.
pub fn check(doc: &Value, summaries: &[Summary]) -> (String, bool) {
    let mut out = String::new();
    let mut ok = true;
    let _ = writeln!(
        out,
        "{:<24} {:<8} {:>22} {:>30}",
        "trace", "config", "peak ratio: base/now", "modeled driver ms: base/now"
    );
    for s in summaries {
        let (ratio, ms) = (median(&s.ratios()), median(&s.driver_ms()));
        let Some(f) = figure(doc, &s.trace, &s.setting) else {
            ok = false;
            let _ = writeln!(out, "{:<24} {:<8} not in the baseline", s.trace, s.setting);
            continue;
        };
        if let Some(e) = s.error() {
            ok = false;
            let _ = writeln!(out, "{:<24} {:<8} FAILED: {e}", s.trace, s.setting);
            continue;
        }
        let get = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        let mut verdicts = Vec::new();
        for (what, base, now, allow, places) in [
            ("peak ratio", get("ratio"), ratio, get("ratio_allowance"), 3),
            (
                "driver ms",
                get("driver_ms"),
                ms,
                get("driver_ms_allowance"),
                2,
            ),
        ] {
            let moved = now - base;
            if moved.is_nan() || moved.abs() > allow {
                ok = false;
                let how = if moved > 0.0 { "ROSE" } else { "FELL" };
                verdicts.push(format!(
                    "{what} {how} by {moved:+.p$} (allowed ±{allow:.p$})",
                    p = places
                ));
            }
        }
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:>10.3} / {:<9.3} {:>14.2} / {:<13.2} {}",
            s.trace,
            s.setting,
            get("ratio"),
            ratio,
            get("driver_ms"),
            ms,
            match verdicts.is_empty() {
                true => "ok".to_string(),
                false => verdicts.join("; "),
            }
        );
    }
    (out, ok)
}

/// The baseline with the figures of `summaries`.
fn updated(doc: &Value, summaries: &[Summary]) -> Value {
    let figures: Vec<Value> = summaries
        .iter()
        .map(|s| {
            let (ratios, times) = (s.ratios(), s.driver_ms());
            let (ratio_allowance, ms_allowance) = allowances(s);
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            json!({
                "trace": s.trace,
                "config": s.setting,
                "ratio": round(median(&ratios), 4),
                "ratio_allowance": round(ratio_allowance, 4),
                "ratio_range": [round(lo, 4), round(hi, 4)],
                "driver_ms": round(median(&times), 3),
                "driver_ms_allowance": round(ms_allowance, 3),
            })
        })
        .collect();
    let mut doc = doc.clone();
    doc["figures"] = Value::Array(figures);
    doc
}

pub fn main(path: &Path, update: bool) -> ExitCode {
    let fail = |e: String| {
        eprintln!("replay gate: {}: {e}", path.display());
        ExitCode::from(2)
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return fail(format!("cannot read it: {e}")),
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(d) => d,
        Err(e) => return fail(format!("not JSON: {e}")),
    };
    let mut plan = match plan_of(&doc) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let mut traces: Vec<Trace> = Vec::new();
    for t in &plan.traces {
        match super::load(&repo_path(t), &mut plan.options) {
            Ok(trace) => traces.push(trace),
            Err(e) => return fail(e),
        }
    }
    let started = std::time::Instant::now();
    let summaries = super::replay_all(&traces, &plan.settings, &plan.options, false);
    let (report, ok) = check(&doc, &summaries);
    print!("{report}");
    println!(
        "{} traces x {} configurations x {} repeats in {:.1} s",
        traces.len(),
        plan.settings.len(),
        plan.options.repeats,
        started.elapsed().as_secs_f64()
    );
    let command = format!(
        "cargo bench --bench replay -- --gate {} --update",
        path.display()
    );
    if update {
        let text = serde_json::to_string_pretty(&updated(&doc, &summaries)).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            return fail(format!("cannot write it: {e}"));
        }
        println!(
            "replay gate: wrote this build's figures into {}",
            path.display()
        );
        return ExitCode::SUCCESS;
    }
    if ok {
        println!("replay gate: every median within its allowance of the baseline");
        return ExitCode::SUCCESS;
    }
    println!(
        "replay gate FAILED. A figure that ROSE is a regression in memory held or driver time: \
         find its cause (replay the trace under both commits: docs/replay.md). One that FELL is \
         an improvement: record it with `{command}` and commit the baseline with the change. A \
         rise that is the price of something better is recorded the same way, and the commit \
         says why."
    );
    ExitCode::FAILURE
}

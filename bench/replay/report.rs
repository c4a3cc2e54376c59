//! The replay's results: the repeats of each (trace, configuration) summed up as medians and
//! ranges, printed as a table and written as JSON; and, asked for, the allocator's timeline.
//!
//! Invariant: a summary's figures are over its successful repeats only, and any failed repeat is
//! reported (a failure is never averaged away); the row shown for a summary is its median repeat
//! (by peak ratio), so one repeat reads exactly as the repeat.

use super::run::{Outcome, Setting, CALLS};
use std::fmt::Write as _;

/// The repeats of one trace under one configuration.
#[derive(Debug, Clone)]
pub struct Summary {
    pub trace: String,
    pub setting: String,
    pub outcomes: Vec<Outcome>,
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn range(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

impl Summary {
    fn ok(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| o.error.is_none())
    }

    pub fn ratios(&self) -> Vec<f64> {
        self.ok().map(Outcome::ratio).collect()
    }

    /// Modeled driver time of each successful repeat, milliseconds.
    pub fn driver_ms(&self) -> Vec<f64> {
        self.ok().map(|o| o.modeled_driver_s * 1e3).collect()
    }

    /// The first failure, with how many repeats failed.
    pub fn error(&self) -> Option<String> {
        let failed: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.error.is_some()).collect();
        let first = failed.first()?;
        Some(format!(
            "{} of {} repeats failed; repeat {}: {}",
            failed.len(),
            self.outcomes.len(),
            first.repeat,
            first.error.as_deref().unwrap_or_default()
        ))
    }

    /// The repeat whose ratio is the median's (the lower middle one for an even count), or the
    /// first failed one.
    pub fn shown(&self) -> &Outcome {
        let mut ok: Vec<&Outcome> = self.ok().collect();
        ok.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        match ok.len() {
            0 => &self.outcomes[0],
            n => ok[(n - 1) / 2],
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The results as a text table (one row per summary: its median repeat, with the ratio's and
/// the modeled time's medians and ranges over the repeats), then each configuration's variables
/// and any failure.
pub fn table(summaries: &[Summary], settings: &[Setting]) -> String {
    let mut head = vec![
        "trace".to_string(),
        "config".into(),
        "reserved MiB".into(),
        "live MiB".into(),
        "ratio".into(),
        "ratio range".into(),
    ];
    head.extend(CALLS.iter().map(|(_, h)| h.to_string()));
    head.extend([
        "model ms".into(),
        "model ms range".into(),
        "us/step".into(),
        "timed map".into(),
        "timed unmap".into(),
        "timed ms".into(),
        "idle MiB".into(),
    ]);
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|s| {
            let o = s.shown();
            let (ratios, times) = (s.ratios(), s.driver_ms());
            let ((rlo, rhi), (tlo, thi)) = (range(&ratios), range(&times));
            let mut row = vec![
                o.trace.clone(),
                o.setting.clone(),
                format!("{:.1}", mib(o.peak_reserved_bytes)),
                format!("{:.1}", mib(o.peak_live_bytes)),
                format!("{:.3}", median(&ratios)),
                format!("{rlo:.3}-{rhi:.3}"),
            ];
            row.extend(CALLS.iter().map(|(c, _)| o.call(c).to_string()));
            row.push(format!("{:.2}", median(&times)));
            row.push(format!("{tlo:.2}-{thi:.2}"));
            row.push(match o.steps {
                0 => "-".into(),
                n => format!("{:.1}", o.modeled_driver_s * 1e6 / n as f64),
            });
            let timed = |c: &str| o.timed_calls.get(c).copied().unwrap_or(0).to_string();
            row.push(timed("cuMemMap"));
            row.push(timed("cuMemUnmap"));
            row.push(format!("{:.2}", o.timed_modeled_s * 1e3));
            row.push(format!("{:.1}", mib(o.after_trim_beyond_live_bytes)));
            if ratios.is_empty() {
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
                .unwrap_or(0)
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
    if let Some(s) = summaries.first() {
        let _ = writeln!(
            out,
            "{} repeat(s) each; row: the median repeat by ratio",
            s.outcomes.len()
        );
    }
    for s in settings {
        let vars: Vec<String> = s.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "config {}: {}", s.name, vars.join(" "));
    }
    for s in summaries {
        if let Some(e) = s.error() {
            let _ = writeln!(out, "FAILED {} under {}: {e}", s.trace, s.setting);
        }
    }
    out
}

fn object(pairs: Vec<(&str, serde_json::Value)>) -> serde_json::Value {
    serde_json::Value::Object(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    use serde_json::json;
    let calls = |m: &std::collections::BTreeMap<String, u64>| json!(m);
    object(vec![
        ("repeat", json!(o.repeat)),
        ("events", json!(o.events)),
        ("steps", json!(o.steps)),
        ("peak_live_bytes", json!(o.peak_live_bytes)),
        ("peak_reserved_bytes", json!(o.peak_reserved_bytes)),
        ("reserved_over_live", json!(o.ratio())),
        (
            "allocator_allocated_peak_bytes",
            json!(o.allocated_peak_bytes),
        ),
        ("calls", calls(&o.calls)),
        ("timed_calls", calls(&o.timed_calls)),
        ("timed_allocations", json!(o.timed_allocations)),
        ("timed_allocator_calls", json!(o.timed_allocator_calls)),
        ("pages_mapped", json!(o.stats_maps)),
        ("pages_unmapped", json!(o.stats_unmaps)),
        ("failed_creates", json!(o.failed_creates)),
        ("least_free_bytes", json!(o.least_free_bytes)),
        (
            "after_trim_beyond_live_bytes",
            json!(o.after_trim_beyond_live_bytes),
        ),
        ("modeled_driver_s", json!(o.modeled_driver_s)),
        ("replay_wall_s", json!(o.replay_wall_s)),
        ("error", json!(o.error)),
    ])
}

/// Every figure as JSON: the model, then per summary its medians, ranges and every repeat.
pub fn json(summaries: &[Summary], settings: &[Setting], model: serde_json::Value) -> String {
    use serde_json::json;
    let results: Vec<serde_json::Value> = summaries
        .iter()
        .map(|s| {
            let env = settings
                .iter()
                .find(|x| x.name == s.setting)
                .map(|x| x.env.clone())
                .unwrap_or_default();
            let (ratios, times) = (s.ratios(), s.driver_ms());
            object(vec![
                ("trace", json!(s.trace)),
                ("config", json!(s.setting)),
                (
                    "env",
                    object(env.iter().map(|(k, v)| (k.as_str(), json!(v))).collect()),
                ),
                ("timing", json!(s.shown().timing)),
                ("ratio_median", json!(median(&ratios))),
                ("ratio_range", json!(range(&ratios))),
                ("modeled_driver_ms_median", json!(median(&times))),
                ("modeled_driver_ms_range", json!(range(&times))),
                ("error", json!(s.error())),
                (
                    "repeats",
                    json!(s.outcomes.iter().map(outcome_json).collect::<Vec<_>>()),
                ),
            ])
        })
        .collect();
    let doc = object(vec![("model", model), ("results", json!(results))]);
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// `REPLAY_HISTORY=FILE`: the allocator's timeline of the replay (the last repeat's), a line an
/// event: kind (streampool's `StreampoolEventKind`), stream, address, bytes, reserved bytes.
pub fn write_history(alloc: &streampool::Allocator, path: &std::ffi::OsStr) -> Result<(), String> {
    let (events, _) = alloc.history(usize::MAX);
    let text: String = (events.iter())
        .map(|e| {
            let (k, s, a, b, r) = (e.kind, e.stream, e.address, e.bytes, e.reserved_bytes);
            format!("{k} {s} {a} {b} {r}\n")
        })
        .collect();
    std::fs::write(path, text).map_err(|e| format!("writing {path:?}: {e}"))
}

//! The self-checks of the timing model and the gate (checks.rs runs them).
//!
//! Invariant: as in checks.rs, each check states the bug it catches.

use super::super::gate;
use super::super::report::Summary;
use super::super::run::{self, Options, Outcome};
use super::super::timing::{self, Model};
use super::super::trace::Trace;
use super::{ensure, setting};

/// Catches a timing model that ignores a trace's timestamps or a workload's step time, whose
/// synchronisations return before the GPU is done (or later than the trace says), or whose
/// repeats are not reproducible.
pub fn plan_order() -> Result<(), String> {
    // 30 us of host work in the first segment, yet its sync returns at 330: the GPU's work.
    let text = "a 1 1000000 0 @0\na 2 1000000 1 @10\nr 1 1 @12\nf 1 @20\nf 2 @30\ns @330\n\
                x @331\na 3 100 0 @340\nf 3 @350\ns @360\nx @361\n";
    let t = Trace::parse("timed", text)?;
    let still = Model {
        jitter: 0.0,
        ..Model::default()
    };
    let base = timing::base(&t, &still);
    ensure(base.source == "timestamps", || base.source.clone())?;
    let times = timing::host_times(&t, &timing::plan(&base, &still, 0));
    for (i, (&us, &want)) in times.iter().zip(&t.times_us).enumerate() {
        ensure((us - want as f64).abs() < 1.0, || {
            format!("event {i} at {us:.1} us, the trace says {want}: {times:?}")
        })?;
    }
    let model = Model::default();
    let base = timing::base(&t, &model);
    let plan = |repeat| timing::plan(&base, &model, repeat);
    ensure(
        plan(0).gaps_us == plan(0).gaps_us && plan(0).work_us == plan(0).work_us,
        || "the same repeat gave another plan".into(),
    )?;
    ensure(plan(1).gaps_us != plan(0).gaps_us, || {
        "another repeat gave the same plan".into()
    })?;
    let jittered = timing::host_times(&t, &plan(3));
    ensure(
        jittered.windows(2).all(|w| w[0] <= w[1]) && jittered[5] > 160.0,
        || format!("a jittered repeat: {jittered:?}"),
    )?;
    // Untimed: 2 steps measured at 320 us each; 8 us of host per event is 16 us a step, so the
    // GPU's work makes up the rest and the second sync returns at 640 us.
    let untimed = Trace::parse(
        "untimed",
        "# workload w\na 1 1000000 0\nf 1\ns\nx\na 2 2000000 0\nf 2\ns\nx\n",
    )?;
    let mut modeled = still.clone();
    modeled.step_us.insert("w".into(), 320.0);
    let base = timing::base(&untimed, &modeled);
    let times = timing::host_times(&untimed, &timing::plan(&base, &modeled, 0));
    ensure((times[6] - 640.0).abs() < 1.0 && times[2] > 100.0, || {
        format!("the step time was not applied: {times:?} ({})", base.source)
    })?;
    let base = timing::base(&untimed, &still);
    let times = timing::host_times(&untimed, &timing::plan(&base, &still, 0));
    ensure(times[6] < 50.0, || {
        format!("without a step time the GPU works at HBM speed: {times:?}")
    })
}

/// Catches a replay that completes work at the host's time instead of the GPU's: a 4 MiB block
/// freed on stream 0 at 1 ms, then an 8 MiB block on stream 1 at 20 ms. If the GPU kept up, the
/// free's fence has completed by then and the freed range serves stream 1 as it is. If the GPU
/// is 100x behind the host (the sync returns at 2 s), the fence has not completed: stream 1 may
/// use the range only after a GPU-side wait for it (`cuStreamWaitEvent`). 8 MiB held either way.
pub fn lag_holds_pages() -> Result<(), String> {
    let held = |sync_us: u64| -> Result<(u64, u64), String> {
        let text = format!(
            "a 1 4194304 0 @0\nf 1 @1000\na 2 8388608 1 @20000\nf 2 @20010\ns @{sync_us}\nx @{}\n",
            sync_us + 1
        );
        let t = Trace::parse("lag", &text)?;
        let options = Options {
            timing: Model {
                jitter: 0.0,
                ..Model::default()
            },
            ..Options::default()
        };
        let vmm = setting("vmm", &[("STREAMPOOL_BACKEND", "vmm")]);
        let o = run::replay(&t, &vmm, &options, 0);
        match o.error {
            Some(e) => Err(e),
            None => Ok((o.peak_reserved_bytes >> 20, o.call("cuStreamWaitEvent"))),
        }
    };
    let (kept_up, behind) = (held(20_020)?, held(2_000_000)?);
    ensure(kept_up == (8, 0) && behind == (8, 1), || {
        format!(
            "(MiB held, GPU-side waits) when the GPU keeps up {kept_up:?}, when it is behind \
             {behind:?}"
        )
    })
}

fn summary(ratios: &[f64], ms: f64) -> Summary {
    Summary {
        trace: "t.trace.gz".into(),
        setting: "vmm".into(),
        outcomes: (ratios.iter().enumerate())
            .map(|(i, r)| Outcome {
                repeat: i as u64,
                peak_live_bytes: 1000,
                peak_reserved_bytes: (r * 1000.0).round() as u64,
                modeled_driver_s: ms / 1e3,
                ..Outcome::default()
            })
            .collect(),
    }
}

/// Catches a gate that lets a rise or an unrecorded fall pass, fails within the allowance, or
/// gives no allowance for spread repeats.
pub fn gate_verdicts() -> Result<(), String> {
    let doc = serde_json::json!({"figures": [{"trace": "t.trace.gz", "config": "vmm",
        "ratio": 1.100, "ratio_allowance": 0.010, "driver_ms": 10.0, "driver_ms_allowance": 0.5}]});
    for (ratio, ms, pass, word) in [
        (1.105, 10.0, true, "ok"),
        (1.120, 10.0, false, "peak ratio ROSE"),
        (1.080, 10.0, false, "peak ratio FELL"),
        (1.100, 10.8, false, "driver ms ROSE"),
    ] {
        let (report, ok) = gate::check(&doc, &[summary(&[ratio], ms)]);
        ensure(ok == pass && report.contains(word), || {
            format!("ratio {ratio}, {ms} ms: passed {ok}, report {report:?}")
        })?;
    }
    let mut other = summary(&[1.1], 10.0);
    other.setting = "pool".into();
    ensure(!gate::check(&doc, &[other]).1, || {
        "a figure missing from the baseline passed".into()
    })?;
    let (flat, _) = gate::allowances(&summary(&[1.1; 9], 10.0));
    let spread = [1.0, 1.05, 1.1, 1.15, 1.2, 1.02, 1.18, 1.07, 1.13];
    let (wide, _) = gate::allowances(&summary(&spread, 10.0));
    ensure(flat == gate::RATIO_FLOOR && wide > 0.04, || {
        format!("allowances: identical repeats {flat}, spread ones {wide}")
    })
}

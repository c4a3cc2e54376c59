//! The replay's self-check, run by `cargo test` (the bench target has `test = true`; cargo runs
//! it without `--bench`): the format, gzip, and a small committed trace replayed under both
//! backends. Kept to well under a second of CI time.
//!
//! Invariant: each check states the bug it catches; a filter argument that no check's name
//! contains runs none (as libtest does), other libtest flags are ignored.

use super::inflate::{crc32, gunzip};
use super::run::{self, Options, Setting};
use super::trace::{Event, Trace};
#[path = "timing_checks.rs"]
mod timing_checks;
use std::path::Path;
use std::process::ExitCode;

type Check = (&'static str, fn() -> Result<(), String>);

const CHECKS: [Check; 15] = [
    ("replay_peak_live_follows_allocs_and_frees", peak_live),
    ("replay_rejects_inconsistent_traces", rejects_bad_traces),
    ("replay_gunzip_stored_and_compressed", gunzip_blocks),
    ("replay_tiny_trace_under_both_backends", tiny_trace),
    (
        "replay_allocator_sees_the_trace_live_bytes",
        allocator_agrees,
    ),
    ("replay_churn_trace_parses", churn_parses),
    ("replay_timestamps_parse_in_order", timestamps),
    ("replay_measures_above_library_workspaces", workspaces),
    (
        "replay_near_full_checkerboard_is_served_above_the_headroom",
        checkerboard,
    ),
    (
        "replay_plan_keeps_host_and_gpu_in_order",
        timing_checks::plan_order,
    ),
    (
        "replay_gpu_lag_keeps_freed_pages_busy",
        timing_checks::lag_holds_pages,
    ),
    (
        "replay_gate_judges_medians_by_allowance",
        timing_checks::gate_verdicts,
    ),
    ("replay_sync_releases_above_the_threshold", sync_releases),
    ("replay_empty_cache_gives_memory_back", empty_cache),
    (
        "replay_expandable_model_keeps_pytorch_rules",
        super::expandable::checks,
    ),
];

pub fn main(args: &[String]) -> ExitCode {
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let mut failed = 0;
    let mut ran = 0;
    for (name, check) in CHECKS {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        match check() {
            Ok(()) => println!("check {name} ... ok"),
            Err(e) => {
                failed += 1;
                println!("check {name} ... FAILED: {e}");
            }
        }
    }
    println!(
        "replay self-check: {} passed, {failed} failed",
        ran - failed
    );
    match failed {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    match ok {
        true => Ok(()),
        false => Err(what()),
    }
}

/// Each trace text is refused with an error that contains its expected words.
fn refused(cases: &[(&str, &str)]) -> Result<(), String> {
    for (text, expect) in cases {
        match Trace::parse("t", text) {
            Ok(_) => return Err(format!("{text:?} was accepted")),
            Err(e) => ensure(e.contains(expect), || {
                format!("{text:?}: {e:?} lacks {expect:?}")
            })?,
        }
    }
    Ok(())
}

fn traces_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/traces"))
}

fn setting(name: &str, env: &[(&str, &str)]) -> Setting {
    Setting {
        name: name.into(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Catches a peak that forgets frees (or counts only the last allocation).
fn peak_live() -> Result<(), String> {
    let text = "# workload synthetic\na 1 100 0\na 2 50 0\nf 1\na 3 70 1\nr 3 0\nf 2\nw 0 1\ns\na 4 200 0\nf 3\nf 4\nx\n";
    let t = Trace::parse("synthetic", text)?;
    // live: 100, 150, 50, 120, 70, 270 (peak), 200, 0
    ensure(t.peak_live_bytes == 270, || {
        format!("peak live {} != 270", t.peak_live_bytes)
    })?;
    ensure(t.allocations == 4 && t.steps == 1, || {
        format!("{} allocations, {} steps", t.allocations, t.steps)
    })?;
    ensure(t.header("workload") == Some("synthetic"), || {
        format!("header {:?}", t.headers)
    })?;
    ensure(t.events[4] == Event::Record { id: 3, stream: 0 }, || {
        format!("{:?}", t.events[4])
    })?;
    ensure(t.streams.len() == 2, || format!("streams {:?}", t.streams))
}

/// Catches a parser that accepts a free of a dead ID or a malformed line silently.
fn rejects_bad_traces() -> Result<(), String> {
    refused(&[
        (
            "a 1 10 0\nf 1\nf 1\n",
            "t:3: free of ID 1, which is not live",
        ),
        ("a 1 10 0\na 1 20 0\n", "already live (allocated on line 1)"),
        ("a 1 ten 0\n", "BYTES \"ten\" is not a non-negative integer"),
        ("r 5 1\n", "record_stream of ID 5"),
        ("q\n", "unknown event \"q\""),
        ("f\n", "takes 2 fields, not 1"),
    ])
}

/// Catches errors in the stored-block path, the CRC check and the Huffman decoder (the
/// committed traces are compressed with dynamic codes by Python's gzip).
fn gunzip_blocks() -> Result<(), String> {
    let body = b"a 1 4096 0\nf 1\nx\n";
    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1];
    gz.extend((body.len() as u16).to_le_bytes());
    gz.extend((!(body.len() as u16)).to_le_bytes());
    gz.extend(body);
    gz.extend(crc32(body).to_le_bytes());
    gz.extend((body.len() as u32).to_le_bytes());
    ensure(gunzip(&gz)? == body, || "stored block".into())?;
    let n = gz.len();
    gz[n - 8] ^= 1;
    ensure(gunzip(&gz).is_err_and(|e| e.contains("CRC")), || {
        "a corrupt CRC passed".into()
    })?;
    // Fixed Huffman codes: Python's gzip.compress(b"hello hello hello\n", mtime=0).
    let fixed = [
        0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 3, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x57, 0xc8, 0x40, 0x90,
        0x5c, 0x00, 0x3b, 0x7c, 0x8a, 0xdf, 0x12, 0, 0, 0,
    ];
    let text = gunzip(&fixed)?;
    ensure(text == b"hello hello hello\n", || {
        format!("fixed codes gave {text:?}")
    })
}

/// Catches a replay that fails on any event kind, ignores its configuration, or loses calls.
fn tiny_trace() -> Result<(), String> {
    let t = Trace::load(&traces_dir().join("tiny.trace.gz"))?;
    let options = Options::default();
    let pool = run::replay(
        &t,
        &setting("pool", &[("STREAMPOOL_BACKEND", "pool")]),
        &options,
        0,
    );
    let pages = [
        ("STREAMPOOL_BACKEND", "vmm"),
        ("STREAMPOOL_VMM_SPAN_SIZE", "0"),
    ];
    let vmm = run::replay(&t, &setting("vmm-pages", &pages), &options, 0);
    let big = [
        ("STREAMPOOL_BACKEND", "vmm"),
        ("STREAMPOOL_VMM_PAGE_SIZE", "20MiB"),
    ];
    let vmm20 = run::replay(&t, &setting("vmm20", &big), &options, 0);
    let vmm_spans = run::replay(
        &t,
        &setting("vmm", &[("STREAMPOOL_BACKEND", "vmm")]),
        &options,
        0,
    );
    for o in [&pool, &vmm, &vmm20, &vmm_spans] {
        ensure(o.error.is_none(), || {
            format!("{}: {:?}", o.setting, o.error)
        })?;
        ensure(o.peak_reserved_bytes >= o.peak_live_bytes, || {
            format!(
                "{}: reserved {} < live {}",
                o.setting, o.peak_reserved_bytes, o.peak_live_bytes
            )
        })?;
        ensure(o.modeled_driver_s > 0.0, || {
            format!("{}: no modeled time", o.setting)
        })?;
        // The trace's own `s` events are the replay's synchronisations, not the allocator's; and
        // without a release threshold (none of these settings has one) its hook at them
        // (streampool_synchronized) does not synchronise either.
        ensure(o.call("cuCtxSynchronize") == 0, || {
            format!(
                "{}: {} device syncs counted",
                o.setting,
                o.call("cuCtxSynchronize")
            )
        })?;
    }
    ensure(
        pool.call("cuMemMap") == 0 && pool.call("cuMemAllocFromPoolAsync") > 0,
        || format!("pool backend calls: {:?}", pool.calls),
    )?;
    // A call a page with one page a handle; spans (the default, where pages do not move) map
    // several pages a call.
    let (span_calls, page_calls) = (vmm_spans.call("cuMemMap"), vmm.call("cuMemMap"));
    ensure(page_calls > 0 && page_calls == vmm.stats_maps, || {
        format!(
            "vmm: {page_calls} cuMemMap calls, {} pages mapped",
            vmm.stats_maps
        )
    })?;
    ensure(span_calls > 0 && span_calls < vmm_spans.stats_maps, || {
        format!(
            "vmm (spans by default): {span_calls} cuMemMap calls, {} pages mapped",
            vmm_spans.stats_maps
        )
    })?;
    ensure(vmm20.call("cuMemMap") < page_calls, || {
        format!(
            "20 MiB pages mapped {} times, 2 MiB {page_calls}",
            vmm20.call("cuMemMap"),
        )
    })
}

/// Catches a replay that drops or duplicates allocations: the allocator's own peak of live
/// bytes must be the trace's.
fn allocator_agrees() -> Result<(), String> {
    let text =
        "a 1 3000000 0\na 2 5000 1\nr 1 1\nf 1\na 3 64 0\ns\na 4 8000000 1\nx\nf 2\nf 3\nf 4\nx\n";
    let t = Trace::parse("agree", text)?;
    for backend in ["pool", "vmm"] {
        let o = run::replay(
            &t,
            &setting(backend, &[("STREAMPOOL_BACKEND", backend)]),
            &Options::default(),
            0,
        );
        ensure(o.error.is_none(), || format!("{backend}: {:?}", o.error))?;
        ensure(o.allocated_peak_bytes == t.peak_live_bytes, || {
            format!(
                "{backend}: allocator peak {} != trace peak {}",
                o.allocated_peak_bytes, t.peak_live_bytes
            )
        })?;
    }
    let typo = setting("typo", &[("STREAMPOOL_VMM_PAGESIZE", "20MiB")]);
    let o = run::replay(&t, &typo, &Options::default(), 0);
    ensure(
        o.error
            .as_deref()
            .is_some_and(|e| e.contains("STREAMPOOL_VMM_PAGESIZE is not a variable")),
        || format!("a misspelt variable gave {:?}", o.error),
    )
}

/// Catches a committed churn trace that no longer parses (it is generated, not captured).
fn churn_parses() -> Result<(), String> {
    let t = Trace::load(&traces_dir().join("churn.trace.gz"))?;
    ensure(
        t.steps > 0 && t.allocations > 0 && t.header("workload") == Some("churn"),
        || {
            format!(
                "churn: {} steps, {} allocations, headers {:?}",
                t.steps, t.allocations, t.headers
            )
        },
    )
}

/// Catches a parser that drops timestamps, accepts them on some events only, or lets them go
/// back (format 2).
fn timestamps() -> Result<(), String> {
    let t = Trace::parse("t", "# format 2\na 1 10 0 @5\nf 1 @9\ns @40\nx @41\n")?;
    ensure(t.times_us == [5, 9, 40, 41], || {
        format!("times {:?}", t.times_us)
    })?;
    ensure(t.events[1] == Event::Free { id: 1 }, || {
        format!("{:?}", t.events)
    })?;
    let untimed = Trace::parse("t", "a 1 10 0\nf 1\n")?;
    ensure(untimed.times_us.is_empty(), || {
        "untimed trace got times".into()
    })?;
    refused(&[
        ("a 1 10 0 @5\nf 1\n", "on every event or on none"),
        ("a 1 10 0\nf 1 @5\n", "on every event or on none"),
        ("a 1 10 0 @5\nf 1 @4\n", "earlier than the previous"),
        ("a 1 10 0 @five\n", "is not microseconds"),
        ("@5\n", "a timestamp without an event"),
    ])
}

/// Catches a replay that counts cuBLAS's workspaces (made before the benchmark measures) as
/// held or live, or that takes a genuine 32 MiB block of a warmed-up capture, or of one whose
/// libraries allocated inside it, for one.
fn workspaces() -> Result<(), String> {
    let text = "a 1 33554432 0\na 2 4194304 0\na 3 33554432 1\nf 2\nx\n";
    let t = Trace::parse("ws", text)?;
    ensure(
        t.before_start == [1] && t.peak_live_bytes == 36 << 20,
        || {
            format!(
                "before the start {:?}, peak live {}",
                t.before_start, t.peak_live_bytes
            )
        },
    )?;
    let o = run::replay(
        &t,
        &setting("vmm", &[("STREAMPOOL_BACKEND", "vmm")]),
        &Options::default(),
        0,
    );
    ensure(
        o.error.is_none() && o.peak_reserved_bytes == 36 << 20,
        || {
            format!(
                "held above the start {} ({:?})",
                o.peak_reserved_bytes, o.error
            )
        },
    )?;
    let warmed = Trace::parse("ws", &format!("# {}\n{text}", super::trace::WARMED_UP))?;
    ensure(
        warmed.before_start.is_empty() && warmed.peak_live_bytes == 68 << 20,
        || format!("a warmed-up capture: {:?}", warmed.before_start),
    )?;
    let in_trace = Trace::parse("ws", &format!("# {}\n{text}", super::trace::IN_TRACE))?;
    ensure(
        in_trace.before_start.is_empty() && in_trace.peak_live_bytes == 68 << 20,
        || {
            format!(
                "a capture with the libraries' allocations: {:?}",
                in_trace.before_start
            )
        },
    )
}

/// The near-full workload of bench/trace_capture.py (`build_checkerboard`) on a card of
/// `card_bytes` with all of it free: 88% of it in 256 MiB blocks, every other one freed, then one
/// block of 40% of the card, which only the freed memory can hold.
pub fn checkerboard_trace(card_bytes: u64) -> String {
    const BLOCK_BYTES: u64 = 256 << 20;
    let count = card_bytes / 100 * 88 / BLOCK_BYTES;
    let big_bytes = card_bytes / 100 * 40 / (2 << 20) * (2 << 20);
    let mut text = format!(
        "# workload checkerboard\n# {}\n# device_total_bytes {card_bytes}\n",
        super::trace::WARMED_UP
    );
    for id in 1..=count {
        text += &format!("a {id} {BLOCK_BYTES} 0\n");
    }
    for id in (1..=count).step_by(2) {
        text += &format!("f {id}\n");
    }
    text += &format!("a {} {big_bytes} 0\nf {}\n", count + 1, count + 1);
    for id in (2..=count).step_by(2) {
        text += &format!("f {id}\n");
    }
    text + "x\n"
}

/// Catches a backend that fails the near-full checkerboard, takes the device's free memory below
/// the default headroom (1% of the card) or asks the device again after it refused a page.
fn checkerboard() -> Result<(), String> {
    let card_bytes = 4u64 << 30;
    let t = Trace::parse("checkerboard", &checkerboard_trace(card_bytes))?;
    for backend in ["pool", "vmm"] {
        let o = run::replay(
            &t,
            &setting(backend, &[("STREAMPOOL_BACKEND", backend)]),
            &Options::default(),
            0,
        );
        ensure(o.error.is_none(), || format!("{backend}: {:?}", o.error))?;
        ensure(o.failed_creates == 0, || {
            format!("{backend}: {} creates refused", o.failed_creates)
        })?;
        ensure(o.least_free_bytes >= card_bytes / 100, || {
            format!("{backend}: {} B free at the least", o.least_free_bytes)
        })?;
    }
    Ok(())
}

/// Catches a replay whose `s` events skip streampool's synchronisation hook (what
/// `torch.cuda.synchronize()` calls under `install()`): with a release threshold of 0 the vmm
/// backend gives a step's freed pages back at each `s`, and maps them again the next step; without
/// the `s`, or without a threshold, it keeps them.
fn sync_releases() -> Result<(), String> {
    let step = "a 1 67108864 0\nf 1\n";
    let trace = |sync: bool| {
        let text = (0..4)
            .map(|_| format!("{step}{}x\n", if sync { "s\n" } else { "" }))
            .collect::<String>();
        Trace::parse("sync", &format!("# workload sync\n{text}"))
    };
    let unmaps = |t: &Trace, threshold: &str| {
        let env = [
            ("STREAMPOOL_BACKEND", "vmm"),
            ("STREAMPOOL_RELEASE_THRESHOLD", threshold),
        ];
        let o = run::replay(t, &setting("vmm", &env), &Options::default(), 0);
        match o.error {
            Some(e) => Err(e),
            None => Ok(o.stats_unmaps),
        }
    };
    let (with_sync, without) = (trace(true)?, trace(false)?);
    let released = unmaps(&with_sync, "0")?;
    ensure(released >= 4 * 32, || {
        format!("{released} pages unmapped over four synchronised steps with a threshold of 0")
    })?;
    for (t, threshold, what) in [(&without, "0", "no s"), (&with_sync, "max", "no threshold")] {
        let kept = unmaps(t, threshold)?;
        ensure(kept == 0, || format!("{kept} pages unmapped with {what}"))?;
    }
    Ok(())
}

/// `e` (torch.cuda.empty_cache()) gives the vmm backend's free pages back: the step after it maps
/// its 64 MiB again; without it, nothing is unmapped.
fn empty_cache() -> Result<(), String> {
    let unmaps = |text: &str| {
        let t = Trace::parse("e", &format!("# workload e\n{text}"))?;
        let env = [("STREAMPOOL_BACKEND", "vmm")];
        let o = run::replay(&t, &setting("vmm", &env), &Options::default(), 0);
        match o.error {
            Some(e) => Err(e),
            None => Ok(o.stats_unmaps),
        }
    };
    let step = "a 1 67108864 0\nf 1\ns\nx\n";
    let with_e = unmaps(&format!("{step}e\n{step}"))?;
    ensure(with_e >= 32, || format!("{with_e} pages unmapped by `e`"))?;
    let without = unmaps(&format!("{step}{step}"))?;
    ensure(without == 0, || {
        format!("{without} pages unmapped without `e`")
    })
}

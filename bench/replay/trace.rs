//! The allocation trace format (docs/replay.md): text, usually
//! gzip-compressed, one event a line —
//!
//! ```text
//! # free text: provenance (workload, steps, torch version, device)
//! a ID BYTES STREAM   allocation of BYTES on STREAM (an opaque small integer)
//! f ID                free of allocation ID (ordered on its allocation stream)
//! r ID STREAM         record_stream: live allocation ID is used on STREAM too
//! w STREAM OTHER      STREAM waits for the work OTHER has queued so far
//! s                   device synchronisation
//! x                   end of a step (a marker)
//! ```
//!
//! Format 2 (captures since timestamps were added) ends every event line with `@US`: the host's
//! clock in microseconds since the trace began when the event happened (for `s`, when the
//! synchronisation returned: the GPU had finished all work queued before it). A trace without
//! timestamps (format 1) is still read; the replay models its times (timing.rs).
//!
//! The benchmark creates the libraries' handles before it measures (`warm_up_libraries` in
//! bench/engine.py): cuBLAS's workspaces for the default stream, 32 MiB each, are allocated
//! before its start and not counted, neither as memory held nor as live. Captures do the same
//! since they say `# libraries warmed up before recording`; in an older trace the allocations
//! that are such workspaces (32 MiB on stream 0, never freed) are its `before_start`: the replay
//! makes them first and measures above them, as the benchmark does. A capture that says
//! `# libraries not warmed up: their allocations are in the trace` is replayed as it is, its
//! workspaces where the program made them (`bench/diag_vmm_trace.py --no-library-warm-up`).
//!
//! Invariant: a parsed [`Trace`] is consistent — every `f` and `r` names a live allocation, no
//! live ID is allocated again, timestamps are on every event or none and never go back — so a
//! replay never meets an unknown ID; any other line is an error naming the file, the line and
//! what is accepted. Its peak live bytes are the largest sum of BYTES over live allocations.

use super::inflate::gunzip;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// The header of captures made after the libraries' handles were created (as the benchmark does).
pub const WARMED_UP: &str = "libraries warmed up before recording";
/// The header of captures whose libraries made their allocations inside the trace, as a program
/// that does not warm them up first.
pub const IN_TRACE: &str = "libraries not warmed up: their allocations are in the trace";
/// The size of cuBLAS's workspace for a stream on the GPUs the traces come from.
pub const WORKSPACE_BYTES: u64 = 32 << 20;

pub const ACCEPTED: &str = "`a ID BYTES STREAM`, `f ID`, `r ID STREAM`, `w STREAM OTHER`, `s`, \
     `x`, `e` (each optionally ending in a timestamp `@US`), `# comment` or an empty line";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Alloc {
        id: u64,
        bytes: u64,
        stream: u32,
    },
    Free {
        id: u64,
    },
    Record {
        id: u64,
        stream: u32,
    },
    Wait {
        stream: u32,
        other: u32,
    },
    Sync,
    Step,
    /// `torch.cuda.empty_cache()`: streampool's cache flushed and the pools trimmed to 0.
    EmptyCache,
}

impl Event {
    /// A device synchronisation: `s`, and `e` (empty_cache synchronises first).
    pub fn synchronises(&self) -> bool {
        matches!(self, Event::Sync | Event::EmptyCache)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// What the trace is called in reports (its file name).
    pub name: String,
    /// The `#` lines, without the `#`.
    pub headers: Vec<String>,
    pub events: Vec<Event>,
    /// The line of each event (1-based), for messages.
    pub lines: Vec<u32>,
    /// The host's clock at each event, microseconds since the trace began (format 2); empty for
    /// a trace without timestamps.
    pub times_us: Vec<u64>,
    /// The largest sum of live bytes, without the allocations made before the start.
    pub peak_live_bytes: u64,
    pub allocations: u64,
    /// Allocations the benchmark makes before its start (library workspaces, see above).
    pub before_start: Vec<u64>,
    pub steps: u64,
    pub streams: BTreeSet<u32>,
}

impl Trace {
    /// Reads `path`: gzip if it starts with gzip's magic bytes, plain text otherwise.
    pub fn load(path: &Path) -> Result<Trace, String> {
        let raw = std::fs::read(path)
            .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
        let text = match raw.starts_with(&[0x1f, 0x8b]) {
            true => gunzip(&raw).map_err(|e| format!("{}: {e}", path.display()))?,
            false => raw,
        };
        let text = String::from_utf8(text)
            .map_err(|_| format!("{}: the trace is not UTF-8 text", path.display()))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Trace::parse(&name, &text)
    }

    pub fn parse(name: &str, text: &str) -> Result<Trace, String> {
        let mut t = Trace {
            name: name.to_string(),
            ..Trace::default()
        };
        // live ID -> (bytes, line of its allocation)
        let mut live: HashMap<u64, (u64, u32)> = HashMap::new();
        let mut live_bytes = 0u64;
        for (index, raw) in text.lines().enumerate() {
            let line = index as u32 + 1;
            let fail =
                |why: String| format!("{name}:{line}: {why} (line {raw:?}; accepted: {ACCEPTED})");
            let trimmed = raw.trim();
            if let Some(comment) = trimmed.strip_prefix('#') {
                t.headers.push(comment.trim().to_string());
                continue;
            }
            if trimmed.is_empty() {
                continue;
            }
            let mut words: Vec<&str> = trimmed.split_ascii_whitespace().collect();
            let time_us = match words.last().and_then(|w| w.strip_prefix('@')) {
                Some(stamp) => {
                    let us = stamp.parse::<u64>().map_err(|_| {
                        fail(format!(
                            "timestamp {stamp:?} is not microseconds (an integer)"
                        ))
                    })?;
                    words.pop();
                    Some(us)
                }
                None => None,
            };
            let event = parse_event(&words).map_err(fail)?;
            match (time_us, t.events.is_empty(), t.times_us.is_empty()) {
                (Some(us), _, _) if t.times_us.last().is_some_and(|&last| us < last) => {
                    return Err(fail(format!(
                        "timestamp @{us} is earlier than the previous event's"
                    )))
                }
                (Some(us), true, _) | (Some(us), false, false) => t.times_us.push(us),
                (None, true, _) | (None, false, true) => {}
                _ => {
                    return Err(fail(
                        "timestamps must be on every event or on none".to_string(),
                    ))
                }
            }
            match event {
                Event::Alloc { id, bytes, stream } => {
                    if let Some((_, at)) = live.get(&id) {
                        return Err(fail(format!(
                            "ID {id} is already live (allocated on line {at})"
                        )));
                    }
                    live.insert(id, (bytes, line));
                    live_bytes += bytes;
                    t.peak_live_bytes = t.peak_live_bytes.max(live_bytes);
                    t.allocations += 1;
                    t.streams.insert(stream);
                }
                Event::Free { id } => match live.remove(&id) {
                    Some((bytes, _)) => live_bytes -= bytes,
                    None => return Err(fail(format!("free of ID {id}, which is not live"))),
                },
                Event::Record { id, stream } => {
                    if !live.contains_key(&id) {
                        return Err(fail(format!("record_stream of ID {id}, which is not live")));
                    }
                    t.streams.insert(stream);
                }
                Event::Wait { stream, other } => {
                    t.streams.insert(stream);
                    t.streams.insert(other);
                }
                Event::Sync | Event::EmptyCache => {}
                Event::Step => t.steps += 1,
            }
            t.events.push(event);
            t.lines.push(line);
        }
        if !t.headers.iter().any(|h| h == WARMED_UP || h == IN_TRACE) {
            t.before_start = live
                .iter()
                .filter(|(_, (bytes, _))| *bytes == WORKSPACE_BYTES)
                .map(|(id, _)| *id)
                .filter(|id| {
                    t.events.contains(&Event::Alloc {
                        id: *id,
                        bytes: WORKSPACE_BYTES,
                        stream: 0,
                    })
                })
                .collect();
            t.before_start.sort_unstable();
            t.peak_live_bytes = t.peak_live_without(&t.before_start);
        }
        Ok(t)
    }

    /// The peak of live bytes without the allocations `without`.
    fn peak_live_without(&self, without: &[u64]) -> u64 {
        let mut live: HashMap<u64, u64> = HashMap::new();
        let (mut now, mut peak) = (0u64, 0u64);
        for event in &self.events {
            match *event {
                Event::Alloc { id, bytes, .. } if !without.contains(&id) => {
                    live.insert(id, bytes);
                    now += bytes;
                    peak = peak.max(now);
                }
                Event::Free { id } => now -= live.remove(&id).unwrap_or(0),
                _ => {}
            }
        }
        peak
    }

    /// The value of a header line `KEY VALUE...` (e.g. `workload churn`), if there is one.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.iter().find_map(|h| {
            h.strip_prefix(key)
                .filter(|rest| rest.starts_with(' '))
                .map(str::trim)
        })
    }
}

fn parse_event(words: &[&str]) -> Result<Event, String> {
    let number = |i: usize, what: &str| -> Result<u64, String> {
        words[i]
            .parse::<u64>()
            .map_err(|_| format!("{what} {:?} is not a non-negative integer", words[i]))
    };
    let stream = |i: usize| -> Result<u32, String> {
        words[i]
            .parse::<u32>()
            .map_err(|_| format!("stream {:?} is not an integer 0..=4294967295", words[i]))
    };
    let Some(&kind) = words.first() else {
        return Err("a timestamp without an event".into());
    };
    let arity = match kind {
        "a" => 4,
        "f" => 2,
        "r" | "w" => 3,
        "s" | "x" | "e" => 1,
        other => return Err(format!("unknown event {other:?}")),
    };
    if words.len() != arity {
        return Err(format!(
            "event {:?} takes {} fields, not {}",
            words[0],
            arity,
            words.len()
        ));
    }
    Ok(match words[0] {
        "a" => Event::Alloc {
            id: number(1, "ID")?,
            bytes: number(2, "BYTES")?,
            stream: stream(3)?,
        },
        "f" => Event::Free {
            id: number(1, "ID")?,
        },
        "r" => Event::Record {
            id: number(1, "ID")?,
            stream: stream(2)?,
        },
        "w" => Event::Wait {
            stream: stream(1)?,
            other: stream(2)?,
        },
        "s" => Event::Sync,
        "e" => Event::EmptyCache,
        _ => Event::Step,
    })
}

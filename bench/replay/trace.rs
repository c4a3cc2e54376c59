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
//! Invariant: a parsed [`Trace`] is consistent — every `f` and `r` names a live allocation, no
//! live ID is allocated again — so a replay never meets an unknown ID; any other line is an
//! error naming the file, the line and what is accepted. Its peak live bytes are the largest sum
//! of BYTES over live allocations.

use super::inflate::gunzip;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

pub const ACCEPTED: &str = "`a ID BYTES STREAM`, `f ID`, `r ID STREAM`, `w STREAM OTHER`, `s`, \
     `x`, `# comment` or an empty line";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Alloc { id: u64, bytes: u64, stream: u32 },
    Free { id: u64 },
    Record { id: u64, stream: u32 },
    Wait { stream: u32, other: u32 },
    Sync,
    Step,
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
    pub peak_live_bytes: u64,
    pub allocations: u64,
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
            let words: Vec<&str> = trimmed.split_ascii_whitespace().collect();
            let event = parse_event(&words).map_err(fail)?;
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
                Event::Sync => {}
                Event::Step => t.steps += 1,
            }
            t.events.push(event);
            t.lines.push(line);
        }
        Ok(t)
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
    let arity = match words[0] {
        "a" => 4,
        "f" => 2,
        "r" | "w" => 3,
        "s" | "x" => 1,
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
        _ => Event::Step,
    })
}

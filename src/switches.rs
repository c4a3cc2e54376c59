//! Process-wide switches that every allocation reads, in one cache line: whether an optional
//! feature — tags, a shareable scope, a timeline recording — is in use anywhere in the process.
//! While none is, an allocation and its free read this one line of them and nothing of the
//! features' own state (which lives in their modules, each a line or a pointer away).
//!
//! Invariant: a switch is on whenever its feature may apply to an allocation (off only once
//! nothing in the process uses it); a reader that finds it on asks the feature's own state, which
//! decides. A timeline's own flag may go on just before the switch does: its readers ask the
//! switch first ([`crate::history::History::enabled`]), so it records from the switch on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The switches, aligned to a cache line of their own.
#[repr(C, align(64))]
pub(crate) struct Switches {
    /// Set by the first tag pushed in the process, never cleared ([`crate::tag`]).
    pub tags_pushed: AtomicBool,
    /// Threads inside a shareable scope ([`crate::ipc`]).
    pub shareable_threads: AtomicUsize,
    /// Timelines recording ([`crate::history::History`]s with recording on).
    pub recordings: AtomicUsize,
}

pub(crate) static SWITCHES: Switches = Switches {
    tags_pushed: AtomicBool::new(false),
    shareable_threads: AtomicUsize::new(0),
    recordings: AtomicUsize::new(0),
};

impl Switches {
    /// True if some timeline records.
    #[inline(always)]
    pub fn recording(&self) -> bool {
        self.recordings.load(Ordering::Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switches_share_one_cache_line() {
        assert_eq!(std::mem::align_of::<Switches>(), 64);
        assert!(std::mem::size_of::<Switches>() <= 64);
    }
}

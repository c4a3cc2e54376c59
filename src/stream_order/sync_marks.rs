//! Where each thread's synchronisation of the device began: a thread about to synchronise notes
//! a mark (its owner's count of what it has queued so far), and takes it back once the
//! synchronisation returned — everything queued before the mark is then past the GPU.
//!
//! Invariants: at most one mark a thread (a new one replaces the thread's old one); a mark is
//! taken back only by the thread that noted it, and only once its synchronisation returned; a
//! mark whose end never came (the synchronisation failed, or its owner returned early) stays
//! until the thread's next beginning replaces it; beyond [`SYNC_MARKS_KEPT`] threads all marks
//! are forgotten — a synchronisation whose mark is gone finds none, and its owner asks the driver,
//! as without a mark.

use std::thread::ThreadId;

/// The most marks kept (one a thread synchronising at once).
const SYNC_MARKS_KEPT: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct SyncMarks {
    marks: Vec<(ThreadId, u64)>,
}

impl SyncMarks {
    /// The calling thread is about to synchronise the device: its mark is `mark` (`None`: it
    /// gets none, as during a capture); any mark it noted before is forgotten.
    pub fn note(&mut self, mark: Option<u64>) {
        let thread = std::thread::current().id();
        self.marks.retain(|&(t, _)| t != thread);
        let Some(mark) = mark else {
            return;
        };
        if self.marks.len() >= SYNC_MARKS_KEPT {
            self.marks.clear();
        }
        self.marks.push((thread, mark));
    }

    /// The calling thread's synchronisation returned: the mark it noted, if any (then forgotten).
    pub fn take(&mut self) -> Option<u64> {
        let thread = std::thread::current().id();
        let at = self.marks.iter().position(|&(t, _)| t == thread)?;
        Some(self.marks.swap_remove(at).1)
    }
}

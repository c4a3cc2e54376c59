//! A diagnostic build's count of every driver call by name (`--features call-counts`), and the
//! wall time of those made through `timed` and of PyTorch's calls into `my_malloc` and `my_free`
//! (whole, driver calls included: [`Timed`]), printed to standard error at exit: which calls an
//! allocation path makes on a real GPU, what they cost there under the program's load, and how
//! much of a step the allocator's entry points take.
//!
//! Invariant: counting takes no lock and allocates nothing: a fixed table of atomics, one row per
//! call site's name (found by the name's address; two sites with the same text may have two rows,
//! which the print adds up), so that what it adds inside a timed entry point is a few relaxed
//! atomic additions. A row is claimed by the name's address alone; only the thread that claimed
//! it stores the name's length after, and a reader takes a row whose length is not there yet as
//! unnamed. A name that finds the table full is counted under "(table full)".

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

const ROWS: usize = 256;

/// One name's counts.
struct Row {
    /// The name's bytes (null: a free row); its length is `len`, stored by the claiming thread
    /// once the row is its (0 until then).
    name: AtomicPtr<u8>,
    len: AtomicUsize,
    calls: AtomicU64,
    timed: AtomicU64,
    nanos: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // (the initialiser of each row of TABLE)
const FREE: Row = Row {
    name: AtomicPtr::new(std::ptr::null_mut()),
    len: AtomicUsize::new(0),
    calls: AtomicU64::new(0),
    timed: AtomicU64::new(0),
    nanos: AtomicU64::new(0),
};
static TABLE: [Row; ROWS] = [FREE; ROWS];
static FULL: Row = FREE;
static AT_EXIT: Once = Once::new();

/// `call`'s row, claimed on its first use.
fn row(call: &'static str) -> &'static Row {
    AT_EXIT.call_once(|| {
        // SAFETY: `print` is an extern "C" fn with no arguments, as atexit wants.
        unsafe { libc::atexit(print) };
    });
    let key = call.as_ptr() as *mut u8;
    let mut at = (key as usize >> 3) % ROWS;
    for _ in 0..ROWS {
        let r = &TABLE[at];
        let now = r.name.load(Ordering::Acquire);
        if now == key {
            return r;
        }
        if now.is_null() {
            match r
                .name
                .compare_exchange(now, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    r.len.store(call.len(), Ordering::Release);
                    return r;
                }
                Err(other) if other == key => return r,
                Err(_) => {}
            }
        }
        at = (at + 1) % ROWS;
    }
    &FULL
}

/// The name of a claimed row whose length is stored (None before that).
fn name_of(r: &Row) -> Option<&'static str> {
    let len = r.len.load(Ordering::Acquire);
    let ptr = r.name.load(Ordering::Acquire);
    if ptr.is_null() || len == 0 {
        return None;
    }
    // SAFETY: a row's length is stored only by the thread that claimed it for that name, after
    // the claim, so a non-zero length read here belongs to the `&'static str` at `ptr`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    std::str::from_utf8(bytes).ok()
}

extern "C" fn print() {
    let mut rows: Vec<(&str, u64, u64, u64)> = Vec::new();
    let named = TABLE.iter().filter_map(|r| name_of(r).map(|n| (n, r)));
    for (name, r) in named.chain(std::iter::once(("(table full)", &FULL))) {
        let counts = [&r.calls, &r.timed, &r.nanos].map(|a| a.load(Ordering::Relaxed));
        match rows.iter_mut().find(|row| row.0 == name) {
            Some(row) => {
                row.1 += counts[0];
                row.2 += counts[1];
                row.3 += counts[2];
            }
            None => rows.push((name, counts[0], counts[1], counts[2])),
        }
    }
    rows.retain(|row| row.1 > 0 || row.2 > 0);
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    for (call, n, timed, nanos) in rows {
        match timed {
            0 => eprintln!("CALLS {call} {n}"),
            _ => eprintln!("CALLS {call} {n} total_us {}", nanos / 1000),
        }
    }
}

pub(super) fn count(call: &'static str) {
    row(call).calls.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn add_time(call: &'static str, spent: Duration) {
    let r = row(call);
    r.timed.fetch_add(1, Ordering::Relaxed);
    let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
    r.nanos.fetch_add(nanos, Ordering::Relaxed);
}

/// Adds the wall time from its start to its drop to `call`'s count and total.
pub(crate) struct Timed(&'static str, Instant);

impl Timed {
    pub(crate) fn start(call: &'static str) -> Timed {
        Timed(call, Instant::now())
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        let spent = self.1.elapsed();
        count(self.0);
        add_time(self.0, spent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (calls, timed calls, nanoseconds) of every row named `name`.
    fn totals(name: &str) -> (u64, u64, u64) {
        TABLE
            .iter()
            .filter(|r| name_of(r) == Some(name))
            .fold((0, 0, 0), |(c, t, n), r| {
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                (c + get(&r.calls), t + get(&r.timed), n + get(&r.nanos))
            })
    }

    #[test]
    fn names_claimed_at_once_by_many_threads_keep_their_own_rows() {
        const NAMES: [&str; 8] = [
            "t-a", "t-bb", "t-ccc", "t-dddd", "t-e", "t-ff", "t-ggg", "t-h",
        ];
        let threads: Vec<_> = NAMES
            .iter()
            .map(|&name| std::thread::spawn(move || (0..100).for_each(|_| count(name))))
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        for name in NAMES {
            assert_eq!(totals(name), (100, 0, 0), "{name}");
        }
    }

    #[test]
    fn calls_and_times_add_up_under_their_name() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..1000 {
                        count("test-counted");
                        add_time("test-timed", Duration::from_nanos(7));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(totals("test-counted"), (4000, 0, 0));
        assert_eq!(totals("test-timed"), (0, 4000, 28_000));
        drop(Timed::start("test-entry"));
        let (calls, timed, _) = totals("test-entry");
        assert_eq!((calls, timed), (1, 1));
    }
}

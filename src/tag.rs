//! Tags: a name that marks the blocks a thread allocates while it is pushed
//! (`with streampool.tag("kv_cache"):`), so that a sleep can discard what some blocks hold and
//! keep the rest ([`crate::DeviceAllocator::sleep`]).
//!
//! Invariants: the tag of an allocation is the innermost tag its own thread pushed and has not
//! popped (none when the thread's stack is empty); a name gets one id for the life of the process
//! (ids start at 1, never reused); names are 1 to [`MAX_TAG_BYTES`] bytes of UTF-8, at most
//! [`MAX_TAGS`] distinct names and [`MAX_DEPTH`] tags deep on a thread, and a refused push changes
//! nothing; until the first push of the process, reading the current tag costs one relaxed
//! atomic load (the allocation hot path reads it). The registry's lock is a leaf: never held
//! while another lock is taken.

use crate::error::{Error, Result};
use crate::switches::SWITCHES;
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::num::NonZeroU32;
use std::sync::atomic::Ordering;

/// The longest tag name, in bytes.
pub const MAX_TAG_BYTES: usize = 256;
/// The most distinct tag names a process may use.
pub const MAX_TAGS: usize = 4096;
/// The most tags a thread may have pushed at once.
pub const MAX_DEPTH: usize = 1024;

/// A tag's id: its name's place in the registry, from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TagId(NonZeroU32);

/// Every name pushed so far; the id of `NAMES[i]` is `i + 1`.
static NAMES: Mutex<Vec<Box<str>>> = Mutex::new(Vec::new());

thread_local! {
    /// The tags this thread pushed, innermost last.
    static STACK: RefCell<Vec<TagId>> = const { RefCell::new(Vec::new()) };
    /// The innermost of them (0: none), read by every allocation once a tag was pushed.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
}

/// Checks a tag name: 1 to [`MAX_TAG_BYTES`] bytes.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "a tag name must not be empty".into(),
        ));
    }
    if name.len() > MAX_TAG_BYTES {
        let start: String = name.chars().take(32).collect();
        return Err(Error::InvalidArgument(format!(
            "tag name {start:?}... is {} bytes long: at most {MAX_TAG_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

/// The id of `name`, registered if new.
fn intern(name: &str) -> Result<TagId> {
    check_name(name)?;
    let mut names = NAMES.lock();
    let index = match names.iter().position(|n| &**n == name) {
        Some(index) => index,
        None if names.len() >= MAX_TAGS => {
            return Err(Error::InvalidArgument(format!(
                "tag {name:?}: a process may use at most {MAX_TAGS} distinct tag names"
            )))
        }
        None => {
            names.push(name.into());
            names.len() - 1
        }
    };
    let id = u32::try_from(index + 1).expect("at most MAX_TAGS names");
    Ok(TagId(NonZeroU32::new(id).expect("from 1")))
}

/// The id of a tag pushed before; an error naming it if no thread ever pushed it.
pub fn lookup(name: &str) -> Result<TagId> {
    check_name(name)?;
    let names = NAMES.lock();
    match names.iter().position(|n| &**n == name) {
        Some(index) => {
            let id = u32::try_from(index + 1).expect("at most MAX_TAGS names");
            Ok(TagId(NonZeroU32::new(id).expect("from 1")))
        }
        None => {
            let known: Vec<String> = names.iter().take(8).map(|n| format!("{n:?}")).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            Err(Error::InvalidArgument(format!(
                "unknown tag {name:?}: no thread of this process used streampool.tag({name:?}) \
                 (tags used: {}{more}); nothing changed",
                match known.is_empty() {
                    true => "none".to_string(),
                    false => known.join(", "),
                }
            )))
        }
    }
}

/// Blocks this thread allocates from now on carry `name`, until the matching [`pop`].
pub fn push(name: &str) -> Result<()> {
    STACK.with_borrow_mut(|stack| {
        // Checked before the name is registered: a refused push changes nothing.
        if stack.len() >= MAX_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "tag {name:?}: this thread has {MAX_DEPTH} tags pushed already (a pop missing?)"
            )));
        }
        let id = intern(name)?;
        stack.push(id);
        CURRENT.set(id.0.get());
        // Written once: the line every allocation reads stays clean in the other cores' caches.
        if !SWITCHES.tags_pushed.load(Ordering::Relaxed) {
            SWITCHES.tags_pushed.store(true, Ordering::Relaxed);
        }
        Ok(())
    })
}

/// Ends this thread's innermost tag; the one pushed before it (if any) applies again. An error
/// if the thread has none.
pub fn pop() -> Result<()> {
    STACK.with_borrow_mut(|stack| {
        if stack.pop().is_none() {
            return Err(Error::InvalidArgument(
                "no tag to pop: this thread pushed none (streampool.tag() is per thread)".into(),
            ));
        }
        CURRENT.set(stack.last().map_or(0, |id| id.0.get()));
        Ok(())
    })
}

/// The tag of a block this thread allocates now.
#[inline]
pub fn current() -> Option<TagId> {
    if !SWITCHES.tags_pushed.load(Ordering::Relaxed) {
        return None;
    }
    NonZeroU32::new(CURRENT.get()).map(TagId)
}

/// The name of this thread's innermost tag, if any.
pub fn current_name() -> Option<String> {
    let id = current()?;
    let names = NAMES.lock();
    names.get(id.0.get() as usize - 1).map(|n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_nest_per_thread_and_names_are_checked() {
        assert_eq!(current(), None);
        push("tag-test-outer").unwrap();
        let outer = current().unwrap();
        push("tag-test-inner").unwrap();
        assert_ne!(current(), Some(outer));
        assert_eq!(current_name().as_deref(), Some("tag-test-inner"));
        std::thread::spawn(|| assert_eq!(current(), None))
            .join()
            .unwrap();
        pop().unwrap();
        assert_eq!(current(), Some(outer));
        assert_eq!(lookup("tag-test-outer").unwrap(), outer);
        pop().unwrap();
        assert_eq!(current(), None);
        assert!(pop().unwrap_err().to_string().contains("no tag to pop"));
        for bad in [String::new(), "x".repeat(MAX_TAG_BYTES + 1)] {
            assert!(push(&bad).is_err());
        }
        assert_eq!(current(), None, "a refused push changes nothing");
        let e = lookup("tag-test-never").unwrap_err().to_string();
        assert!(e.contains("unknown tag \"tag-test-never\""), "{e}");
    }

    #[test]
    fn a_push_refused_for_depth_registers_no_name() {
        std::thread::spawn(|| {
            for _ in 0..MAX_DEPTH {
                push("tag-test-deep").unwrap();
            }
            assert!(push("tag-test-one-too-deep").is_err());
            assert!(
                lookup("tag-test-one-too-deep").is_err(),
                "registered by a refused push"
            );
        })
        .join()
        .unwrap();
    }
}

//! The C entries of sleep and wake: the device's physical memory back to it, the addresses kept
//! (the vmm backend), and back again; and the tags that choose whose contents a sleep discards.
//!
//! Invariant: as for every export: argument conversion, `catch_unwind`, a status code; an out
//! pointer may be NULL (the figure is not written) and is written only on success; a tag name
//! that is not UTF-8 is refused before anything changes.

use super::{guarded, status};
use crate::api;
use crate::error::{Error, Result};
use crate::tag::MAX_TAGS;
use std::ffi::{c_char, c_int, CStr};

/// Writes `value` to `out` unless it is NULL.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn write_optional(out: *mut u64, value: u64) {
    if !out.is_null() {
        // SAFETY: non-NULL, writable (the caller's guarantee).
        unsafe { out.write(value) };
    }
}

/// Puts `device` to sleep: after synchronising it, every physical page goes back to the device
/// while the addresses stay reserved; at `level` 1 the contents of live blocks wait in
/// page-locked host memory, at level 2 they are discarded. Allocations on the device fail until
/// `streampool_wake`. Writes the bytes given back to `*given_back` (if not NULL). The vmm
/// backend only; an error (the pool backend or `STREAMPOOL_IPC=1`, a capture, asleep already, an
/// export of a live block's pages not released, host memory that cannot be pinned) changes
/// nothing; a copy that fails leaves the device awake with every block's contents (memory no
/// block used may have gone back, as `torch.cuda.empty_cache()` gives it).
///
/// # Safety
/// `given_back` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_sleep(
    device: c_int,
    level: c_int,
    given_back: *mut u64,
) -> c_int {
    status(guarded(|| {
        let level = u32::try_from(level)
            .map_err(|_| Error::InvalidArgument(format!("sleep level {level}: 1 or 2")))?;
        let bytes = api::device(device)?.sleep(level, &[])?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(given_back, bytes) };
        Ok(())
    }))
}

/// The tag name at `name`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
unsafe fn tag_name<'a>(name: *const c_char) -> Result<&'a str> {
    if name.is_null() {
        return Err(Error::InvalidArgument("a tag name must not be NULL".into()));
    }
    // SAFETY: checked non-NULL; the caller guarantees NUL termination.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    std::str::from_utf8(bytes).map_err(|_| {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]);
        Error::InvalidArgument(format!("tag name {text:?} is not UTF-8"))
    })
}

/// Blocks the calling thread allocates from now on carry the tag `name` (1 to 256 bytes of
/// UTF-8), until the matching `streampool_tag_pop`; tags nest, the innermost applies, and each
/// thread has its own. `streampool_sleep_discarding` discards the contents of tagged blocks.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn streampool_tag_push(name: *const c_char) -> c_int {
    status(guarded(|| {
        // SAFETY: the caller's guarantee.
        let name = unsafe { tag_name(name) }?;
        // The tag registry's lock counts as the allocator's for fork(): a child of a process that
        // tagged takes no lock a parent thread may have held; it cannot allocate, so a tag there
        // marks nothing and is accepted as such.
        crate::fork::note_first_use();
        if crate::fork::in_fork_child() {
            return Ok(());
        }
        crate::tag::push(name)
    }))
}

/// Ends the calling thread's innermost tag (`streampool_tag_push`): the one before it, if any,
/// applies again. An error if the thread has none.
#[no_mangle]
pub extern "C" fn streampool_tag_pop() -> c_int {
    status(guarded(|| match crate::fork::in_fork_child() {
        true => Ok(()), // as streampool_tag_push: nothing was pushed in a fork child
        false => crate::tag::pop(),
    }))
}

/// `streampool_sleep`, but the contents of blocks allocated under one of the `count` tags named
/// in `tags` are discarded even at level 1 (a page shared with a block that is kept is saved
/// with it). A name that no thread ever pushed, or one that is not UTF-8, is an error naming
/// it, and nothing changes. `tags` may be NULL when `count` is 0.
///
/// # Safety
/// `tags` must point to `count` NUL-terminated strings (or be NULL with `count` 0);
/// `given_back` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_sleep_discarding(
    device: c_int,
    level: c_int,
    tags: *const *const c_char,
    count: usize,
    given_back: *mut u64,
) -> c_int {
    status(guarded(|| {
        let level = u32::try_from(level)
            .map_err(|_| Error::InvalidArgument(format!("sleep level {level}: 1 or 2")))?;
        if count > MAX_TAGS {
            return Err(Error::InvalidArgument(format!(
                "{count} tags to discard: there are at most {MAX_TAGS}"
            )));
        }
        let pointers = match (tags.is_null(), count) {
            (_, 0) => &[][..],
            (true, _) => {
                return Err(Error::InvalidArgument(format!(
                    "tags is NULL but count is {count}"
                )))
            }
            // SAFETY: non-NULL; the caller guarantees `count` readable pointers.
            (false, n) => unsafe { std::slice::from_raw_parts(tags, n) },
        };
        let names = pointers
            .iter()
            // SAFETY: the caller guarantees each is a NUL-terminated string (NULL is refused).
            .map(|&p| unsafe { tag_name(p) })
            .collect::<Result<Vec<_>>>()?;
        let bytes = api::device(device)?.sleep(level, &names)?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(given_back, bytes) };
        Ok(())
    }))
}

/// Wakes `device`: fresh memory mapped under every live block at the address it slept at, the
/// contents of a level-1 sleep copied back (memory no block used was given back for good, as
/// `empty_cache` gives it back). Writes the bytes restored to `*restored` (if not NULL). Out of memory part
/// way: what was restored stays, the rest sleeps on, and another call goes on.
///
/// # Safety
/// `restored` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_wake(device: c_int, restored: *mut u64) -> c_int {
    status(guarded(|| {
        let bytes = api::device(device)?.wake()?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(restored, bytes) };
        Ok(())
    }))
}

/// Writes the bytes of `device` asleep now, the pages under the blocks live at the sleep (a block
/// freed while asleep included, until the wake, which does not map its pages again), to `*out`
/// (0 when awake).
///
/// # Safety
/// `out` must be writable (NULL is refused with INVALID_ARGUMENT).
#[no_mangle]
pub unsafe extern "C" fn streampool_sleeping_bytes(device: c_int, out: *mut u64) -> c_int {
    // SAFETY: the caller's guarantee.
    unsafe { write_figure(out, || Ok(api::device(device)?.sleeping_bytes())) }
}

/// Writes the bytes of the sleeping `device`'s contents waiting in page-locked host memory to
/// `*out` (0 when awake, or when nothing was kept).
///
/// # Safety
/// `out` must be writable (NULL is refused with INVALID_ARGUMENT).
#[no_mangle]
pub unsafe extern "C" fn streampool_sleep_saved_bytes(device: c_int, out: *mut u64) -> c_int {
    // SAFETY: the caller's guarantee.
    unsafe { write_figure(out, || Ok(api::device(device)?.sleep_saved_bytes())) }
}

/// The status of writing `figure()` to `*out`; NULL `out` is refused before it is read.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn write_figure(out: *mut u64, figure: impl FnOnce() -> Result<u64>) -> c_int {
    status(guarded(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument("out must not be NULL".into()));
        }
        let bytes = figure()?;
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { out.write(bytes) };
        Ok(())
    }))
}

/// Writes the bytes of page-locked host memory `device` holds for sleeping to `*out`: the buffer
/// of a sleep's saved contents, and the one kept after a wake for the next level-1 sleep (0 if
/// none).
///
/// # Safety
/// `out` must be writable (NULL is refused with INVALID_ARGUMENT).
#[no_mangle]
pub unsafe extern "C" fn streampool_sleep_host_buffer_bytes(device: c_int, out: *mut u64) -> c_int {
    // SAFETY: the caller's guarantee.
    unsafe { write_figure(out, || Ok(api::device(device)?.sleep_host_buffer_bytes())) }
}

/// Frees the page-locked host buffer `device` keeps after a wake for its next level-1 sleep
/// (page-locking it again costs more than the copies). Writes the bytes freed to `*freed` (if
/// not NULL; 0 if none was kept). INVALID_ARGUMENT while the buffer holds the contents of the
/// device's sleep.
///
/// # Safety
/// `freed` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_release_sleep_buffer(device: c_int, freed: *mut u64) -> c_int {
    status(guarded(|| {
        let bytes = api::device(device)?.release_sleep_buffer()?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(freed, bytes) };
        Ok(())
    }))
}

/// Page-locks now the host buffer `device`'s next level-1 sleep copies its contents into
/// (pinning is the first sleep's slowest step; the call lasts as long, and other threads go on
/// allocating on the device meanwhile):
/// `bytes` of it, or with 0 what the memory under live blocks needs now; a buffer kept from an
/// earlier sleep or reservation that is at least that large stays as it is. Writes the bytes of
/// the buffer kept to `*reserved` (if not NULL). INVALID_ARGUMENT on the pool backend, while
/// the device is asleep, or when the memory cannot be page-locked (a buffer kept before stays).
///
/// # Safety
/// `reserved` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_reserve_sleep_buffer(
    device: c_int,
    bytes: u64,
    reserved: *mut u64,
) -> c_int {
    status(guarded(|| {
        let kept = api::device(device)?.reserve_sleep_buffer(bytes)?;
        // SAFETY: the caller's guarantee.
        unsafe { write_optional(reserved, kept) };
        Ok(())
    }))
}

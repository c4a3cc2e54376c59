//! The exports streampool's Python package hands to PyTorch: the memory-pool hooks of
//! `torch._C._CUDAPluggableAllocator` (begin, end, release), the attach of streampool's C++
//! methods, and what the package's routing of `torch._C`'s pool functions needs (a pool's live
//! blocks and use count, restoring a checkpointed block).
//!
//! Invariant: as for every export — argument conversion, `catch_unwind`, no policy; the three
//! hooks PyTorch calls from C++ throw PyTorch's `c10::Error` on failure (PyTorch ignores a
//! return value there), the others return a status.

use super::{guarded, ptr_of, status, stream_of};
use crate::api::{self, set_last_error};
use crate::error::{Error, Result};
use crate::torch_edge::c10_error::{self, Kind};
use crate::torch_edge::graphs::{expect_restore, Restore, TorchFilter};
use crate::torch_edge::std_function::{FilterSignature, OwnedFunction, StdFunction};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

use crate::device::{StreamFilter, BLOCK_ALIGN_BYTES};
use crate::driver::DevicePtr;

/// The filter of a route begun without one: every allocation of the device.
struct EveryStream;

impl StreamFilter for EveryStream {
    fn claims(&self, _stream: crate::driver::Stream) -> bool {
        true
    }
}

/// Runs `f`; its error is thrown to PyTorch as `c10::Error` (or `std::runtime_error`).
///
/// # Safety
/// Only from an `extern "C-unwind"` frame with nothing to drop.
unsafe fn or_throw(f: impl FnOnce() -> Result<()>) {
    if let Err(e) = guarded(f) {
        // SAFETY: as the caller promises.
        unsafe { c10_error::throw_to_pytorch(Kind::Error, &e) }
    }
}

/// Runs `f` for a hook PyTorch calls from a destructor (which must not throw: that ends the
/// process): its error is logged and kept as the thread's last error.
fn or_log(hook: &str, f: impl FnOnce() -> Result<()>) {
    if let Err(e) = guarded(f) {
        set_last_error(&e);
        if !crate::api::in_fork_child() {
            log::error!("{hook}: {e}");
        }
    }
}

/// PyTorch's `beginAllocateToPool` hook (`set_begin_allocate_to_pool`): allocations on `device`
/// that `filter` (a `std::function<bool(cudaStream_t)>*`) claims go to pool `(id_a, id_b)`; a
/// NULL or empty `filter` claims every allocation of the device.
///
/// # Safety
/// `filter` must be NULL or point to a live `std::function<bool(cudaStream_t)>` of the process's
/// libstdc++ (PyTorch passes its by-value argument so).
#[no_mangle]
pub unsafe extern "C-unwind" fn streampool_begin_allocate_to_pool(
    device: c_int,
    id_a: u64,
    id_b: u64,
    filter: *const c_void,
) {
    let copy = match filter.is_null() {
        true => None,
        // SAFETY: as the caller promises: a std::function of this signature, or NULL.
        false => unsafe {
            OwnedFunction::clone_from(filter as *const StdFunction<FilterSignature>)
        },
    };
    let filter: Arc<dyn StreamFilter> = match copy {
        Some(copy) => Arc::new(TorchFilter(copy)),
        None => Arc::new(EveryStream),
    };
    // SAFETY: an extern "C-unwind" frame; `filter` is moved into the closure.
    unsafe {
        or_throw(move || {
            api::device(device)?
                .graph_pools()
                .begin_allocate_to_pool((id_a, id_b), filter)
        })
    }
}

/// PyTorch's `endAllocateToPool` hook (`set_end_allocate_to_pool_fn`).
#[no_mangle]
pub extern "C-unwind" fn streampool_end_allocate_to_pool(device: c_int, id_a: u64, id_b: u64) {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe {
        or_throw(|| {
            api::device(device)?
                .graph_pools()
                .end_allocate_to_pool((id_a, id_b))
        })
    }
}

/// PyTorch's `releasePool` hook (`set_release_pool`), which PyTorch calls from the destructors
/// of `CUDAGraph` and `MemPool`: never throws; an error is logged and kept as the last error.
#[no_mangle]
pub extern "C-unwind" fn streampool_release_pool(device: c_int, id_a: u64, id_b: u64) {
    or_log("streampool_release_pool", || {
        api::device(device)?
            .graph_pools()
            .release_pool((id_a, id_b))
    })
}

/// Gives PyTorch's current allocator streampool's C++ methods; returns one line per feature,
/// `ok\t<feature>` or `missing\t<feature>\t<why>`, or NULL (see `streampool_last_error`) if the
/// current allocator is not streampool's. Call once, right after `change_current_allocator`.
#[no_mangle]
pub extern "C" fn streampool_torch_attach() -> *const c_char {
    static REPORT: OnceLock<std::result::Result<CString, Error>> = OnceLock::new();
    let report = REPORT.get_or_init(|| {
        guarded(|| {
            // SAFETY: called from install(), before CUDA (and so PyTorch's allocator) is in use.
            let attached = unsafe {
                crate::torch_edge::attach(
                    super::my_malloc as *const () as usize,
                    super::my_free as *const () as usize,
                )
            }
            .map_err(Error::InvalidArgument)?;
            let mut lines: Vec<String> =
                attached.wired.iter().map(|f| format!("ok\t{f}")).collect();
            lines.extend(
                attached
                    .unavailable
                    .iter()
                    .map(|(f, why)| format!("missing\t{f}\t{why}")),
            );
            Ok(CString::new(lines.join("\n").replace('\0', " ")).unwrap_or_default())
        })
    });
    match report {
        Ok(text) => text.as_ptr(),
        Err(e) => {
            set_last_error(e);
            std::ptr::null()
        }
    }
}

/// How many users PyTorch memory pool `(id_a, id_b)` of `device` has, or a negative status.
#[no_mangle]
pub extern "C" fn streampool_graph_pool_use_count(device: c_int, id_a: u64, id_b: u64) -> c_int {
    match guarded(|| Ok(api::device(device)?.graph_pools().use_count((id_a, id_b)))) {
        Ok(count) => c_int::try_from(count).unwrap_or(c_int::MAX),
        Err(e) => status(Err(e)),
    }
}

/// A block of a memory pool, as `streampool_graph_pool_blocks` lists them.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct StreampoolPoolBlock {
    pub address: u64,
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub stream: u64,
}

/// Copies the live blocks (`segments` == 0) or the segments (`segments` != 0; requested bytes
/// 0, stream 0) of memory pool `(id_a, id_b)` of `device` into `out` (room for `capacity`) and
/// sets `*count` to how many there are (with `out` NULL, only counts).
///
/// # Safety
/// `out` must be NULL or writable for `capacity` blocks; `count` must be writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_graph_pool_blocks(
    device: c_int,
    id_a: u64,
    id_b: u64,
    segments: c_int,
    out: *mut StreampoolPoolBlock,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(guarded(|| {
        if count.is_null() {
            return Err(Error::InvalidArgument(
                "streampool_graph_pool_blocks: count is NULL".into(),
            ));
        }
        let (id, device) = ((id_a, id_b), api::device(device)?);
        let blocks: Vec<StreampoolPoolBlock> = match segments {
            0 => device
                .graph_pool_live_blocks(id)?
                .into_iter()
                .map(|(ptr, requested, bytes, stream)| StreampoolPoolBlock {
                    address: ptr.0,
                    requested_bytes: requested,
                    block_bytes: bytes,
                    stream: stream.0 as u64,
                })
                .collect(),
            _ => device
                .graph_pools()
                .segments(id)?
                .into_iter()
                .map(|(ptr, bytes)| StreampoolPoolBlock {
                    address: ptr.0,
                    block_bytes: bytes,
                    ..Default::default()
                })
                .collect(),
        };
        // As streampool_blocks: with `out`, how many were copied; without, how many there are.
        let mut copied = blocks.len();
        if !out.is_null() {
            copied = copied.min(capacity);
            for (i, b) in blocks.iter().take(copied).enumerate() {
                // SAFETY: i < capacity, for which the caller guarantees room.
                unsafe { out.add(i).write(*b) };
            }
        }
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { count.write(copied) };
        Ok(())
    }))
}

/// The next allocation of `requested_bytes` on `device` made by this thread through `my_malloc`
/// restores block `ptr` (`block_bytes`, allocated on `stream`) of memory pool `(id_a, id_b)`
/// instead of allocating: how a checkpoint of a pool is restored through PyTorch's own
/// allocation call (so PyTorch books the block). `requested_bytes` 0 clears the directive.
#[no_mangle]
pub extern "C" fn streampool_graph_pool_expect_restore(
    device: c_int,
    id_a: u64,
    id_b: u64,
    ptr: *mut c_void,
    requested_bytes: u64,
    block_bytes: u64,
    stream: *mut c_void,
) -> c_int {
    status(guarded(|| {
        if requested_bytes == 0 {
            expect_restore(None);
            return Ok(());
        }
        // A refused directive leaves none set: the next allocation is not some earlier restore.
        expect_restore(None);
        api::device(device)?;
        check_restored_block(ptr_of(ptr), requested_bytes, block_bytes)?;
        expect_restore(Some(Restore {
            device: device.into(),
            pool: (id_a, id_b),
            ptr: ptr_of(ptr),
            requested_bytes,
            block_bytes,
            stream: stream_of(stream),
        }));
        Ok(())
    }))
}

/// A restored block is one the allocator could have handed out for `requested_bytes`: aligned,
/// its size a multiple of the alignment and at least the request (the graph pool then checks
/// that its range is free there). Anything else is refused before the directive is set.
fn check_restored_block(ptr: DevicePtr, requested_bytes: u64, block_bytes: u64) -> Result<()> {
    let aligned = |v: u64| v.is_multiple_of(BLOCK_ALIGN_BYTES);
    if ptr == DevicePtr::NULL
        || !aligned(ptr.0)
        || !aligned(block_bytes)
        || block_bytes < requested_bytes
    {
        return Err(Error::InvalidArgument(format!(
            "streampool_graph_pool_expect_restore: block {ptr:#x} of {block_bytes} bytes cannot \
             serve {requested_bytes} bytes: a block's address and size are multiples of \
             {BLOCK_ALIGN_BYTES}, and its size is at least the request"
        )));
    }
    Ok(())
}

/// The next `setCheckpointPoolState` PyTorch makes on `device` reports the `count` blocks at
/// `ptrs` (of a memory pool just restored to a checkpoint: each live, allocated through
/// `my_malloc`) as allocated by the restore, so that PyTorch gives the storages holding them
/// the allocator's deleter. Used by streampool's Python routing of
/// `torch._C._cuda_setCheckpointPoolState`, right before it calls PyTorch's binding.
///
/// # Safety
/// `ptrs` must be readable for `count` addresses (or NULL with `count` 0).
#[no_mangle]
pub unsafe extern "C" fn streampool_checkpoint_prepare(
    device: c_int,
    ptrs: *const u64,
    count: usize,
) -> c_int {
    status(guarded(|| {
        api::device(device)?;
        let ptrs = match (ptrs.is_null(), count) {
            (_, 0) => Vec::new(),
            (true, _) => {
                return Err(Error::InvalidArgument(
                    "streampool_checkpoint_prepare: ptrs is NULL".into(),
                ))
            }
            // SAFETY: the caller guarantees `count` readable addresses.
            (false, n) => unsafe { std::slice::from_raw_parts(ptrs, n) }.to_vec(),
        };
        crate::torch_edge::prepare_checkpoint_delta(device.into(), ptrs);
        Ok(())
    }))
}

/// Copies the ids of `device`'s PyTorch memory pools into `out` as (id_a, id_b) pairs of
/// `uint64_t` (room for `capacity` pairs) and sets `*count` to how many there are (with `out`
/// NULL, only counts).
///
/// # Safety
/// `out` must be NULL or writable for `2 * capacity` values; `count` must be writable.
#[no_mangle]
pub unsafe extern "C" fn streampool_graph_pool_ids(
    device: c_int,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(guarded(|| {
        if count.is_null() {
            return Err(Error::InvalidArgument(
                "streampool_graph_pool_ids: count is NULL".into(),
            ));
        }
        let ids = api::device(device)?.graph_pools().ids();
        // As streampool_blocks: with `out`, how many were copied; without, how many there are.
        let mut copied = ids.len();
        if !out.is_null() {
            copied = copied.min(capacity);
            for (i, (a, b)) in ids.iter().take(copied).enumerate() {
                // SAFETY: i < capacity, for which the caller guarantees 2 values of room.
                unsafe {
                    out.add(2 * i).write(*a);
                    out.add(2 * i + 1).write(*b);
                }
            }
        }
        // SAFETY: checked non-NULL; the caller guarantees it is writable.
        unsafe { count.write(copied) };
        Ok(())
    }))
}

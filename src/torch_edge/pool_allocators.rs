//! The allocator of a `torch.cuda.MemPool(allocator)`: PyTorch hands `createOrIncrefPool` the
//! pool's allocator, a `CUDAPluggableAllocator` made from a malloc/free pair; streampool reads
//! the pair out of it, and the pool's segments come from that malloc and go back through that
//! free ([`crate::resource::foreign::ForeignResource`]), as PyTorch's own allocator calls the
//! pool allocator's.
//!
//! Invariants: a pair is read only from an object whose vtable is PyTorch's unmodified
//! `CUDAPluggableAllocator`'s and whose `alloc_fn_` and `free_fn_` have the managers and
//! invokers of the installed allocator's — which holds `my_malloc` and `my_free` exactly where
//! read, checked when streampool attached: so the words read are the plain function pointers
//! PyTorch stored. Anything else is refused with an error, and nothing of it is called.

use super::{lookup, ALLOC_FN_OFFSET_BYTES, PLUGGABLE};
use crate::error::{Error, Result};
use crate::resource::foreign::{ForeignFree, ForeignMalloc};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

/// libstdc++'s `std::function`: functor storage (a function pointer stored in place is its first
/// word), manager, invoker.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawFunction {
    functor: [usize; 2],
    manager: usize,
    invoker: usize,
}

/// `free_fn_`, the member after `alloc_fn_` in a `CUDAPluggableAllocator` (PyTorch 2.5 to 2.11).
const FREE_FN_OFFSET_BYTES: usize = ALLOC_FN_OFFSET_BYTES + std::mem::size_of::<RawFunction>();

/// The installed allocator was checked to hold `my_free` at [`FREE_FN_OFFSET_BYTES`].
static LAYOUT_CHECKED: AtomicBool = AtomicBool::new(false);

/// The two functions of a `CUDAPluggableAllocator`.
///
/// # Safety
/// `object` must be a live `CUDAPluggableAllocator`.
unsafe fn functions(object: *const c_void) -> [RawFunction; 2] {
    let at = |offset: usize| {
        // SAFETY: as the caller promises, the members lie at these offsets of a live object;
        // read unaligned-safe as plain words.
        unsafe { std::ptr::read_unaligned((object as *const u8).add(offset) as *const RawFunction) }
    };
    [at(ALLOC_FN_OFFSET_BYTES), at(FREE_FN_OFFSET_BYTES)]
}

/// At attach: the installed allocator `object` (checked already to allocate with `my_malloc`)
/// keeps `my_free` where this module reads a free function.
///
/// # Safety
/// `object` must be the installed, live `CUDAPluggableAllocator`.
pub(super) unsafe fn check_layout(object: *const c_void, my_free: usize) -> Result<(), String> {
    // SAFETY: as the caller promises.
    let [_, free] = unsafe { functions(object) };
    if free.functor[0] != my_free || free.manager == 0 || free.invoker == 0 {
        return Err(
            "PyTorch's CUDAPluggableAllocator does not keep its free function where \
                    streampool reads it"
                .into(),
        );
    }
    LAYOUT_CHECKED.store(true, Ordering::Release);
    Ok(())
}

/// The malloc/free pair `pool_allocator` was made with, checked against `installed` (the
/// allocator streampool attached to).
///
/// # Safety
/// `installed` must be the installed allocator and `pool_allocator` a live `CUDAAllocator`.
pub(super) unsafe fn pair_of(
    installed: *const c_void,
    pool_allocator: *const c_void,
) -> Result<(ForeignMalloc, ForeignFree)> {
    let refuse = |why: &str| {
        Error::InvalidArgument(format!(
            "a torch.cuda.MemPool's allocator must be a torch.cuda.memory.CUDAPluggableAllocator \
             made from a malloc and a free function: {why}"
        ))
    };
    if !LAYOUT_CHECKED.load(Ordering::Acquire) {
        return Err(refuse(
            "streampool could not check PyTorch's CUDAPluggableAllocator layout at install()",
        ));
    }
    let vtable = lookup::symbol(PLUGGABLE.libraries, PLUGGABLE.vtable)
        .ok_or_else(|| refuse("PyTorch's CUDAPluggableAllocator is not loaded"))?;
    // SAFETY: a live C++ object (the caller promises): its first word is its vtable pointer.
    let vptr = unsafe { *(pool_allocator as *const usize) };
    if vptr != vtable as usize + 2 * std::mem::size_of::<usize>() {
        return Err(refuse("this one is of another class"));
    }
    // SAFETY: both are CUDAPluggableAllocators (the installed one by the caller's promise, the
    // other by its vtable, checked above).
    let ([own_alloc, own_free], [alloc, free]) =
        unsafe { (functions(installed), functions(pool_allocator)) };
    let same_kind = |a: &RawFunction, b: &RawFunction| {
        a.manager == b.manager && a.invoker == b.invoker && b.functor[0] != 0
    };
    if !same_kind(&own_alloc, &alloc) || !same_kind(&own_free, &free) {
        return Err(refuse("its functions are not plain C function pointers"));
    }
    // SAFETY: the functors hold function pointers of PyTorch's pluggable signatures: their
    // managers and invokers are those of the installed allocator's, which hold my_malloc and
    // my_free (checked at attach).
    unsafe {
        Ok((
            std::mem::transmute::<usize, ForeignMalloc>(alloc.functor[0]),
            std::mem::transmute::<usize, ForeignFree>(free.functor[0]),
        ))
    }
}

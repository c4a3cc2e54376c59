//! PyTorch's C++ side, reached without linking libtorch: the installed `CUDAPluggableAllocator`
//! object is given streampool's answers to the virtual methods PyTorch leaves unimplemented for
//! pluggable allocators (cuDNN's `cacheInfo`, memory pools, out-of-memory observers, ...), and
//! `my_malloc` throws PyTorch's own `c10::OutOfMemoryError`.
//!
//! Invariants: nothing of PyTorch's is changed unless the object is the one PyTorch installed
//! around streampool's `my_malloc` and every slot replaced was found holding the method expected
//! there ([`vtable`]); a replaced method never lets a Rust panic or error escape except as a C++
//! exception of PyTorch's types (or `std::runtime_error` where those are missing); what could
//! not be wired is reported by feature, for one log line each.

pub(crate) mod c10_error;
pub(crate) mod graphs;
mod lookup;
mod methods;
mod pool_allocators;
pub(crate) mod std_function;
#[cfg(test)]
mod tests;
mod vtable;

use std::ffi::{c_void, CStr};

/// PyTorch's pluggable allocator class, in libtorch_cuda.
const PLUGGABLE: vtable::Class = vtable::Class {
    vtable: c"_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE",
    type_name: c"N5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE",
    libraries: &[lookup::LIBTORCH_CUDA],
};

/// `c10::cuda::CUDACachingAllocator::allocator`: PyTorch's current CUDA allocator
/// (`std::atomic<CUDAAllocator*>`).
const CURRENT_ALLOCATOR: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";

/// Byte offset of `alloc_fn_` (a `std::function`, its stored function pointer first) in a
/// `CUDAPluggableAllocator`, right after the vtable pointer (PyTorch 2.5 to 2.11).
const ALLOC_FN_OFFSET_BYTES: usize = 8;

/// What [`attach`] wired and what it could not, by feature.
#[derive(Debug, Default)]
pub struct Attached {
    pub wired: Vec<&'static str>,
    pub unavailable: Vec<(&'static str, String)>,
}

/// The allocator PyTorch uses now, if it is a `CUDAPluggableAllocator` around `my_malloc` (at
/// address `my_malloc`).
fn installed_pluggable(my_malloc: usize) -> Result<*mut c_void, String> {
    let current = lookup::symbol(&[lookup::LIBC10_CUDA], CURRENT_ALLOCATOR)
        .ok_or("PyTorch's libc10_cuda is not loaded")?;
    // SAFETY: the symbol is a std::atomic of a pointer: one aligned word, read atomically.
    let object = unsafe {
        (*(current as *const std::sync::atomic::AtomicPtr<c_void>))
            .load(std::sync::atomic::Ordering::Acquire)
    };
    if object.is_null() {
        return Err("PyTorch has no current CUDA allocator".into());
    }
    let vtable = lookup::symbol(PLUGGABLE.libraries, PLUGGABLE.vtable)
        .ok_or("PyTorch's CUDAPluggableAllocator is not in the loaded libraries")?;
    // SAFETY: a live C++ object: its first word is its vtable pointer.
    let vptr = unsafe { *(object as *const usize) };
    if vptr != vtable as usize + 2 * std::mem::size_of::<usize>() {
        return Err(
            "PyTorch's current allocator is not an unmodified CUDAPluggableAllocator".into(),
        );
    }
    // SAFETY: a CUDAPluggableAllocator (checked above): the word after the vtable pointer is
    // the function pointer `alloc_fn_` stores in place.
    let alloc_fn = unsafe { *((object as *const u8).add(ALLOC_FN_OFFSET_BYTES) as *const usize) };
    if alloc_fn != my_malloc {
        return Err(
            "PyTorch's current allocator does not allocate with streampool's my_malloc".into(),
        );
    }
    Ok(object)
}

/// The feature reading a `MemPool`'s own allocator ([`pool_allocators`]).
const MEMPOOL_ALLOCATOR: &str = "torch.cuda.MemPool(allocator) (the pool's own malloc and free)";

/// Gives PyTorch's installed allocator (a `CUDAPluggableAllocator` around `my_malloc`, made
/// current with `change_current_allocator`) streampool's methods; `my_malloc` and `my_free` are
/// those functions' addresses (the C edge passes them: this module does not depend on it). Call
/// once, before CUDA is used.
///
/// # Safety
/// No other thread may be calling PyTorch's allocator while this runs.
pub unsafe fn attach(my_malloc: usize, my_free: usize) -> Result<Attached, String> {
    let object = installed_pluggable(my_malloc)?;
    let mut replacements = methods::replacements();
    let mut unavailable = Vec::new();
    if !vtable::slot_holds(&PLUGGABLE, methods::RAW_DELETER_SLOT, methods::RAW_DELETER) {
        // Restoring a checkpoint hands PyTorch DataPtrs with the allocator's deleter.
        replacements.retain(|r| r.feature != methods::CHECKPOINTS);
        unavailable.push((
            methods::CHECKPOINTS,
            "raw_deleter is not where expected".into(),
        ));
    }
    // SAFETY: the object is the installed pluggable allocator, checked above; the caller
    // promises nobody calls it meanwhile; each replacement has its method's C ABI signature.
    let outcome = unsafe { vtable::patch(object, &PLUGGABLE, &replacements) }?;
    unavailable.extend(outcome.missing);
    let mut attached = Attached {
        wired: outcome.replaced,
        unavailable,
    };
    // SAFETY: the installed allocator, checked above.
    match unsafe { pool_allocators::check_layout(object, my_free) } {
        Ok(()) => attached.wired.push(MEMPOOL_ALLOCATOR),
        Err(why) => attached.unavailable.push((MEMPOOL_ALLOCATOR, why)),
    }
    match c10_error::available() {
        true => attached.wired.push(methods::TYPED_OOM),
        false => attached.unavailable.push((
            methods::TYPED_OOM,
            "c10::OutOfMemoryError is not in the loaded libraries".into(),
        )),
    }
    Ok(attached)
}

pub(crate) use methods::{note_memory_fraction, notify_out_of_memory, prepare_checkpoint_delta};

//! Holding and calling PyTorch's `std::function` arguments (libstdc++'s layout) from Rust: the
//! graph-pool filter a capture passes to `beginAllocateToPool`, out-of-memory observers.
//!
//! Invariants: an [`OwnedFunction`] is a copy made by the function's own manager (clone
//! operation) and destroyed by it on drop, so whatever it captured stays alive exactly as long as
//! the copy; calling an empty function is never attempted (it reports None).

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;

/// libstdc++'s `_Any_data`: a functor stored in place or a pointer to one.
type AnyData = [usize; 2];
/// `bool _M_manager(_Any_data& dest, const _Any_data& source, _Manager_operation op)`.
type Manager = unsafe extern "C-unwind" fn(*mut AnyData, *const AnyData, c_int) -> bool;

/// `_Manager_operation`: copy the functor into the destination.
const CLONE_FUNCTOR: c_int = 2;
/// `_Manager_operation`: destroy the functor.
const DESTROY_FUNCTOR: c_int = 3;

/// `std::function<F>` as libstdc++ lays it out: functor storage, manager, invoker (32 bytes).
#[repr(C)]
pub(crate) struct StdFunction<F> {
    functor: AnyData,
    manager: Option<Manager>,
    invoker: *const c_void,
    signature: PhantomData<F>,
}

/// `bool(cudaStream_t)`: a graph pool's filter.
pub(crate) enum FilterSignature {}
/// `void(int64_t device, size_t allocated, size_t device_total, size_t device_free)`.
pub(crate) enum ObserverSignature {}

/// A copy of a `std::function` owned by Rust.
pub(crate) struct OwnedFunction<F>(Box<StdFunction<F>>);

// SAFETY: PyTorch calls these functions from whichever thread allocates (its own allocator does
// the same); the copy is only called and dropped, never mutated in place.
unsafe impl<F> Send for OwnedFunction<F> {}
// SAFETY: as for Send: shared, the copy is only called (PyTorch's functions may be called from
// any thread) and never mutated in place.
unsafe impl<F> Sync for OwnedFunction<F> {}

impl<F> OwnedFunction<F> {
    /// A copy of the function at `source`, or None if it is empty.
    ///
    /// # Safety
    /// `source` must point to a live `std::function` with signature `F` of the process's
    /// libstdc++.
    pub(crate) unsafe fn clone_from(source: *const StdFunction<F>) -> Option<OwnedFunction<F>> {
        // SAFETY: the caller promises a live std::function.
        let source = unsafe { &*source };
        let manager = source.manager?;
        let mut copy = Box::new(StdFunction {
            functor: [0; 2],
            manager: None,
            invoker: source.invoker,
            signature: PhantomData,
        });
        // SAFETY: the manager of `source` copies its functor into fresh storage of the same
        // layout; only then does the copy own a functor (manager set), so a throw leaves nothing
        // to destroy.
        unsafe { manager(&mut copy.functor, &source.functor, CLONE_FUNCTOR) };
        copy.manager = Some(manager);
        Some(OwnedFunction(copy))
    }

    fn invoker(&self) -> *const c_void {
        self.0.invoker
    }
}

impl OwnedFunction<FilterSignature> {
    /// The filter's answer for `stream`.
    pub(crate) fn call(&self, stream: *mut c_void) -> bool {
        type Invoker = unsafe extern "C-unwind" fn(*const AnyData, *mut *mut c_void) -> bool;
        let mut argument = stream;
        // SAFETY: the invoker of a std::function<bool(cudaStream_t)> takes its functor storage
        // and the argument by rvalue reference (a pointer).
        unsafe {
            let invoke = std::mem::transmute::<*const c_void, Invoker>(self.invoker());
            invoke(&self.0.functor, &mut argument)
        }
    }
}

impl OwnedFunction<ObserverSignature> {
    /// Tells the observer that `device` failed to allocate `allocated_bytes`.
    pub(crate) fn call(
        &self,
        device: i64,
        allocated_bytes: u64,
        total_bytes: u64,
        free_bytes: u64,
    ) {
        type Invoker =
            unsafe extern "C-unwind" fn(*const AnyData, *mut i64, *mut u64, *mut u64, *mut u64);
        let (mut d, mut a, mut t, mut f) = (device, allocated_bytes, total_bytes, free_bytes);
        // SAFETY: the invoker of a std::function<void(int64_t, size_t, size_t, size_t)> takes its
        // functor storage and each argument by rvalue reference (size_t is u64 on LP64).
        unsafe {
            let invoke = std::mem::transmute::<*const c_void, Invoker>(self.invoker());
            invoke(&self.0.functor, &mut d, &mut a, &mut t, &mut f)
        }
    }
}

impl<F> Drop for OwnedFunction<F> {
    fn drop(&mut self) {
        if let Some(manager) = self.0.manager.take() {
            let functor: *mut AnyData = &mut self.0.functor;
            // SAFETY: the functor was cloned by this manager and is destroyed once.
            unsafe { manager(functor, functor, DESTROY_FUNCTOR) };
        }
    }
}

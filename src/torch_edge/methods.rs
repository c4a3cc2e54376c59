//! streampool's implementations of the `CUDAPluggableAllocator` methods PyTorch leaves
//! unimplemented, with the C ABI of the C++ methods they replace (`this` first; a returned
//! class comes back through a hidden pointer passed before `this`), and where each goes.
//!
//! Invariants: whatever can panic runs inside `catch_unwind` (the rest only copies PyTorch's
//! arguments); a failure is thrown as PyTorch's `c10::Error` (or `std::runtime_error`), never
//! returned as a made-up value — except in the methods PyTorch calls from destructors, which log
//! instead (a destructor's throw ends the process); a method answers from streampool's own state
//! only.

use super::c10_error::{self, Kind};
use super::std_function::{ObserverSignature, OwnedFunction, StdFunction};
use super::vtable::{Replacement, SlotAt};
use crate::api::{self, global};
use crate::error::guarded;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::LazyLock;

/// The feature the typed out-of-memory error serves (not a slot: `my_malloc` throws it).
pub(crate) const TYPED_OOM: &str = "torch.OutOfMemoryError";

/// Throws `error` to PyTorch as `c10::Error` (Python `RuntimeError`).
///
/// # Safety
/// The caller's frames must be able to unwind (`extern "C-unwind"`, nothing needing a drop).
unsafe fn throw_error(error: Error) -> ! {
    // SAFETY: as the caller promises.
    unsafe { c10_error::throw_to_pytorch(Kind::Error, &error) }
}

/// Runs `f` for a replaced method: its value, or its error thrown to PyTorch.
///
/// # Safety
/// As [`throw_error`].
unsafe fn answer<T>(f: impl FnOnce() -> Result<T>) -> T {
    match guarded(f) {
        Ok(value) => value,
        // SAFETY: as the caller promises.
        Err(e) => unsafe { throw_error(e) },
    }
}

/// `void cacheInfo(DeviceIndex device, size_t* largestBlock)`: cuDNN sizes its benchmark
/// workspace by it. The largest block streampool could serve now without failing: the device's
/// free memory plus what streampool holds unused (it gives that back before it reports out of
/// memory), or the value passed in if larger.
unsafe extern "C-unwind" fn cache_info(_this: *mut c_void, device: i8, largest: *mut usize) {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    let bytes = unsafe { answer(|| api::device(device)?.cache_info_bytes()) };
    if !largest.is_null() {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        // SAFETY: PyTorch passes a pointer to its size_t.
        unsafe { *largest = (*largest).max(bytes) };
    }
}

/// The fractions set through `set_per_process_memory_fraction`, by device.
static FRACTIONS: LazyLock<Mutex<HashMap<i64, f64>>> = LazyLock::new(Default::default);

/// Remembers the memory fraction set for `device` (for `getMemoryFraction`).
pub(crate) fn note_memory_fraction(device: i64, fraction: f64) {
    FRACTIONS.lock().insert(device, fraction);
}

/// `double getMemoryFraction(DeviceIndex device)`: the fraction last set, 1.0 if none.
unsafe extern "C-unwind" fn get_memory_fraction(_this: *mut c_void, device: i8) -> f64 {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe {
        answer(|| {
            api::device(device)?;
            Ok(FRACTIONS
                .lock()
                .get(&i64::from(device))
                .copied()
                .unwrap_or(1.0))
        })
    }
}

/// `int getPoolUseCount(DeviceIndex, MempoolId_t)`.
unsafe extern "C-unwind" fn get_pool_use_count(
    _: *mut c_void,
    device: i8,
    a: u64,
    b: u64,
) -> c_int {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe {
        answer(|| {
            let count = api::device(device)?.graph_pools().use_count((a, b));
            Ok(c_int::try_from(count).unwrap_or(c_int::MAX))
        })
    }
}

/// `void createOrIncrefPool(DeviceIndex, MempoolId_t, std::shared_ptr<CUDAAllocator>)`:
/// `torch.cuda.MemPool()`. A pool with an allocator of its own (`MemPool(allocator)`) takes its
/// segments from that allocator's malloc and gives them back through its free, as natively.
unsafe extern "C-unwind" fn create_or_incref_pool(
    this: *mut c_void,
    device: i8,
    a: u64,
    b: u64,
    allocator: *const [*mut c_void; 2],
) {
    let object = match allocator.is_null() {
        true => std::ptr::null_mut(),
        // SAFETY: a std::shared_ptr is {object pointer, control block}; PyTorch passes a pointer
        // to its temporary.
        false => unsafe { (*allocator)[0] },
    };
    let own = object.is_null() || object == this;
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe {
        answer(|| match own {
            true => api::device(device)?.graph_pools().create_or_incref((a, b)),
            false => pool_with_allocator(this, object, device, (a, b)),
        })
    }
}

/// Pool `id` of `device` with the allocator `object` (PyTorch's `MemPool` holds it alive) as the
/// source of its segments; `this` is the installed allocator.
fn pool_with_allocator(
    this: *mut c_void,
    object: *mut c_void,
    device: i8,
    id: (u64, u64),
) -> Result<()> {
    // SAFETY: `this` is the installed allocator (its vtable is ours), `object` the live allocator
    // PyTorch passed; the pair read is checked to be PyTorch's plain function pointers.
    let (malloc, free) = unsafe { super::pool_allocators::pair_of(this, object) }?;
    // SAFETY: a pluggable allocator's C functions, callable from any thread, which do not unwind
    // (C functions; PyTorch calls them the same way).
    unsafe {
        api::device(device)?
            .graph_pools()
            .create_or_incref_with_allocator(id, malloc, free)
    }
}

/// `void setUseOnOOM(DeviceIndex, MempoolId_t, bool)`, which `~MemPool` calls (with false):
/// never throws (a destructor's throw ends the process); an error is logged, but in a fork child
/// (a `MemPool` the child inherited and drops), where a lock of the logger may have been held by
/// another thread of the parent at the fork.
unsafe extern "C-unwind" fn set_use_on_oom(_: *mut c_void, device: i8, a: u64, b: u64, on: bool) {
    let done = guarded(|| {
        api::device(device)?
            .graph_pools()
            .set_use_on_oom((a, b), on)
    });
    if let Err(e) = done {
        crate::api::set_last_error(&e);
        if !crate::api::in_fork_child() {
            log::error!("setUseOnOOM: {e}");
        }
    }
}

/// `void setNoSplit(DeviceIndex, MempoolId_t)`.
unsafe extern "C-unwind" fn set_no_split(_: *mut c_void, device: i8, a: u64, b: u64) {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe { answer(|| api::device(device)?.graph_pools().set_no_split((a, b))) }
}

/// `bool isHistoryEnabled()`: whether streampool records its memory timeline.
unsafe extern "C-unwind" fn is_history_enabled(_this: *mut c_void) -> bool {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe { answer(|| Ok(global()?.history_recording())) }
}

/// `void resetPeakStats(DeviceIndex)`.
unsafe extern "C-unwind" fn reset_peak_stats(_this: *mut c_void, device: i8) {
    // SAFETY: an extern "C-unwind" frame with nothing to drop.
    unsafe { answer(|| api::device(device)?.reset_peak_stats()) }
}

/// Observers attached with `torch._C._cuda_attach_out_of_memory_observer`.
static OOM_OBSERVERS: LazyLock<Mutex<Vec<std::sync::Arc<OwnedFunction<ObserverSignature>>>>> =
    LazyLock::new(Default::default);

/// `void attachOutOfMemoryObserver(OutOfMemoryObserver)`: kept (a copy) and called when an
/// allocation through `my_malloc` fails.
unsafe extern "C-unwind" fn attach_oom_observer(
    _this: *mut c_void,
    observer: *const StdFunction<ObserverSignature>,
) {
    // SAFETY: PyTorch passes a pointer to its std::function temporary, of this signature.
    if let Some(copy) = unsafe { OwnedFunction::clone_from(observer) } {
        OOM_OBSERVERS.lock().push(std::sync::Arc::new(copy));
    }
}

/// Calls the out-of-memory observers, as PyTorch's allocator does before it raises: device,
/// the bytes asked for, the memory limit (the device's total without one) and the device's free
/// memory. Called with no lock held; an observer's exception propagates to the caller.
pub(crate) fn notify_out_of_memory(device: i64, requested_bytes: u64) {
    let observers: Vec<_> = OOM_OBSERVERS.lock().clone();
    if observers.is_empty() {
        return;
    }
    let (total, free) = guarded(|| {
        let device = api::device(device)?;
        let memory = device.mem_info()?;
        let limit = device.stats()?.memory_limit_bytes;
        Ok((memory.total_bytes.min(limit), memory.free_bytes))
    })
    .unwrap_or((0, 0));
    for observer in observers {
        observer.call(device, requested_bytes, total, free);
    }
}

thread_local! {
    /// The blocks this thread's next `setCheckpointPoolState` on a device hands to PyTorch, set
    /// by [`prepare_checkpoint_delta`] (streampool's Python side, right before it calls
    /// PyTorch's binding on the same thread).
    static PREPARED: std::cell::RefCell<Option<(i64, Vec<u64>)>> = const { std::cell::RefCell::new(None) };
}

/// This thread's next `setCheckpointPoolState` on `device` reports `ptrs` (blocks of a pool
/// just restored to a checkpoint, each live and booked by PyTorch's allocator) as allocated by
/// the restore: PyTorch's binding then gives the storages that hold them the allocator's
/// deleter. An empty `ptrs` clears it.
pub(crate) fn prepare_checkpoint_delta(device: i64, ptrs: Vec<u64>) {
    let prepared = (!ptrs.is_empty()).then_some((device, ptrs));
    PREPARED.with(|p| *p.borrow_mut() = prepared);
}

/// `c10::DataPtr` as PyTorch's pluggable allocator builds one: data, context deleter, context
/// (the address itself), device type and index.
#[repr(C)]
struct DataPtr {
    data: u64,
    deleter: *const c_void,
    context: u64,
    device_type: i8,
    device_index: i8,
    padding: [u8; 6],
}

/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: i8 = 1;

/// `CheckpointDelta setCheckpointPoolState(DeviceIndex, std::shared_ptr<AllocatorState>)`, as
/// PyTorch's binding `_cuda_setCheckpointPoolState` reaches it once streampool's Python side has
/// restored the pool (`streampool._graphs`): nothing was freed (it refused to free blocks that
/// storages still own), and the blocks it prepared were allocated — each as a `DataPtr` with the
/// allocator's own deleter, which the binding moves into the storages that hold them. A state
/// that is not None did not come from streampool and is refused.
unsafe extern "C-unwind" fn set_checkpoint_pool_state(
    delta: *mut [usize; 6],
    this: *mut c_void,
    device: i8,
    state: *const [*mut c_void; 2],
) -> *mut [usize; 6] {
    // SAFETY: a shared_ptr temporary of PyTorch's: {object, control block}.
    let foreign = !state.is_null() && !unsafe { (*state)[0] }.is_null();
    let prepared = PREPARED.with(|p| p.borrow_mut().take());
    let ptrs = match prepared {
        Some((d, ptrs)) if d == i64::from(device) => ptrs,
        _ => Vec::new(),
    };
    let vector = match foreign {
        true => Err(Error::InvalidArgument(
            "a checkpoint of PyTorch's own allocator cannot be restored into streampool; \
             streampool.install() routes torch._C._cuda_setCheckpointPoolState to its own"
                .into(),
        )),
        // SAFETY: `this` is the installed pluggable allocator (its vtable is ours).
        false => unsafe { data_ptr_vector(this, device, &ptrs) },
    };
    match vector {
        // SAFETY: the hidden return pointer is storage for a CheckpointDelta: two std::vectors,
        // each {begin, end, capacity end}; all null is an empty vector.
        Ok([begin, end]) => unsafe { delta.write([0, 0, 0, begin, end, end]) },
        // SAFETY: an extern "C-unwind" frame with nothing to drop.
        Err(e) => unsafe { throw_error(e) },
    }
    delta
}

/// A `std::vector<c10::DataPtr>`'s storage (from the process's global `operator new`, whose
/// `operator delete` the vector's destructor in PyTorch calls) holding one DataPtr per address:
/// [begin, end).
///
/// # Safety
/// `this` must be PyTorch's pluggable allocator object.
unsafe fn data_ptr_vector(this: *mut c_void, device: i8, ptrs: &[u64]) -> Result<[usize; 2]> {
    if ptrs.is_empty() {
        return Ok([0, 0]);
    }
    type RawDeleter = unsafe extern "C-unwind" fn(*mut c_void) -> *const c_void;
    type OperatorNew = unsafe extern "C-unwind" fn(usize) -> *mut c_void;
    let new = super::lookup::operator_new()
        .ok_or_else(|| Error::Internal("the C++ operator new is not loaded".into()))?;
    let bytes = std::mem::size_of::<DataPtr>()
        .checked_mul(ptrs.len())
        .ok_or_else(|| Error::Internal("too many blocks".into()))?;
    // SAFETY: `raw_deleter() const` is slot 4 of the allocator's vtable (after the two
    // destructors, allocate and is_simple_data_ptr; checked against the symbol table when the
    // vtable was copied); `operator new(size_t)` returns storage or throws.
    unsafe {
        let vtable = *(this as *const *const RawDeleter);
        let deleter = (*vtable.add(RAW_DELETER_SLOT))(this);
        let storage = std::mem::transmute::<*mut c_void, OperatorNew>(new)(bytes) as *mut DataPtr;
        for (i, &ptr) in ptrs.iter().enumerate() {
            storage.add(i).write(DataPtr {
                data: ptr,
                deleter,
                context: ptr,
                device_type: DEVICE_TYPE_CUDA,
                device_index: device,
                padding: [0; 6],
            });
        }
        Ok([storage as usize, storage as usize + bytes])
    }
}

/// The index of `raw_deleter() const` in a `c10::Allocator`'s vtable (from its address point),
/// and the method PyTorch's pluggable allocator has there (checked before the checkpoint method
/// that calls it is installed).
pub(super) const RAW_DELETER_SLOT: usize = 4;
pub(super) const RAW_DELETER: &CStr =
    c"_ZNK5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator11raw_deleterEv";

/// The feature whose method calls `raw_deleter`.
pub(super) const CHECKPOINTS: &str = "torch.compile CUDA graph trees (setCheckpointPoolState)";

/// The mangled name of a method of PyTorch's pluggable allocator, from the part after the class.
macro_rules! method {
    ($tail:literal $(,)?) => {{
        const NAME: &CStr = match CStr::from_bytes_with_nul(
            concat!(
                "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator",
                $tail,
                "\0"
            )
            .as_bytes(),
        ) {
            Ok(name) => name,
            Err(_) => panic!("a mangled name has no NUL inside"),
        };
        NAME
    }};
}

/// The slots replaced, PyTorch 2.11's `CUDAAllocator` declaration order where a method is not
/// exported (the four pool methods and `checkPoolLiveAllocations` lie between `releasePool` and
/// `shareIpcHandle`; `isHistoryEnabled` between `getIpcDevPtr` and `recordHistory`).
pub(super) fn replacements() -> Vec<Replacement> {
    let release_pool = method!("11releasePoolEaSt4pairIyyE");
    let share_ipc = method!("14shareIpcHandleEPv");
    let pool_method = |offset: usize| SlotAt::Between {
        anchor: release_pool,
        offset,
        closing: share_ipc,
        span: 6,
    };
    vec![
        Replacement {
            feature: "cuDNN benchmark mode (cacheInfo)",
            at: SlotAt::Symbol(method!("9cacheInfoEaPm")),
            function: cache_info as *const c_void,
        },
        Replacement {
            feature: "torch.cuda.get_per_process_memory_fraction (getMemoryFraction)",
            at: SlotAt::Symbol(method!("17getMemoryFractionEa")),
            function: get_memory_fraction as *const c_void,
        },
        Replacement {
            feature: "torch.cuda.MemPool (getPoolUseCount)",
            at: pool_method(1),
            function: get_pool_use_count as *const c_void,
        },
        Replacement {
            feature: "torch.cuda.MemPool (createOrIncrefPool)",
            at: pool_method(2),
            function: create_or_incref_pool as *const c_void,
        },
        Replacement {
            feature: "torch.cuda.MemPool(use_on_oom=True) (setUseOnOOM)",
            at: pool_method(3),
            function: set_use_on_oom as *const c_void,
        },
        Replacement {
            feature: "torch.cuda.MemPool(no_split=True) (setNoSplit)",
            at: pool_method(4),
            function: set_no_split as *const c_void,
        },
        Replacement {
            feature: "memory history from C++ (isHistoryEnabled)",
            at: SlotAt::Between {
                anchor: method!(
                    "12getIpcDevPtrENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
                ),
                offset: 1,
                closing: method!(
                    "13recordHistoryEbPFSt10shared_ptrIN3c1015GatheredContextEEvEmNS4_22CachingDeviceAllocator13RecordContextEbRKSt6vectorINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESaISH_EE",
                ),
                span: 2,
            },
            function: is_history_enabled as *const c_void,
        },
        Replacement {
            feature: "reset_peak_memory_stats from C++ (resetPeakStats)",
            at: SlotAt::Symbol(method!("14resetPeakStatsEa")),
            function: reset_peak_stats as *const c_void,
        },
        Replacement {
            feature: "out-of-memory observers (attachOutOfMemoryObserver)",
            at: SlotAt::Symbol(method!("25attachOutOfMemoryObserverESt8functionIFvlmmmEE")),
            function: attach_oom_observer as *const c_void,
        },
        Replacement {
            feature: CHECKPOINTS,
            at: SlotAt::Symbol(method!(
                "22setCheckpointPoolStateEaSt10shared_ptrIN3c104cuda20CUDACachingAllocator14AllocatorStateEE",
            )),
            function: set_checkpoint_pool_state as *const c_void,
        },
    ]
}

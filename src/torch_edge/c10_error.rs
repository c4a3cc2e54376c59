//! Throwing PyTorch's own exception types from Rust: `c10::OutOfMemoryError` (which Python sees
//! as `torch.OutOfMemoryError`) and `c10::Error` (`RuntimeError`), built by libc10's exported
//! constructor in exception storage of the process's libstdc++.
//!
//! Invariants: an exception is thrown only if every piece was found in libraries PyTorch has
//! already loaded and checked against what the layout needs (the out-of-memory class's vtable is
//! the size of its base's, its type names the expected classes); otherwise the caller is told
//! (None) and falls back to `std::runtime_error`. The message is copied before the throw.

use super::lookup::{self, LIBC10, LIBC10_CUDA, LIBTORCH_CUDA, LIBTORCH_PYTHON};
use crate::cxx_throw;
use crate::fork::Published;
use std::ffi::{c_char, c_void, CStr};

/// `std::__cxx11::string` storage: pointer, length, 16-byte local buffer (libstdc++).
#[repr(C, align(8))]
struct StdString([u8; 32]);

/// An empty `std::shared_ptr` (object and control-block pointers, both null).
#[repr(C)]
struct EmptySharedPtr([usize; 2]);

/// `c10::Error::Error(std::string msg, Backtrace backtrace, const void* caller)`; the by-value
/// class arguments are passed as pointers to caller-owned temporaries (Itanium C++ ABI).
type ErrorCtor =
    unsafe extern "C-unwind" fn(*mut c_void, *mut StdString, *mut EmptySharedPtr, *const c_void);
/// `std::string::basic_string(const char*, const std::allocator<char>&)`.
type StringCtor = unsafe extern "C-unwind" fn(*mut StdString, *const c_char, *const c_void);
/// `std::string::~basic_string()`.
type StringDtor = unsafe extern "C" fn(*mut StdString);

/// Bytes asked of `__cxa_allocate_exception`: `sizeof(c10::Error)` is 128 in PyTorch 2.x (a
/// vtable pointer, two strings, a vector, a shared_ptr, a lazy string and a pointer); more is
/// harmless, less would corrupt.
const EXCEPTION_OBJECT_BYTES: usize = 512;

struct C10 {
    construct: ErrorCtor,
    error_vtable: *const c_void,
    error_type: *const c_void,
    oom_vtable: *const c_void,
    oom_type: *const c_void,
    string_new: StringCtor,
    string_drop: StringDtor,
}

// SAFETY: addresses of functions and constant objects of loaded libraries that are never
// unloaded (nothing here calls dlclose).
unsafe impl Send for C10 {}
// SAFETY: as for Send: addresses of code and constants, only read.
unsafe impl Sync for C10 {}

const TORCH: [&CStr; 4] = [LIBC10, LIBC10_CUDA, LIBTORCH_CUDA, LIBTORCH_PYTHON];
const LIBSTDCXX: [&CStr; 1] = [c"libstdc++.so.6"];

/// The mangled name a `type_info` object carries (its second word, Itanium ABI).
///
/// # Safety
/// `type_info` must point to a `std::type_info` object.
unsafe fn type_name(type_info: *const c_void) -> &'static CStr {
    // SAFETY: a type_info is {vptr, const char* name}; the name is a NUL-terminated constant.
    unsafe { CStr::from_ptr(*(type_info as *const *const c_char).add(1)) }
}

/// The address point of a vtable symbol (past offset-to-top and type_info) and its type_info,
/// if the symbol's size is known and the vtable names `expected`.
fn vtable(symbol: &CStr, expected: &CStr) -> Option<(*const c_void, *const c_void, usize)> {
    let start = lookup::symbol(&TORCH, symbol)? as *const *const c_void;
    let bytes = lookup::symbol_size(start.cast())?;
    if bytes < 4 * std::mem::size_of::<usize>() {
        return None;
    }
    // SAFETY: the symbol spans `bytes` >= 32 bytes; word 1 is the class's type_info.
    let type_info = unsafe { *start.add(1) };
    // SAFETY: as above.
    (unsafe { type_name(type_info) } == expected)
        .then(|| (unsafe { start.add(2) }.cast(), type_info, bytes))
}

fn find() -> Option<C10> {
    let (error_vtable, error_type, error_bytes) = vtable(c"_ZTVN3c105ErrorE", c"N3c105ErrorE")?;
    let (oom_vtable, oom_type, oom_bytes) =
        vtable(c"_ZTVN3c1016OutOfMemoryErrorE", c"N3c1016OutOfMemoryErrorE")?;
    // OutOfMemoryError adds no virtual function and no member to Error (`using Error::Error`).
    if oom_bytes != error_bytes {
        return None;
    }
    // SAFETY: an __si_class_type_info is {vptr, name, base type_info*}.
    let oom_base = unsafe { *(oom_type as *const *const c_void).add(2) };
    // SAFETY: the base pointer of a single-inheritance type_info is a type_info.
    if unsafe { type_name(oom_base) } != unsafe { type_name(error_type) } {
        return None;
    }
    let construct = lookup::symbol(
        &[LIBC10],
        c"_ZN3c105ErrorC1ENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt10shared_ptrIKNS_9LazyValueIS6_EEEPKv",
    )?;
    let string_new = lookup::symbol(
        &LIBSTDCXX,
        c"_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC1EPKcRKS3_",
    )?;
    let string_drop = lookup::symbol(
        &LIBSTDCXX,
        c"_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev",
    )?;
    // SAFETY: each address is the named function, whose C++ signature the alias spells out in
    // the C calling convention (`this` first, by-value class arguments as pointers).
    unsafe {
        Some(C10 {
            construct: std::mem::transmute::<*mut c_void, ErrorCtor>(construct),
            error_vtable,
            error_type,
            oom_vtable,
            oom_type,
            string_new: std::mem::transmute::<*mut c_void, StringCtor>(string_new),
            string_drop: std::mem::transmute::<*mut c_void, StringDtor>(string_drop),
        })
    }
}

fn c10() -> Option<&'static C10> {
    static C10: Published<C10> = Published::new();
    C10.get_or_find(find)
}

/// True if PyTorch's exception types are available in this process.
pub(crate) fn available() -> bool {
    c10().is_some() && cxx_throw::runtime().is_some()
}

/// Destroys a thrown c10 exception through its virtual destructor (vtable slot 0, the
/// complete-object destructor), as `__cxa_throw` asks.
unsafe extern "C" fn destroy(object: *mut c_void) {
    // SAFETY: `object` is a c10::Error (or subclass) this module built; its first word is the
    // vtable address point, whose first slot is `~Error()` taking `this`.
    unsafe {
        let vtable = *(object as *const *const unsafe extern "C" fn(*mut c_void));
        (*vtable)(object)
    }
}

/// The kind of PyTorch exception to throw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `c10::OutOfMemoryError`: Python's `torch.OutOfMemoryError`.
    OutOfMemory,
    /// `c10::Error`: Python's `RuntimeError`.
    Error,
}

/// Throws a c10 exception of `kind` carrying `message`; returns only if PyTorch's types are not
/// available (then nothing was thrown).
///
/// # Safety
/// `message` must be a valid NUL-terminated string, and the caller's frames must be able to
/// unwind (`extern "C-unwind"`, nothing in them needing a drop).
pub(crate) unsafe fn throw(kind: Kind, message: *const c_char) {
    let (Some(c10), Some(rt)) = (c10(), cxx_throw::runtime()) else {
        return;
    };
    let (vtable, type_info) = match kind {
        Kind::OutOfMemory => (c10.oom_vtable, c10.oom_type),
        Kind::Error => (c10.error_vtable, c10.error_type),
    };
    let mut text = StdString([0; 32]);
    let mut no_backtrace = EmptySharedPtr([0; 2]);
    // std::allocator<char> is empty: any address serves as the object.
    let allocator_tag = 0u8;
    // SAFETY: `text` is storage for a std::string, built from a valid C string and destroyed
    // after the constructor moved from it; the exception object is fresh storage of at least
    // sizeof(c10::Error), built by Error's constructor, then given the vtable of `kind` (the
    // same layout: checked in `find`); __cxa_throw takes ownership with that class's type and a
    // destructor that dispatches through the vtable.
    unsafe {
        (c10.string_new)(&mut text, message, (&allocator_tag as *const u8).cast());
        let object = rt.allocate_exception_bytes(EXCEPTION_OBJECT_BYTES);
        (c10.construct)(object, &mut text, &mut no_backtrace, std::ptr::null());
        (c10.string_drop)(&mut text);
        *(object as *mut *const c_void) = vtable;
        rt.throw_object(object, type_info, destroy)
    }
}

/// Throws `error` to PyTorch: as `kind` where PyTorch's types are available, else as
/// `std::runtime_error`. The message is copied first (it is also this thread's last error).
///
/// # Safety
/// The caller's frames must be able to unwind (`extern "C-unwind"`, Rust frames between); their
/// locals are dropped on the way out.
pub(crate) unsafe fn throw_to_pytorch(kind: Kind, error: &crate::Error) -> ! {
    crate::api::set_last_error(error);
    // SAFETY: the last error is a valid C string; copied before anything can change it.
    let message = unsafe { CStr::from_ptr(crate::api::last_error_ptr()) }.to_owned();
    throw_message(kind, &message)
}

/// Throws `message` to PyTorch as [`throw_to_pytorch`] does.
///
/// # Safety
/// As [`throw_to_pytorch`].
pub(crate) unsafe fn throw_message(kind: Kind, message: &CStr) -> ! {
    // SAFETY: a valid C string, copied by the throw; as the caller promises.
    unsafe {
        throw(kind, message.as_ptr());
        crate::cxx_throw::throw_runtime_error(message.as_ptr())
    }
}

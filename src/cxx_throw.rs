//! Throws `std::runtime_error(message)` for `my_malloc` through the process's own C++ runtime.
//!
//! PyTorch catches what `my_malloc` throws and turns it into a Python `RuntimeError`; a NULL
//! return instead would poison the CUDA context. The catch only works if the exception comes from
//! the C++ runtime PyTorch itself uses (libstdc++): a `std::runtime_error` of another runtime (a
//! libc++ built in, say) has another type identity and unwinder, and every out-of-memory error
//! would end the process. So nothing C++ is compiled into this library: the five pieces of the
//! Itanium C++ ABI a throw needs are looked up at run time, all from one copy of libstdc++ —
//! the one already loaded in the process (`dlopen(.., RTLD_NOLOAD)`, which is how PyTorch's
//! private copy is found), else one visible to `dlsym(RTLD_DEFAULT, ..)`, else
//! `libstdc++.so.6` loaded now. The library then links only the C library and libgcc_s (for
//! unwinding): neither the build machine's libstdc++ (whose `GLIBCXX_` symbol versions would raise
//! the wheel's floor) nor a linker's own C++ runtime (zig's libc++) can end up in it.
//!
//! Invariant: the lookup is fork-safe — its result is published with one compare-and-swap, and a
//! thread that finds nothing published looks up itself (the lookup is idempotent), so a fork
//! child never waits for a lookup a thread of its parent had begun (a `OnceLock` would).

use crate::fork::{first_use_point, FirstUse, Published};
use std::ffi::{c_char, c_void, CStr};

/// `void* __cxa_allocate_exception(size_t)`.
type AllocateException = unsafe extern "C" fn(usize) -> *mut c_void;
/// `void __cxa_throw(void* object, std::type_info* type, void (*destructor)(void*))`.
type Throw = unsafe extern "C-unwind" fn(*mut c_void, *const c_void, Destructor) -> !;
/// `std::runtime_error::runtime_error(const char*)` (complete-object constructor, C++11).
type Construct = unsafe extern "C-unwind" fn(*mut c_void, *const c_char);
/// `std::runtime_error::~runtime_error()` (complete-object destructor), as `__cxa_throw` takes it.
pub(crate) type Destructor = unsafe extern "C" fn(*mut c_void);

/// Bytes asked of `__cxa_allocate_exception`. `sizeof(std::runtime_error)` is 16 in libstdc++
/// (a vtable pointer and a reference-counted string); more is harmless, less would corrupt.
const EXCEPTION_OBJECT_BYTES: usize = 64;

/// The symbols, mangled per the Itanium C++ ABI, in [`Runtime`]'s field order.
const SYMBOLS: [&CStr; 5] = [
    c"__cxa_allocate_exception",
    c"__cxa_throw",
    c"_ZTISt13runtime_error",
    c"_ZNSt13runtime_errorC1EPKc",
    c"_ZNSt13runtime_errorD1Ev",
];

/// The C++ runtime pieces a throw needs, all from one libstdc++.
pub(crate) struct Runtime {
    allocate_exception: AllocateException,
    throw: Throw,
    runtime_error_type: *const c_void,
    construct: Construct,
    destroy: Destructor,
}

// SAFETY: the fields are addresses of functions and of a constant type_info object in a loaded
// library that is never unloaded (this module never calls dlclose).
unsafe impl Send for Runtime {}
// SAFETY: as for Send: addresses of code and constants, only read.
unsafe impl Sync for Runtime {}

/// The five symbols from `handle`, or None if any is missing there.
fn resolve(handle: *mut c_void) -> Option<Runtime> {
    let mut found = [std::ptr::null_mut::<c_void>(); SYMBOLS.len()];
    for (slot, name) in found.iter_mut().zip(SYMBOLS) {
        // SAFETY: a valid handle (or RTLD_DEFAULT) and a NUL-terminated name.
        *slot = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if slot.is_null() {
            return None;
        }
    }
    // SAFETY: each address is the named libstdc++ function, whose C++ signature the type alias
    // spells out in the C calling convention (Itanium ABI: `this` is the first argument, and
    // constructors and destructors return nothing on x86-64 and aarch64).
    unsafe {
        Some(Runtime {
            allocate_exception: std::mem::transmute::<*mut c_void, AllocateException>(found[0]),
            throw: std::mem::transmute::<*mut c_void, Throw>(found[1]),
            runtime_error_type: found[2],
            construct: std::mem::transmute::<*mut c_void, Construct>(found[3]),
            destroy: std::mem::transmute::<*mut c_void, Destructor>(found[4]),
        })
    }
}

/// libstdc++ already loaded in the process (PyTorch's, loaded privately: `RTLD_NOLOAD` finds it
/// by its soname), else the symbols visible to the whole process, else libstdc++ loaded now.
fn find_runtime() -> Option<Runtime> {
    const LIBSTDCXX: &CStr = c"libstdc++.so.6";
    // SAFETY: dlopen with a NUL-terminated name; NULL (not loaded / not found) is checked.
    let loaded = unsafe { libc::dlopen(LIBSTDCXX.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if let Some(runtime) = (!loaded.is_null()).then(|| resolve(loaded)).flatten() {
        return Some(runtime);
    }
    if let Some(runtime) = resolve(libc::RTLD_DEFAULT) {
        return Some(runtime);
    }
    // SAFETY: as above.
    let loaded = unsafe { libc::dlopen(LIBSTDCXX.as_ptr(), libc::RTLD_LAZY) };
    (!loaded.is_null()).then(|| resolve(loaded)).flatten()
}

/// The runtime, looked up on first use ([`Published`]: a fork child never waits for a lookup that
/// a thread of the parent was in the middle of at the fork).
pub(crate) fn runtime() -> Option<&'static Runtime> {
    static RUNTIME: Published<Runtime> = Published::new();
    RUNTIME.get_or_find(|| {
        first_use_point(FirstUse::FindingCxxRuntime);
        find_runtime()
    })
}

impl Runtime {
    /// Exception storage of `bytes` from this runtime (`__cxa_allocate_exception`).
    ///
    /// # Safety
    /// The storage must be thrown with [`Runtime::throw_object`] (or leaked).
    pub(crate) unsafe fn allocate_exception_bytes(&self, bytes: usize) -> *mut c_void {
        // SAFETY: the runtime's own allocator; it aborts rather than return NULL.
        unsafe { (self.allocate_exception)(bytes) }
    }

    /// Throws `object` (storage from [`Runtime::allocate_exception_bytes`], constructed) as a
    /// C++ exception of type `type_info`, destroyed by `destroy` when caught and done with.
    ///
    /// # Safety
    /// As `__cxa_throw`: `type_info` is the object's `std::type_info` (or a base's), `destroy`
    /// its destructor; the caller's frames must be able to unwind.
    pub(crate) unsafe fn throw_object(
        &self,
        object: *mut c_void,
        type_info: *const c_void,
        destroy: Destructor,
    ) -> ! {
        // SAFETY: as the caller promises.
        unsafe { (self.throw)(object, type_info, destroy) }
    }
}

/// True if a C++ runtime to throw with is found (tests of the fork-safe lookup).
#[cfg(feature = "sim")]
pub fn cxx_runtime_found() -> bool {
    runtime().is_some()
}

/// Throws `std::runtime_error(message)` (the message is copied). Without libstdc++ there is no
/// way to throw: the message goes to stderr and the process aborts, as an uncaught exception
/// would end it.
///
/// # Safety
/// `message` must be a valid NUL-terminated string, and the caller's frames must be able to
/// unwind (`extern "C-unwind"`, nothing in them needing a drop).
pub unsafe fn throw_runtime_error(message: *const c_char) -> ! {
    let Some(rt) = runtime() else {
        // SAFETY: the caller passes a valid C string.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy();
        eprintln!("streampool: cannot throw a C++ exception (no libstdc++ in the process): {text}");
        std::process::abort();
    };
    // SAFETY: the object is fresh exception storage of at least sizeof(std::runtime_error);
    // the constructor copies `message`; __cxa_throw takes ownership of the object, with the
    // type and destructor of the same libstdc++.
    unsafe {
        let object = (rt.allocate_exception)(EXCEPTION_OBJECT_BYTES);
        (rt.construct)(object, message);
        (rt.throw)(object, rt.runtime_error_type, rt.destroy)
    }
}

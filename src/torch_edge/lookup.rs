//! Finding PyTorch's and the C++ runtime's symbols in the libraries the process has already
//! loaded, without linking either; what a lookup finds is published once
//! ([`crate::fork::Published`]).
//!
//! Invariants: nothing is loaded here (`RTLD_NOLOAD`): a symbol of a library PyTorch has not
//! loaded is absent, never pulled in; lookups are idempotent, so a thread that finds nothing
//! published may look up itself, and a fork child never waits for a lookup a thread of its parent
//! had begun.

use std::ffi::{c_void, CStr};

/// PyTorch's libraries that hold what this module looks for, by soname.
pub(crate) const LIBC10: &CStr = c"libc10.so";
pub(crate) const LIBC10_CUDA: &CStr = c"libc10_cuda.so";
pub(crate) const LIBTORCH_CUDA: &CStr = c"libtorch_cuda.so";
pub(crate) const LIBTORCH_PYTHON: &CStr = c"libtorch_python.so";

/// The handle of `library` if the process has loaded it (found by soname), else None.
fn loaded(library: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlopen with a NUL-terminated name and RTLD_NOLOAD loads nothing; NULL is checked.
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    (!handle.is_null()).then_some(handle)
}

/// The address of `name` in the first of `libraries` that is loaded and defines it, else in the
/// process's global scope; None if nowhere.
pub(crate) fn symbol(libraries: &[&CStr], name: &CStr) -> Option<*mut c_void> {
    let mut handles: Vec<*mut c_void> = libraries.iter().filter_map(|l| loaded(l)).collect();
    handles.push(libc::RTLD_DEFAULT);
    handles.into_iter().find_map(|handle| {
        // SAFETY: a handle from dlopen (or RTLD_DEFAULT) and a NUL-terminated name.
        let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
        (!address.is_null()).then_some(address)
    })
}

/// The C++ runtime, which PyTorch's libraries load.
const LIBSTDCXX: &CStr = c"libstdc++.so.6";

/// The process's `operator new(size_t)` as PyTorch's code binds it (so that PyTorch may free its
/// storage with `operator delete`): the global scope first (an allocator preloaded over it), else
/// the C++ runtime PyTorch's libraries loaded. Python loads them with `RTLD_LOCAL`, so without a
/// preload the C++ runtime is not in the global scope.
pub(crate) fn operator_new() -> Option<*mut c_void> {
    // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Znwm".as_ptr()) };
    match global.is_null() {
        false => Some(global),
        true => symbol(&[LIBTORCH_PYTHON, LIBC10, LIBSTDCXX], c"_Znwm"),
    }
}

/// `dladdr1`'s flag asking for the ELF symbol (glibc's `RTLD_DL_SYMENT`).
const RTLD_DL_SYMENT: libc::c_int = 1;

/// The size in bytes of the ELF symbol that starts exactly at `address`, if one does.
pub(crate) fn symbol_size(address: *const c_void) -> Option<usize> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut entry: *mut libc::Elf64_Sym = std::ptr::null_mut();
    // SAFETY: dladdr1 writes `info` and, with RTLD_DL_SYMENT, a pointer to the symbol table
    // entry into `entry`; both outputs are valid for writes.
    let found = unsafe {
        libc::dladdr1(
            address,
            info.as_mut_ptr(),
            (&mut entry as *mut *mut libc::Elf64_Sym).cast(),
            RTLD_DL_SYMENT,
        )
    };
    // SAFETY: dladdr1 returned non-zero, so `info` is written.
    let info = unsafe { info.assume_init() };
    if found == 0 || entry.is_null() || !std::ptr::eq(info.dli_saddr as *const c_void, address) {
        return None;
    }
    // SAFETY: a non-null entry of a loaded library's symbol table, which stays mapped.
    usize::try_from(unsafe { (*entry).st_size }).ok()
}

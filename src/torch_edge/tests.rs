//! The vtable patcher against a C++ class compiled now (tests/c/vtable_mock.cpp): slots found by
//! exported name and between exported names, one object repointed, the rest of the class left
//! alone, and refusals where the layout is not the expected one.

use super::lookup;
use super::vtable::{patch, slot_holds, Class, Replacement, SlotAt};
use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

type Make = unsafe extern "C" fn() -> *mut c_void;
type Call = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void);

const SONAME: &CStr = c"libstreampool_vtable_mock.so";

struct Mock {
    make: Make,
    call: Call,
    destroy: Destroy,
}

/// The mock library, compiled with the system's C++ compiler and loaded once.
fn mock() -> &'static Mock {
    static MOCK: OnceLock<Mock> = OnceLock::new();
    MOCK.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out = std::env::temp_dir().join(format!(
            "streampool-vtable-mock-{}/{}",
            std::process::id(),
            SONAME.to_str().unwrap()
        ));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let status = std::process::Command::new("c++")
            .arg(root.join("tests/c/vtable_mock.cpp"))
            .args(["-shared", "-fPIC", "-O1", "-fvisibility-inlines-hidden"])
            .arg(format!("-Wl,-soname,{}", SONAME.to_str().unwrap()))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("a C++ compiler");
        assert!(status.success());
        let path = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: loading a library we just built; kept loaded for the process.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        let sym = |name: &CStr| {
            // SAFETY: a valid handle and name; checked non-null.
            let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
            assert!(!f.is_null(), "{name:?}");
            f
        };
        // SAFETY: the mock's extern "C" functions with these signatures.
        unsafe {
            Mock {
                make: std::mem::transmute::<*mut c_void, Make>(sym(c"mock_make")),
                call: std::mem::transmute::<*mut c_void, Call>(sym(c"mock_call")),
                destroy: std::mem::transmute::<*mut c_void, Destroy>(sym(c"mock_destroy")),
            }
        }
    })
}

const IMPL: Class = Class {
    vtable: c"_ZTVN4mock4ImplE",
    type_name: c"N4mock4ImplE",
    libraries: &[SONAME],
};
const A: &CStr = c"_ZN4mock4Impl1aEv";
const B: &CStr = c"_ZN4mock4Impl1bEv";

unsafe extern "C" fn ours_b(_this: *mut c_void) -> c_int {
    20
}
unsafe extern "C" fn ours_hidden2(_this: *mut c_void) -> c_int {
    -20
}

fn replacements() -> Vec<Replacement> {
    vec![
        Replacement {
            feature: "b",
            at: SlotAt::Symbol(B),
            function: ours_b as *const c_void,
        },
        Replacement {
            feature: "hidden2",
            at: SlotAt::Between {
                anchor: A,
                offset: 2,
                closing: B,
                span: 3,
            },
            function: ours_hidden2 as *const c_void,
        },
    ]
}

#[test]
fn one_object_gets_the_replacements_and_the_class_keeps_its_methods() {
    let m = mock();
    // SAFETY: the mock's functions on objects it made.
    unsafe {
        let (patched, other) = ((m.make)(), (m.make)());
        let outcome = patch(patched, &IMPL, &replacements()).unwrap();
        assert_eq!(outcome.replaced, vec!["b", "hidden2"]);
        assert!(outcome.missing.is_empty());
        let calls = |o| (0..5).map(|w| (m.call)(o, w)).collect::<Vec<_>>();
        assert_eq!(calls(patched), vec![1, -1, -20, 20, 3]);
        assert_eq!(
            calls(other),
            vec![1, -1, -2, 2, 3],
            "another object changed"
        );
        // A second patch finds the object's vtable no longer the class's, and changes nothing.
        assert!(patch(patched, &IMPL, &replacements()).is_err());
        assert_eq!(calls(patched), vec![1, -1, -20, 20, 3]);
        (m.destroy)(patched); // through the copied vtable's destructor
        (m.destroy)(other);
    }
}

#[test]
fn a_slot_not_where_expected_is_reported_and_left_alone() {
    let m = mock();
    let mut wrong = replacements();
    // One virtual more or less between the anchors than expected: refused.
    wrong[1].at = SlotAt::Between {
        anchor: A,
        offset: 1,
        closing: B,
        span: 4,
    };
    wrong.push(Replacement {
        feature: "absent",
        at: SlotAt::Symbol(c"_ZN4mock4Impl7missingEv"),
        function: ours_b as *const c_void,
    });
    // SAFETY: as above.
    unsafe {
        let o = (m.make)();
        let outcome = patch(o, &IMPL, &wrong).unwrap();
        assert_eq!(outcome.replaced, vec!["b"]);
        let missing: Vec<&str> = outcome.missing.iter().map(|(f, _)| *f).collect();
        assert_eq!(missing, vec!["hidden2", "absent"]);
        assert_eq!((m.call)(o, 2), -2);
        assert_eq!((m.call)(o, 3), 20);
        (m.destroy)(o);
    }
}

#[test]
fn another_class_or_an_unknown_library_is_refused() {
    let m = mock();
    let not_impl = Class {
        type_name: c"N4mock4BaseE",
        ..IMPL
    };
    let elsewhere = Class {
        libraries: &[c"libnot_loaded_here.so"],
        vtable: c"_ZTVN4mock9ElsewhereE",
        ..IMPL
    };
    // SAFETY: as above.
    unsafe {
        let o = (m.make)();
        assert!(patch(o, &not_impl, &replacements()).is_err());
        assert!(patch(o, &elsewhere, &replacements()).is_err());
        assert_eq!((m.call)(o, 3), 2, "a refused patch changed the object");
        (m.destroy)(o);
    }
    // Address point: the two destructors, a, hidden1, hidden2, b, c.
    assert!(slot_holds(&IMPL, 2, A) && slot_holds(&IMPL, 5, B));
    assert!(!slot_holds(&IMPL, 3, A));
    assert!(lookup::symbol_size(lookup::symbol(&[SONAME], IMPL.vtable).unwrap()).is_some());
}

/// The C++ `operator new` is found where the C++ runtime is loaded only privately, as under
/// Python (which loads PyTorch with RTLD_LOCAL): here by the mock, loaded with RTLD_LOCAL.
#[test]
fn operator_new_is_found_in_a_privately_loaded_cxx_runtime() {
    let _ = mock();
    // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Znwm".as_ptr()) };
    assert!(
        global.is_null(),
        "this test binary has the C++ runtime in its global scope"
    );
    let path = std::ffi::CString::new(
        std::env::temp_dir()
            .join(format!(
                "streampool-vtable-mock-{}/{}",
                std::process::id(),
                SONAME.to_str().unwrap()
            ))
            .to_str()
            .unwrap(),
    )
    .unwrap();
    // SAFETY: the mock is loaded already (RTLD_NOLOAD); a valid name; checked non-null.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null());
    // SAFETY: a valid handle and name.
    let private = unsafe { libc::dlsym(handle, c"_Znwm".as_ptr()) };
    assert!(
        !private.is_null(),
        "the mock's C++ runtime defines operator new"
    );
    assert_eq!(lookup::operator_new(), Some(private));
}

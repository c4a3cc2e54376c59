//! Compiles small C and C++ programs against include/streampool.h, links the built cdylib and runs
//! them on the simulated driver: the exported ABI, the C++ exception from my_malloc, env errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// target/<profile>/, where libstreampool.so is. `cargo test` builds the library only as an
/// rlib for tests, so the cdylib is built here, once per test run, with the simulated driver.
fn lib_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let mut cargo = Command::new(env!("CARGO"));
            cargo.args([
                "build",
                "--lib",
                "--features",
                "sim",
                "--quiet",
                "--manifest-path",
            ]);
            cargo.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
            if cfg!(feature = "sim") {
                cargo.args(["--features", "sim"]);
            }
            if dir.ends_with("release") {
                cargo.arg("--release");
            }
            assert!(
                cargo.status().unwrap().success(),
                "cargo build --lib failed"
            );
            assert!(
                dir.join("libstreampool.so").exists(),
                "no libstreampool.so in {}",
                dir.display()
            );
            dir
        })
        .clone()
}

/// Builds `source` into an executable named after `test` (tests run in parallel).
fn build(test: &str, source: &str, compiler: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("streampool-{}-{test}", std::process::id()));
    let status = Command::new(compiler)
        .arg(root.join(source))
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(format!("-L{}", lib_dir().display()))
        .arg("-lstreampool")
        .status()
        .expect("a C/C++ compiler");
    assert!(status.success(), "compiling {source} failed");
    out
}

fn run(exe: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", lib_dir())
        .env("STREAMPOOL_DRIVER", "sim")
        .env_remove("STREAMPOOL_LOG")
        .env_remove("STREAMPOOL_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The functions include/streampool.h declares: the identifier before the `(` of each line that
/// starts a declaration at column 0 (cbindgen's layout; tests/header.rs keeps the header equal to
/// what cbindgen generates from src/ffi/).
fn header_functions() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/streampool.h")).unwrap();
    header
        .lines()
        .filter(|line| line.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter(|line| !line.starts_with("typedef") && !line.starts_with("enum"))
        .filter_map(|line| line.split_once('('))
        .map(|(before, _)| {
            let name = before.rsplit(|c: char| !c.is_ascii_alphanumeric() && c != '_');
            name.into_iter().next().unwrap_or_default().to_string()
        })
        .collect()
}

/// `source` without its `/* */` and `//` comments.
fn without_comments(source: &str) -> String {
    let mut out = String::new();
    let mut rest = source;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The program once called 18 of 31 exports. Every function the header declares must
/// be called by tests/c/abi_check.c (fails as soon as the header gains one it does not call), and
/// the header must declare every `#[no_mangle]` function of src/ffi/.
#[test]
fn c_program_calls_every_export() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let declared = header_functions();
    let exports: usize = std::fs::read_dir(root.join("src/ffi"))
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap())
        .map(|text| text.matches("#[no_mangle]").count())
        .sum();
    assert_eq!(
        declared.len(),
        exports,
        "the header's functions against src/ffi/'s exports: {declared:?}"
    );
    assert!(
        declared.iter().any(|f| f == "my_malloc") && declared.len() >= 32,
        "{declared:?}"
    );
    let program =
        without_comments(&std::fs::read_to_string(root.join("tests/c/abi_check.c")).unwrap());
    let uncalled: Vec<&String> = declared
        .iter()
        .filter(|f| {
            let called = program.match_indices(f.as_str()).any(|(i, _)| {
                let before = program[..i].chars().next_back();
                let after = program[i + f.len()..].trim_start();
                !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                    && after.starts_with('(')
            });
            !called
        })
        .collect();
    assert!(
        uncalled.is_empty(),
        "tests/c/abi_check.c does not call {uncalled:?}, declared in include/streampool.h"
    );
    let exe = build("abi", "tests/c/abi_check.c", "cc");
    // Both backends, and the default (vmm): page sharing needs the vmm backend's blocks.
    for backend in [None, Some("pool"), Some("vmm")] {
        let env: Vec<(&str, &str)> = backend
            .map(|b| ("STREAMPOOL_BACKEND", b))
            .into_iter()
            .collect();
        let out = run(&exe, &env);
        assert!(out.status.success(), "{backend:?}: {}", text(&out));
        assert!(text(&out).contains("c abi ok"));
    }
}

/// Found while migrating the tests to the new API: cbindgen wrote `MAX_ALLOCATION_BYTES` as
/// `(1 << 48)`, a shift of a 32-bit `int` by 48 in C (undefined behaviour). The header's constant
/// must be 2^48 in C.
#[test]
fn the_header_s_maximum_size_is_2_to_the_48_in_c() {
    let exe = build("max", "tests/c/max_size_check.c", "cc");
    let out = run(&exe, &[]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn my_malloc_throws_a_cpp_exception_instead_of_returning_null() {
    let exe = build("throw", "tests/c/throw_check.cpp", "c++");
    let out = run(&exe, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("caught: CUDA out of memory. Tried to allocate"));
}

#[test]
fn malformed_environment_is_reported_with_variable_value_and_accepted_forms() {
    let exe = build("env", "tests/c/throw_check.cpp", "c++");
    let out = run(&exe, &[("STREAMPOOL_RELEASE_THRESHOLD", "12XB")]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("STREAMPOOL_RELEASE_THRESHOLD=\"12XB\" is not valid: use a size such as"),
        "{t}"
    );
}

/// A value that is not UTF-8 text was taken for an unset variable: the `MAX_POOL_SIZE` cap was
/// dropped, a `STREAMPOOL_LOG` fell back to `RUST_LOG`. The program now fails at its first
/// allocation, naming the variable.
#[test]
fn environment_values_that_are_not_utf8_are_refused_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let exe = build("env-utf8", "tests/c/throw_check.cpp", "c++");
    for var in [
        "STREAMPOOL_MAX_POOL_SIZE",
        "STREAMPOOL_LOG",
        "STREAMPOOL_DRIVER",
    ] {
        let out = Command::new(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("STREAMPOOL_DRIVER", "sim")
            .env_remove("STREAMPOOL_LOG")
            .env(var, std::ffi::OsStr::from_bytes(b"1\xffGiB"))
            .output()
            .unwrap();
        let t = text(&out);
        assert!(!out.status.success(), "{var}: {t}");
        assert!(
            t.contains(&format!("{var}=\"1\u{fffd}GiB\" is not valid: use "))
                && t.contains("(not UTF-8 text"),
            "{var}: {t}"
        );
    }
}

#[test]
fn my_malloc_throws_through_a_cpp_runtime_the_process_loaded_privately() {
    // PyTorch's situation in Python: the host has no C++ runtime, libstdc++ comes in with a
    // library loaded RTLD_LOCAL, and so does libstreampool.so: my_malloc must find that copy.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = std::env::temp_dir().join(format!("streampool-{}-private", std::process::id()));
    let plugin = tmp.with_extension("so");
    let compiled = Command::new("c++")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&plugin)
        .arg(root.join("tests/c/private_runtime_plugin.cpp"))
        .status()
        .expect("a C++ compiler");
    assert!(compiled.success(), "compiling the plugin failed");
    let compiled = Command::new("cc")
        .arg(root.join("tests/c/private_runtime_host.c"))
        .args(["-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg("-ldl")
        .status()
        .expect("a C compiler");
    assert!(compiled.success(), "compiling the host failed");
    let mut cmd = Command::new(&tmp);
    cmd.arg(lib_dir().join("libstreampool.so")).arg(&plugin);
    let out = cmd
        .env("STREAMPOOL_DRIVER", "sim")
        .env("STREAMPOOL_LOG", "off")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("caught privately: CUDA out of memory."));
}

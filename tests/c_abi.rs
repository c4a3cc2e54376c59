//! Compiles small C and C++ programs against include/streampool.h, links the built cdylib and runs
//! them on the simulated driver: the exported ABI, the C++ exception from my_malloc, env errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// target/<profile>/, where libstreampool.so is. `cargo test` builds the library only as an
/// rlib for tests, so the cdylib is built here, once per test run.
fn lib_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let mut cargo = Command::new(env!("CARGO"));
            cargo.args(["build", "--lib", "--quiet", "--manifest-path"]);
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
        .env_remove("STREAMPOOL_LOG");
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

#[test]
fn c_program_calls_every_export() {
    let exe = build("abi", "tests/c/abi_check.c", "cc");
    let out = run(&exe, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("c abi ok"));
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
        t.contains("STREAMPOOL_RELEASE_THRESHOLD=\"12XB\" is not valid") && t.contains("accepted:"),
        "{t}"
    );
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

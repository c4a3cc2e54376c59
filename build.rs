//! Compiles the C++ shim that throws on errors in `my_malloc` (see src/oom.cpp).
fn main() {
    println!("cargo:rerun-if-changed=src/oom.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/oom.cpp")
        .flag_if_supported("-std=c++17")
        .compile("streampool_oom");
}

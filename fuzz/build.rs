//! Compiles the C++ shim the C-ABI fuzz target catches my_malloc's exceptions with.
fn main() {
    println!("cargo:rerun-if-changed=shim/catch_my_malloc.cpp");
    cc::Build::new()
        .cpp(true)
        .file("shim/catch_my_malloc.cpp")
        .compile("catch_my_malloc");
}

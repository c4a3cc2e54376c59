//! The committed C header matches what cbindgen generates from the current exports.

use std::path::Path;

#[test]
fn header_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::generate_with_config(root, config)
        .expect("cbindgen")
        .write(&mut generated);
    let path = root.join("include/streampool.h");
    if std::env::var_os("STREAMPOOL_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/streampool.h is stale: run STREAMPOOL_BLESS=1 cargo test --test header"
    );
}

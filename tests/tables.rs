//! The tables written in more than one place agree: the `STREAMPOOL_*` variables and their
//! defaults (the configuration's parser, python/streampool/_config.py, the README, docs/abi.md)
//! and the C functions (include/streampool.h, docs/abi.md). Status codes, statistics fields and timeline
//! kinds are checked between the header and Python by python/tests/test_header.py, and between
//! Rust and the header by tests/header.rs.

use std::collections::BTreeSet;
use std::path::Path;
use streampool::Config;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `STREAMPOOL_[A-Z_]+` name in `text`.
fn variables_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("STREAMPOOL_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].trim_end_matches('_');
        if name.len() > "STREAMPOOL".len() {
            out.insert(name.to_string()); // not the `STREAMPOOL_*` of prose
        }
        rest = &tail[end..];
    }
    out
}

/// (variable, default text) of `VARIABLE_DEFAULTS` in _config.py.
fn python_defaults() -> Vec<(String, String)> {
    let text = read("python/streampool/_config.py");
    let start = text.find("VARIABLE_DEFAULTS").expect("VARIABLE_DEFAULTS");
    let body = &text[start..text[start..].find('}').expect("end of the dict") + start];
    body.lines()
        .filter_map(|line| {
            let mut parts = line.trim().trim_end_matches(',').split("\": \"");
            let name = parts.next()?.trim_start_matches('"');
            let value = parts.next()?.trim_end_matches('"');
            name.starts_with("STREAMPOOL_")
                .then(|| (name.to_string(), value.to_string()))
        })
        .collect()
}

/// The variables the library reads: those its configuration's parser asks for (STREAMPOOL_LOG,
/// which api.rs also reads for the logger, among them).
fn library_variables() -> BTreeSet<String> {
    streampool::config::names::configuration_variables()
        .into_iter()
        .collect()
}

#[test]
fn python_lists_every_variable_the_library_reads_and_no_other() {
    let python: BTreeSet<String> = python_defaults().into_iter().map(|(n, _)| n).collect();
    assert_eq!(python, library_variables());
}

#[test]
fn python_s_documented_defaults_are_the_library_s_defaults() {
    for (name, text) in python_defaults() {
        if name == "STREAMPOOL_LOG" || text.starts_with("driver default") {
            continue; // not part of Config / left to the driver (checked below)
        }
        let parsed = Config::from_lookup(|k| (k == name).then(|| text.clone()))
            .unwrap_or_else(|e| panic!("{name}={text:?}: {e}"));
        assert_eq!(
            parsed,
            Config::default(),
            "{name}: documented default {text:?}"
        );
    }
    let reuse = Config::default().reuse;
    assert_eq!(
        (
            reuse.follow_event_dependencies,
            reuse.allow_opportunistic,
            reuse.allow_internal_dependencies
        ),
        (None, None, None),
        "the reuse policies default to the driver's"
    );
}

#[test]
fn the_readme_and_the_abi_document_every_variable() {
    let wanted = library_variables();
    for doc in ["README.md", "docs/abi.md"] {
        let documented = variables_in(&read(doc));
        let missing: Vec<_> = wanted.difference(&documented).collect();
        assert!(missing.is_empty(), "{doc} does not document {missing:?}");
    }
}

/// Names of the functions declared in `text` (`name(` preceded by a return type).
fn declared_functions(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('*') && !l.trim_start().starts_with("/*"))
        .filter_map(|l| {
            let open = l.find('(')?;
            let head = &l[..open];
            let name = head
                .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()?;
            let has_type = head.trim_end().len() > name.len();
            (has_type && (name.starts_with("streampool_") || name.starts_with("my_")))
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn docs_abi_declares_exactly_the_header_s_functions() {
    let header = declared_functions(&read("include/streampool.h"));
    let abi = read("docs/abi.md");
    let code = abi
        .split("```c")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a C block in docs/abi.md");
    assert!(header.len() > 20, "parsed too few functions: {header:?}");
    assert_eq!(declared_functions(code), header);
}

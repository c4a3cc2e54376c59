//! The defaults table against `Config::default`, the variables the parser reads, the Python
//! package's `VARIABLE_DEFAULTS` and the environment table of docs/abi.md.

use super::*;
use crate::config::{Config, ReusePolicy};
use std::collections::BTreeMap;
use std::path::Path;

fn table() -> BTreeMap<String, String> {
    DEFAULTS
        .iter()
        .map(|d| (d.var.to_string(), d.default.to_string()))
        .collect()
}

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_table_parses_to_the_rust_default_and_names_every_variable_read_once() {
    let value = |var: &str| {
        DEFAULTS
            .iter()
            .find(|d| d.var == var && d.is_value)
            .map(|d| d.default.to_string())
    };
    assert_eq!(Config::from_lookup(value).unwrap(), Config::default());
    assert_eq!(
        Config::default().reuse,
        ReusePolicy::default(),
        "the driver's"
    );
    let read = std::cell::RefCell::new(Vec::new());
    Config::from_lookup(|var| {
        read.borrow_mut().push(var.to_string());
        None
    })
    .unwrap();
    let mut read = read.into_inner();
    read.sort();
    read.dedup();
    let mut named: Vec<String> = DEFAULTS.iter().map(|d| d.var.to_string()).collect();
    named.sort();
    let count = named.len();
    named.dedup();
    assert_eq!(named.len(), count, "a variable named twice");
    assert_eq!(read, named);
}

#[test]
fn the_python_package_shows_the_same_defaults() {
    let text = read("python/streampool/_config.py");
    let start = text.find("VARIABLE_DEFAULTS").expect("VARIABLE_DEFAULTS");
    let block = &text[start..];
    let block = &block[..block.find('}').expect("the end of VARIABLE_DEFAULTS")];
    let python: BTreeMap<String, String> = block
        .lines()
        .filter_map(|line| {
            let (var, default) = line.trim().trim_end_matches(',').split_once(": ")?;
            let unquote = |s: &str| {
                s.trim()
                    .strip_prefix('"')?
                    .strip_suffix('"')
                    .map(String::from)
            };
            Some((unquote(var)?, unquote(default)?))
        })
        .collect();
    assert_eq!(python, table());
}

#[test]
fn the_abi_document_shows_the_same_defaults() {
    let text = read("docs/abi.md");
    let start = text.find("## Environment").expect("## Environment");
    let mut docs = BTreeMap::new();
    for row in text[start..]
        .lines()
        .filter(|l| l.starts_with("| STREAMPOOL_"))
    {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let (vars, default) = (cells[0], cells[cells.len() - 1]);
        // The value in code, `max` of "`max` (keep everything)"; else the cell's words.
        let default = match default.split('`').nth(1) {
            Some(code) => code,
            None => default,
        };
        for var in vars.split(|c: char| c == ',' || c.is_whitespace()) {
            if var.starts_with("STREAMPOOL_") {
                docs.insert(var.to_string(), default.to_string());
            }
        }
    }
    assert_eq!(docs, table());
}

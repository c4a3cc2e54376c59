//! docs/layout.md against the code: every file under `src/` is in one part of its table, no file
//! uses (names a `crate::` path into) a part that the page's rules say it never uses, `Config`
//! is read only in the files the page names, and blocks go back to their sources only where its
//! source-id rule says; and no source file is longer than the page allows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

struct Layout {
    /// (path, part): a file is in the part of the longest path that holds it.
    parts: Vec<(String, String)>,
    /// (part, part it never uses).
    never: BTreeSet<(String, String)>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The cells of the rows of the table under `heading`.
fn table_rows<'a>(text: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} in docs/layout.md"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect()
}

fn layout() -> Layout {
    let text = std::fs::read_to_string(root().join("docs/layout.md")).unwrap();
    let mut parts = Vec::new();
    for row in table_rows(&text, "## Parts") {
        for path in row[1].split(',').map(|p| p.trim().trim_matches('`')) {
            parts.push((path.to_string(), row[0].to_string()));
        }
    }
    let never = table_rows(&text, "## Rules")
        .into_iter()
        .map(|row| (row[0].to_string(), row[1].to_string()))
        .collect();
    Layout { parts, never }
}

impl Layout {
    /// The part of `path` (relative to the root, `/`-separated), if any. A module's file holds
    /// its folder too (`src/cache.rs`, `src/cache/tests.rs`).
    fn part_of(&self, path: &str) -> Option<&str> {
        let holds = |p: &str| {
            let folder = p.strip_suffix(".rs").map(|m| format!("{m}/"));
            path == p
                || (p.ends_with('/') && path.starts_with(p))
                || folder.is_some_and(|f| path.starts_with(&f))
        };
        self.parts
            .iter()
            .filter(|(p, _)| holds(p))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, part)| part.as_str())
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names through `crate::` paths (`use crate::a::b`, `crate::a::f()`,
/// `use crate::{a, b::c}`).
fn crate_modules(text: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        modules.insert(name);
                    }
                }
            }
            None => {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                modules.insert(name);
            }
        }
    }
    modules
}

/// The file or folder under `src/` of the top-level module `name`.
fn module_path(name: &str) -> Option<String> {
    let folder = format!("src/{name}/");
    if root().join(&folder).is_dir() {
        return Some(folder);
    }
    let file = format!("src/{name}.rs");
    root().join(&file).is_file().then_some(file)
}

/// (part, part used, file) for every file under `src/` that names another part.
fn uses(layout: &Layout) -> Vec<(String, String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut out = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let part = layout
            .part_of(&rel)
            .unwrap_or_else(|| panic!("{rel} is in no part of docs/layout.md"));
        let text = std::fs::read_to_string(&file).unwrap();
        // Code only: a comment's link (`[`crate::device`]`) is no use.
        let code: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for module in crate_modules(&code) {
            // Re-exports of lib.rs (`crate::Error`) and the like name no module.
            let Some(used) =
                module_path(&module).and_then(|p| layout.part_of(&p).map(String::from))
            else {
                continue;
            };
            if used != part {
                out.push((part.to_string(), used, rel.clone()));
            }
        }
    }
    out
}

#[test]
fn every_file_is_in_one_part_and_no_part_uses_one_it_never_may() {
    let layout = layout();
    assert!(
        layout.never.len() >= 5,
        "the rules table was not read: {:?}",
        layout.never
    );
    let known: BTreeSet<&str> = layout.parts.iter().map(|(_, part)| part.as_str()).collect();
    for (part, used) in &layout.never {
        assert!(
            known.contains(part.as_str()) && known.contains(used.as_str()),
            "a rule names a part the table of parts has not: {part} -> {used}"
        );
    }
    let broken: Vec<String> = uses(&layout)
        .into_iter()
        .filter(|(part, used, _)| layout.never.contains(&(part.clone(), used.clone())))
        .map(|(part, used, file)| format!("{file}: {part} uses {used}"))
        .collect();
    assert!(
        broken.is_empty(),
        "docs/layout.md's rules are broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_parts_are_listed_top_to_bottom() {
    let layout = layout();
    let order: Vec<&str> = {
        let mut seen = Vec::new();
        for (_, part) in &layout.parts {
            if !seen.contains(&part.as_str()) {
                seen.push(part.as_str());
            }
        }
        seen
    };
    let rank: BTreeMap<&str, usize> = order.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let upward: Vec<String> = uses(&layout)
        .into_iter()
        .filter(|(part, used, _)| rank[used.as_str()] < rank[part.as_str()])
        .map(|(part, used, file)| format!("{file}: {part} uses {used}, listed above it"))
        .collect();
    assert!(
        upward.is_empty(),
        "docs/layout.md lists a part below one it uses:\n{}",
        upward.join("\n")
    );
}

/// The `src/...` paths in backticks in the sentence of docs/layout.md that starts with `opening`
/// (up to its full stop).
fn paths_in_sentence(opening: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join("docs/layout.md")).unwrap();
    let start = text
        .find(opening)
        .unwrap_or_else(|| panic!("{opening:?} in docs/layout.md"));
    let sentence = &text[start..];
    let sentence = &sentence[..sentence.find(". ").unwrap_or(sentence.len())];
    let paths: Vec<String> = sentence
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.starts_with("src/"))
        .map(String::from)
        .collect();
    assert!(!paths.is_empty(), "no paths in {sentence:?}");
    paths
}

/// Every file under `src/` (relative, `/`-separated) with its code, comments stripped.
fn sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(root()).unwrap().to_string_lossy();
            let text = std::fs::read_to_string(&file).unwrap();
            let code: Vec<&str> = text
                .lines()
                .map(|line| line.split("//").next().unwrap_or(""))
                .collect();
            (rel.replace('\\', "/"), code.join("\n"))
        })
        .collect()
}

/// True if `path` is one of `allowed` or inside one of them (a folder ends in `/`).
fn inside(path: &str, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|a| path == a || (a.ends_with('/') && path.starts_with(a.as_str())))
}

/// The use tree or path at the start of `s`: up to the first character that cannot be in one,
/// or a `,`, `}` or space outside its braces.
fn tree(s: &str) -> &str {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return &s[..i],
            '}' => depth -= 1,
            ',' | ' ' if depth == 0 => return &s[..i],
            ' ' => {}
            c if c.is_alphanumeric() || "_:,*".contains(c) => {}
            _ => return &s[..i],
        }
    }
    s
}

/// The paths a use tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::").to_string()];
    };
    let (prefix, rest) = (&tree[..open], &tree[open + 1..]);
    let rest = rest.strip_suffix('}').unwrap_or(rest);
    let mut items = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&rest[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&rest[from..]);
    (items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty()))
    .flat_map(expand)
    .map(|path| format!("{prefix}{path}"))
    .collect()
}

/// True if `code` names the `Config` type of `crate::config`: through a `crate::` path or use
/// group (`crate::config::Config`, `crate::Config`, `use crate::{config::{Config, ..}}`), a glob
/// of the module, or a path from the module imported on its own (`config::Config`).
fn names_config(code: &str) -> bool {
    // Whitespace down to one space, and renames (`Config as C`) down to the name renamed.
    let mut words = Vec::new();
    let mut renamed = false;
    for word in code.split_whitespace() {
        match (word, renamed) {
            ("as", _) => renamed = true,
            (word, true) => {
                words.push(word.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
                renamed = false;
            }
            (word, false) => words.push(word),
        }
    }
    let code = words.join(" ");
    let is_config = |path: &str, prefix: &str| {
        let path = path.strip_prefix(prefix).unwrap_or("");
        path == "Config" || path.starts_with("Config::") || path == "*"
    };
    let after = |needle: &'static str| {
        let code = &code;
        code.match_indices(needle).filter_map(move |(i, _)| {
            let before = code[..i].chars().next_back();
            let word_start = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
            word_start.then(|| expand(tree(&code[i + needle.len()..])))
        })
    };
    let through_crate = after("crate::")
        .flatten()
        .any(|p| is_config(&p, "config::") || p == "Config" || p.starts_with("Config::"));
    let through_module = after("config::").flatten().any(|p| is_config(&p, ""));
    through_crate || through_module
}

#[test]
fn config_is_read_only_where_docs_layout_says() {
    let allowed = paths_in_sentence("`Config` itself is read only in");
    for (code, names) in [
        ("use crate::config::{Backend, Config};", true),
        ("let c = crate::config::Config::default();", true),
        ("use crate::{config::{self, Config as C}, error};", true),
        ("use crate::config::*;", true),
        ("use crate::config;\nfn f(c: &config::Config) {}", true),
        ("use crate::Config;", true),
        ("use crate::config::{Backend, Settings};", false),
        (
            "Error::Config { .. } | crate::error::Error::Config { .. }",
            false,
        ),
        ("use crate::config::ConfigError;", false),
    ] {
        assert_eq!(names_config(code), names, "names_config misreads {code:?}");
    }
    let broken: Vec<String> = sources()
        .into_iter()
        .filter(|(file, code)| !inside(file, &allowed) && names_config(code))
        .map(|(file, _)| file)
        .collect();
    assert!(
        broken.is_empty(),
        "Config is read outside {allowed:?} (docs/layout.md): {broken:?}"
    );
}

/// True if `code` names the process's environment readers (`std::env::var`, `var_os`, `vars`,
/// `vars_os`) through a path, a use group, or an import of `std::env` itself.
fn reads_environment(code: &str) -> bool {
    let code: String = code.split_whitespace().collect();
    code.contains("env::var") || code.contains("usestd::env;") || code.contains("usestd::env::{")
}

#[test]
fn the_environment_is_read_only_where_docs_layout_says() {
    let allowed = paths_in_sentence("The environment itself is read only in");
    for (code, reads) in [
        ("let v = std::env::var_os(\"STREAMPOOL_LOG\");", true),
        ("std::env::var (\"X\")", true),
        ("use std::env;\nenv::vars()", true),
        (
            "use std::{env::var_os, ffi::OsString};\nvar_os(\"X\")",
            true,
        ),
        ("let v = std::env::var::<&str>(\"X\");", true),
        ("use std::{env, fs};", false),
        ("let environment = 1;", false),
    ] {
        assert_eq!(
            reads_environment(code),
            reads,
            "reads_environment misreads {code:?}"
        );
    }
    let broken: Vec<String> = sources()
        .into_iter()
        .filter(|(file, code)| !inside(file, &allowed) && reads_environment(code))
        .map(|(file, _)| file)
        .collect();
    assert!(
        broken.is_empty(),
        "the environment is read outside {allowed:?} (docs/layout.md): {broken:?}"
    );
}

#[test]
fn blocks_go_back_to_their_source_only_where_docs_layout_says() {
    let allowed = paths_in_sentence("The source-id rule");
    let gives_back =
        |code: &str| code.contains(".deallocate(") || code.contains(".try_deallocate(");
    let mut broken: Vec<String> = sources()
        .into_iter()
        .filter(|(file, code)| {
            !file.starts_with("src/resource/") && !inside(file, &allowed) && gives_back(code)
        })
        .map(|(file, _)| format!("{file} gives a block back to a resource"))
        .collect();
    for (file, code) in sources() {
        if file.starts_with("src/resource/sources/") {
            continue;
        }
        for (i, _) in code.match_indices("enum ") {
            let name: String = (code[i + 5..].chars())
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.ends_with("Source") {
                broken.push(format!(
                    "{file}: enum {name} names a source outside the table"
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the source-id rule of docs/layout.md is broken:\n{}",
        broken.join("\n")
    );
}

/// The longest a source file may be (docs/layout.md, "Rules").
const MAX_SOURCE_LINES: usize = 525;

/// Every source file under `dir` (skipping `skip`, relative to the root): Rust, Python, C, shell
/// and the extension-less scripts.
fn source_files(dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let relative = path
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .to_string();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if skip.contains(&relative.as_str()) || name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        if path.is_dir() {
            source_files(&path, skip, out);
            continue;
        }
        let source = match path.extension().and_then(|e| e.to_str()) {
            Some(ext) => ["rs", "py", "c", "cpp", "h", "sh"].contains(&ext),
            None => relative.starts_with("scripts/") || relative.starts_with(".ci/"),
        };
        if source {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_longer_than_docs_layout_allows() {
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "bench", "python", "scripts", "fuzz", "examples", ".ci",
    ] {
        if root().join(dir).is_dir() {
            source_files(
                &root().join(dir),
                &["bench/results", "fuzz/target"],
                &mut files,
            );
        }
    }
    for entry in std::fs::read_dir(root()).unwrap() {
        let path = entry.unwrap().path(); // the files at the top (setup.py, build.rs)
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if path.is_file() && ["rs", "py", "sh"].contains(&ext) {
            files.push(path);
        }
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            let name = path.strip_prefix(root()).unwrap().display();
            (lines > MAX_SOURCE_LINES).then(|| format!("{name}: {lines} lines"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_SOURCE_LINES} lines (docs/layout.md): split where the parts separate\n{}",
        long.join("\n")
    );
}

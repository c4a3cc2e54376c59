//! docs/layout.md against the code: every file under `src/` is in one part of its table, and no
//! file uses (names a `crate::` path into) a part that the page's rules say it never uses.

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

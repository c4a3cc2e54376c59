//! Which `STREAMPOOL_*` names exist: the ones the configuration's parser reads (found by asking
//! the parser itself, so no second list can drift from it), the few read by other parts of
//! streampool, and the namespace of the project's test suites.
//!
//! Invariant: a `STREAMPOOL_*` variable in the environment that is none of these is refused, as
//! PyTorch refuses an unknown key of `PYTORCH_CUDA_ALLOC_CONF`, naming the closest known one:
//! a misspelt setting must not leave the default in force unnoticed.

use super::Config;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ffi::OsString;

/// The prefix of every variable streampool reads.
pub const PREFIX: &str = "STREAMPOOL_";

/// Variables read outside the library's configuration.
pub const READ_ELSEWHERE: [&str; 3] = [
    // The Python package: which libstreampool.so to load.
    "STREAMPOOL_LIBRARY",
    // setup.py: package this prebuilt library instead of building one with cargo.
    "STREAMPOOL_PREBUILT_LIBRARY",
    // tests/header.rs: write include/streampool.h instead of comparing it.
    "STREAMPOOL_BLESS",
];

/// Prefixes of the variables of the project's test suites (`STREAMPOOL_TEST_BACKEND`, ...).
pub const NAMESPACES: [&str; 1] = ["STREAMPOOL_TEST_"];

/// The variables the configuration's parser reads, in the order it reads them.
pub fn configuration_variables() -> Vec<String> {
    let asked = RefCell::new(Vec::<String>::new());
    // With nothing set every value is its default, so the parse succeeds having asked for all.
    let _ = Config::from_os_lookup(|name| {
        let mut asked = asked.borrow_mut();
        if !asked.iter().any(|known| known == name) {
            asked.push(name.to_string());
        }
        None
    });
    asked.into_inner()
}

/// Every known variable name: the configuration's, then those read elsewhere.
pub fn known_variables() -> Vec<String> {
    let mut names = configuration_variables();
    names.extend(READ_ELSEWHERE.iter().map(|n| n.to_string()));
    names
}

/// Refuses the first name among `names` that starts with [`PREFIX`] and is not known (see the
/// module's invariant); other names are not streampool's business.
pub(crate) fn check_names(names: impl IntoIterator<Item = OsString>) -> Result<()> {
    let known = known_variables();
    for name in names {
        let name = name.to_string_lossy();
        if !name.starts_with(PREFIX)
            || known.iter().any(|k| *k == name)
            || NAMESPACES.iter().any(|space| name.starts_with(space))
        {
            continue;
        }
        return Err(Error::UnknownVariable {
            closest: closest(&name, &known),
            name: name.into_owned(),
        });
    }
    Ok(())
}

/// The known name nearest to `name` by edit distance after the prefix (in capitals: known names
/// are), among those within a third of the known name's length (2 at least) or whose part after
/// the prefix contains `name`'s or is contained in it (3 characters at least); None if no name
/// is that close.
fn closest(name: &str, known: &[String]) -> Option<String> {
    let tail = name
        .strip_prefix(PREFIX)
        .unwrap_or(name)
        .to_ascii_uppercase();
    let tail = tail.as_str();
    let scored = known.iter().filter_map(|k| {
        let known_tail = k.strip_prefix(PREFIX).unwrap_or(k);
        let distance = edit_distance(tail, known_tail);
        let near = distance <= (known_tail.len() / 3).max(2);
        let nested = tail.len().min(known_tail.len()) >= 3
            && (known_tail.contains(tail) || tail.contains(known_tail));
        (near || nested).then_some((distance, k))
    });
    scored.min_by_key(|(d, _)| *d).map(|(_, k)| k.clone())
}

/// Levenshtein distance in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(names: &[&str]) -> Result<()> {
        check_names(names.iter().map(OsString::from))
    }

    #[test]
    fn the_parser_s_own_names_are_the_configuration_s() {
        let names = configuration_variables();
        for name in [
            "STREAMPOOL_DRIVER",
            "STREAMPOOL_RELEASE_THRESHOLD",
            "STREAMPOOL_LOG",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{name} missing from {names:?}"
            );
        }
        assert!(names.iter().all(|n| n.starts_with(PREFIX)));
        assert_eq!(
            check(&names.iter().map(String::as_str).collect::<Vec<_>>()),
            Ok(())
        );
    }

    #[test]
    fn a_misspelt_variable_is_refused_naming_the_closest() {
        let err = check(&["PATH", "STREAMPOOL_RELEASE_TRESHOLD"]).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownVariable {
                name: "STREAMPOOL_RELEASE_TRESHOLD".into(),
                closest: Some("STREAMPOOL_RELEASE_THRESHOLD".into()),
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("did you mean STREAMPOOL_RELEASE_THRESHOLD?"),
            "{text}"
        );
        assert!(!text.contains('\n'), "one line: {text}");
    }

    #[test]
    fn the_closest_name_is_the_nearest_one_or_none() {
        let known = known_variables();
        let near = |name: &str| closest(name, &known);
        for (name, nearest) in [
            ("STREAMPOOL_VMM_PAGESIZE", "STREAMPOOL_VMM_PAGE_SIZE"),
            ("STREAMPOOL_BACKEDN", "STREAMPOOL_BACKEND"),
            ("STREAMPOOL_THRESHOLD", "STREAMPOOL_RELEASE_THRESHOLD"),
            ("STREAMPOOL_LIBRARY_PATH", "STREAMPOOL_LIBRARY"),
            // Two candidates (LIBRARY one edit away, PREBUILT_LIBRARY containing the name): the
            // nearer.
            ("STREAMPOOL_LIBRAR", "STREAMPOOL_LIBRARY"),
            // In small letters (environment names are case-sensitive: it would be ignored).
            ("STREAMPOOL_backend", "STREAMPOOL_BACKEND"),
            (
                "STREAMPOOL_Release_Threshold",
                "STREAMPOOL_RELEASE_THRESHOLD",
            ),
        ] {
            assert_eq!(near(name).as_deref(), Some(nearest), "{name}");
        }
        assert_eq!(near("STREAMPOOL_COLOUR"), None);
        let err = check(&["STREAMPOOL_COLOUR"]).unwrap_err().to_string();
        assert!(err.starts_with("STREAMPOOL_COLOUR is set, but streampool has no such variable"));
        assert!(!err.contains("did you mean"), "{err}");
    }

    #[test]
    fn names_read_elsewhere_and_the_test_namespace_pass_others_are_not_ours() {
        assert_eq!(
            check(&[
                "STREAMPOOL_LIBRARY",
                "STREAMPOOL_PREBUILT_LIBRARY",
                "STREAMPOOL_BLESS",
                "STREAMPOOL_TEST_BACKEND",
                "_STREAMPOOL_COMPARE_OUT",
                "streampool_backend",
                "RUST_LOG",
            ]),
            Ok(())
        );
        assert!(
            check(&["STREAMPOOL_TESTS"]).is_err(),
            "only the namespace passes"
        );
        assert!(check(&["STREAMPOOL_"]).is_err());
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "ab"), 1);
        assert_eq!(edit_distance("ab", "abc"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "four"), 4);
    }
}

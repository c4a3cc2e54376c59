//! The logger's filter: `STREAMPOOL_LOG`, else `RUST_LOG`, else warnings only ([`LOG_DEFAULT`]).
//!
//! Invariant: a malformed `STREAMPOOL_LOG` — not UTF-8 text included — is reported by the
//! configuration (the first allocation fails naming it, [`super::Config::from_env`]); the logger
//! then keeps to warnings, rather than fall back to `RUST_LOG` or have env_logger print its own
//! line about the same value.

use super::{validate_log_filter, LOG_DEFAULT};
use std::ffi::OsString;

/// The filter the process's environment asks for (see the module's notes).
pub fn log_filter() -> String {
    filter_from(
        std::env::var_os("STREAMPOOL_LOG"),
        std::env::var_os("RUST_LOG"),
    )
}

/// The filter from the values of `STREAMPOOL_LOG` and `RUST_LOG`.
fn filter_from(streampool_log: Option<OsString>, rust_log: Option<OsString>) -> String {
    match streampool_log.map(OsString::into_string) {
        Some(Ok(spec)) if validate_log_filter(&spec).is_ok() => spec,
        Some(_) => LOG_DEFAULT.into(),
        None => rust_log
            .and_then(|v| v.into_string().ok())
            .unwrap_or_else(|| LOG_DEFAULT.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn os(text: &str) -> Option<OsString> {
        Some(text.into())
    }

    /// A `STREAMPOOL_LOG` that is not UTF-8 text fell back to `RUST_LOG` (`env::var` failed as if
    /// it were unset): it is malformed, and the logger keeps to warnings.
    #[test]
    fn the_log_filter_falls_back_to_rust_log_only_when_streampool_log_is_unset() {
        let not_utf8 = Some(OsString::from_vec(b"streampool=\xff".to_vec()));
        assert_eq!(filter_from(os("info"), os("trace")), "info");
        assert_eq!(filter_from(os("loud"), os("trace")), "warn", "malformed");
        assert_eq!(
            filter_from(not_utf8.clone(), os("trace")),
            "warn",
            "not UTF-8"
        );
        assert_eq!(filter_from(None, os("trace")), "trace");
        assert_eq!(filter_from(None, not_utf8), "warn");
        assert_eq!(filter_from(None, None), "warn");
    }
}

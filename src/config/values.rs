//! How a variable's text becomes a value, and the error naming the variable, the value and what
//! it accepts: booleans, whole percentages, durations, `STREAMPOOL_LOG`'s filter, and each
//! variable's accepted forms, short, the fix before the reason (`{var}="…" is not valid: use …
//! (why)`).
//!
//! Invariant: a variable's every refusal lists the same accepted forms, and lists only forms the
//! parser accepts.

use crate::error::{Error, Result};
use crate::units::SIZE_ACCEPTED;
use std::ffi::OsString;

// What each variable accepts, for its error message: short, and only what is accepted.
const BOOL_ACCEPTED: &str = "1, 0, true, false, yes, no, on or off";
pub(super) const PEER_ACCESS_ACCEPTED: &str = "auto, 1, 0, true, false, yes, no, on or off";
/// The simulated driver's devices (`STREAMPOOL_SIM_DEVICES`).
pub(super) const SIM_DEVICES: std::ops::RangeInclusive<usize> = 1..=64;
pub(super) const SIM_DEVICES_ACCEPTED: &str = "a whole number from 1 to 64";
pub(super) const SIM_MEMORY_ACCEPTED: &str = "a size up to 1TiB, such as 16GiB or 512MiB";
pub(super) const HEADROOM_ACCEPTED: &str =
    "a size below the device's memory such as 512MiB or 0, or a share of it below 100% such as 2%";
pub(crate) const VMM_PAGE_SIZE_ACCEPTED: &str = "a size such as 2MiB or 20MiB, at most 1 TiB";
pub(super) const VMM_SPAN_SIZE_ACCEPTED: &str =
    "auto, a size such as 32MiB (at most 1 TiB), or 0 (every physical handle one page)";

/// What a variable accepts, for the error about a value that is not UTF-8 text.
fn accepted(var: &str) -> &'static str {
    match var {
        "STREAMPOOL_DRIVER" => "cuda or sim",
        "STREAMPOOL_BACKEND" => super::BACKEND_ACCEPTED,
        "STREAMPOOL_VMM_PAGE_SIZE" => VMM_PAGE_SIZE_ACCEPTED,
        "STREAMPOOL_VMM_SPAN_SIZE" => VMM_SPAN_SIZE_ACCEPTED,
        "STREAMPOOL_PEER_ACCESS" => PEER_ACCESS_ACCEPTED,
        "STREAMPOOL_SIM_DEVICES" => SIM_DEVICES_ACCEPTED,
        "STREAMPOOL_SIM_MEMORY" => SIM_MEMORY_ACCEPTED,
        "STREAMPOOL_VMM_HEADROOM" => HEADROOM_ACCEPTED,
        "STREAMPOOL_IDLE_RELEASE" | "STREAMPOOL_VMM_COLD_AFTER" => DURATION_ACCEPTED,
        "STREAMPOOL_VMM_GROWTH_SLACK" => PERCENT_ACCEPTED,
        "STREAMPOOL_LOG" => LOG_ACCEPTED,
        "STREAMPOOL_TRIM_ON_GROWTH"
        | "STREAMPOOL_IPC"
        | "STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES"
        | "STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC"
        | "STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES" => BOOL_ACCEPTED,
        _ => SIZE_ACCEPTED,
    }
}

/// `value` of `var` as text, or the error naming it if it is not UTF-8.
pub(crate) fn utf8_value(var: &'static str, value: OsString) -> Result<String> {
    value.into_string().map_err(|raw| {
        let lossy = raw.to_string_lossy().into_owned();
        let bytes = raw.as_encoded_bytes();
        let at = std::str::from_utf8(bytes)
            .err()
            .map_or(0, |e| e.valid_up_to());
        config_error(
            var,
            &lossy,
            &format!("not UTF-8 text: byte {:#04x} at offset {at}", bytes[at]),
            accepted(var),
        )
    })
}

const PERCENT_ACCEPTED: &str = "a whole percentage from 0% to 1000% such as 5%, or off";

/// A whole percentage; `None` for off.
pub(super) fn parse_percent(name: &'static str, value: &str) -> Result<Option<u64>> {
    let v = value.trim().to_ascii_lowercase();
    if v == "off" {
        return Ok(None);
    }
    let refuse = |reason: &str| config_error(name, value, reason, PERCENT_ACCEPTED);
    match v.strip_suffix('%').map(|n| n.trim().parse::<u64>()) {
        Some(Ok(n)) if n <= 1000 => Ok(Some(n)),
        Some(Ok(_)) => Err(refuse("more than 1000%")),
        Some(Err(_)) => Err(refuse("not a whole percentage")),
        None => Err(refuse("no % sign")),
    }
}

const DURATION_ACCEPTED: &str = "a duration such as 250ms, 2s or 1.5s, or off";

/// A duration in milliseconds, a day at most; `None` for off.
pub(super) fn parse_duration_ms(name: &'static str, value: &str) -> Result<Option<u64>> {
    let v = value.trim().to_ascii_lowercase();
    if matches!(v.as_str(), "off" | "never" | "0") {
        return Ok(None);
    }
    let refuse = |reason: &str| config_error(name, value, reason, DURATION_ACCEPTED);
    let (number, scale_ms) = match (v.strip_suffix("ms"), v.strip_suffix('s')) {
        (Some(n), _) => (n, 1.0),
        (None, Some(n)) => (n, 1000.0),
        (None, None) => return Err(refuse("no unit")),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n * scale_ms <= 86_400_000.0 => {
            Ok(Some(((n * scale_ms).round() as u64).max(1)))
        }
        Ok(n) if n.is_finite() && n > 0.0 => Err(refuse("more than a day")),
        Ok(_) => Err(refuse("not a positive duration")),
        Err(_) => Err(refuse(&format!("{:?} is not a number", number.trim()))),
    }
}

pub(super) fn parse_bool(name: &'static str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(config_error(name, value, "not a boolean", BOOL_ACCEPTED)),
    }
}

const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
const LOG_ACCEPTED: &str = "off, error, warn, info, debug, trace or streampool[::MODULE]=LEVEL";

/// Accepts what `STREAMPOOL_LOG` can mean for streampool's own log lines: a level, a module of
/// streampool (`streampool`, `streampool::device`) with or without `=level`, comma-separated.
/// A bare word that is neither (`verbose`) would be read by env_logger as a module name that
/// logs nothing, silencing every warning, so it is refused; so are other crates' modules.
pub(crate) fn validate_log_filter(value: &str) -> Result<()> {
    let is_level = |word: &str| LOG_LEVELS.contains(&word.trim().to_ascii_lowercase().as_str());
    let is_ours = |module: &str| {
        let module = module.trim();
        module == "streampool"
            || module.strip_prefix("streampool::").is_some_and(|rest| {
                !rest.is_empty()
                    && rest.split("::").all(|part| {
                        !part.is_empty()
                            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
            })
    };
    let mut directives = (value.split(',').map(str::trim)).filter(|d| !d.is_empty());
    // No directive at all ("", ","): env_logger would read it as errors only, silencing every
    // warning.
    let Some(first) = directives.next() else {
        return Err(config_error(
            "STREAMPOOL_LOG",
            value,
            "empty: no level or module",
            LOG_ACCEPTED,
        ));
    };
    let bad = std::iter::once(first).chain(directives).find(|directive| {
        match directive.split_once('=') {
            Some((module, level)) => !(is_ours(module) && is_level(level)),
            None => !(is_level(directive) || is_ours(directive)),
        }
    });
    match bad {
        None => Ok(()),
        Some(directive) if directive == value.trim() => Err(config_error(
            "STREAMPOOL_LOG",
            value,
            "not a level or a streampool module",
            LOG_ACCEPTED,
        )),
        Some(directive) => Err(config_error(
            "STREAMPOOL_LOG",
            value,
            &format!("{directive:?} is not a level or a streampool module"),
            LOG_ACCEPTED,
        )),
    }
}

pub(crate) fn config_error(
    var: &'static str,
    value: &str,
    reason: &str,
    accepted: &'static str,
) -> Error {
    Error::Config {
        var,
        value: value.to_string(),
        reason: reason.to_string(),
        accepted,
    }
}

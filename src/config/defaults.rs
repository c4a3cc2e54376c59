//! The default of every `STREAMPOOL_*` variable, in one table: [`Config::default`](super::Config), the Python
//! package's `VARIABLE_DEFAULTS` (python/streampool/_config.py) and the environment table of
//! docs/abi.md are checked against it (the tests below read the other two files).
//!
//! Invariant: the table names every variable the configuration reads, once, with its default as
//! a user would write it (or, for a default that is no value of the variable, as the docs say
//! it), and that default parses to what `Config::default` holds.

/// One variable's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VariableDefault {
    pub var: &'static str,
    /// As the docs and the Python package show it.
    pub default: &'static str,
    /// The default is a value of the variable (not, say, the driver's own choice).
    pub is_value: bool,
}

/// The logger's filter when neither `STREAMPOOL_LOG` nor `RUST_LOG` says otherwise.
pub const LOG_DEFAULT: &str = "warn";

const fn value(var: &'static str, default: &'static str) -> VariableDefault {
    VariableDefault {
        var,
        default,
        is_value: true,
    }
}

const DRIVER_DEFAULT: &str = "driver default (on)";

const fn driver_default(var: &'static str) -> VariableDefault {
    VariableDefault {
        var,
        default: DRIVER_DEFAULT,
        is_value: false,
    }
}

/// Every variable the configuration reads, with its default (the reasons for each value are
/// beside [`Config::default`](super::Config)).
pub const DEFAULTS: &[VariableDefault] = &[
    value("STREAMPOOL_DRIVER", "cuda"),
    value("STREAMPOOL_BACKEND", "vmm"),
    value("STREAMPOOL_VMM_PAGE_SIZE", "2MiB"),
    value("STREAMPOOL_VMM_SPAN_SIZE", "auto"),
    value("STREAMPOOL_VMM_COLD_AFTER", "off"),
    value("STREAMPOOL_VMM_GROWTH_SLACK", "off"),
    value("STREAMPOOL_VMM_HEADROOM", "1%"),
    value("STREAMPOOL_IDLE_RELEASE", "2s"),
    value("STREAMPOOL_RELEASE_THRESHOLD", "max"),
    value("STREAMPOOL_MAX_POOL_SIZE", "max"),
    value("STREAMPOOL_CACHE_LIMIT", "64MiB"),
    value("STREAMPOOL_CACHE_MAX_BLOCK", "max"),
    value("STREAMPOOL_SMALL_POOL_MAX", "1MiB"),
    value("STREAMPOOL_TRIM_ON_GROWTH", "1"),
    value("STREAMPOOL_PEER_ACCESS", "auto"),
    value("STREAMPOOL_IPC", "0"),
    driver_default("STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES"),
    driver_default("STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC"),
    driver_default("STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES"),
    value("STREAMPOOL_LOG", LOG_DEFAULT),
    value("STREAMPOOL_SIM_DEVICES", "2"),
    value("STREAMPOOL_SIM_MEMORY", "16GiB"),
];

#[cfg(test)]
mod tests;

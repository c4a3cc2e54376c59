//! Parsing of every `STREAMPOOL_*` variable: accepted values, and the message for each malformed one.

use super::*;
use crate::error::Error;
use std::collections::HashMap;

fn parse(pairs: &[(&str, &str)]) -> Result<Config> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn every_backend_parses_from_its_name_and_the_error_lists_them_all() {
    for backend in Backend::ALL {
        let upper = backend.name().to_ascii_uppercase();
        let c = parse(&[("STREAMPOOL_BACKEND", &upper)]).unwrap();
        assert_eq!(c.backend, backend);
    }
    let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
    assert_eq!(BACKEND_ACCEPTED, names.join(", "));
    let e = parse(&[("STREAMPOOL_BACKEND", "host")]).unwrap_err();
    assert!(e.to_string().contains(BACKEND_ACCEPTED), "{e}");
}

#[test]
fn defaults_keep_everything() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.driver, DriverKind::Cuda);
    assert_eq!(c.backend, Backend::Vmm);
    assert_eq!(c.release_threshold, SizeSpec::Max);
    assert_eq!(c.reuse, ReusePolicy::default());
}

#[test]
fn parses_every_variable() {
    let c = parse(&[
        ("STREAMPOOL_DRIVER", "sim"),
        ("STREAMPOOL_RELEASE_THRESHOLD", "8GiB"),
        ("STREAMPOOL_MAX_POOL_SIZE", "80%"),
        ("STREAMPOOL_CACHE_LIMIT", "1GiB"),
        ("STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC", "off"),
        ("STREAMPOOL_SIM_DEVICES", "3"),
        ("STREAMPOOL_SIM_MEMORY", "1GiB"),
        ("STREAMPOOL_LOG", "streampool=trace"),
        ("STREAMPOOL_PEER_ACCESS", "on"),
        ("STREAMPOOL_IPC", "yes"),
        ("STREAMPOOL_BACKEND", " VMM"),
        ("STREAMPOOL_VMM_PAGE_SIZE", "20MiB"),
        ("STREAMPOOL_IDLE_RELEASE", "1.5s"),
        ("STREAMPOOL_VMM_COLD_AFTER", "40ms"),
    ])
    .unwrap();
    assert_eq!(c.idle_release_ms, Some(1500));
    assert_eq!(c.vmm_cold_after_ms, 40);
    let off = parse(&[
        ("STREAMPOOL_IDLE_RELEASE", "off"),
        ("STREAMPOOL_VMM_COLD_AFTER", "never"),
    ])
    .unwrap();
    assert_eq!(
        (off.idle_release_ms, off.vmm_cold_after_ms),
        (None, u64::MAX)
    );
    assert_eq!(c.driver, DriverKind::Sim);
    assert_eq!(c.backend, Backend::Vmm);
    assert_eq!(c.vmm_page_size, SizeSpec::Bytes(20 << 20));
    assert_eq!(c.release_threshold, SizeSpec::Bytes(8 << 30));
    assert_eq!(c.max_pool_size, SizeSpec::Percent(80.0));
    assert_eq!(c.reuse.allow_opportunistic, Some(false));
    assert_eq!(c.reuse.follow_event_dependencies, None);
    assert_eq!((c.sim_devices, c.sim_memory_bytes), (3, 1 << 30));
    assert_eq!(c.peer_access, PeerAccess::On);
    assert!(c.ipc);
    let auto = parse(&[("STREAMPOOL_PEER_ACCESS", " Auto ")]).unwrap();
    assert_eq!(auto.peer_access, PeerAccess::Auto);
}

#[test]
fn malformed_values_name_variable_value_and_accepted_forms() {
    for (var, value) in [
        ("STREAMPOOL_DRIVER", "gpu"),
        ("STREAMPOOL_RELEASE_THRESHOLD", "12XB"),
        ("STREAMPOOL_MAX_POOL_SIZE", "lots"),
        ("STREAMPOOL_CACHE_LIMIT", "150%"),
        ("STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES", "maybe"),
        ("STREAMPOOL_SIM_DEVICES", "0"),
        ("STREAMPOOL_SIM_MEMORY", "0"),
        ("STREAMPOOL_LOG", "streampool=loud"),
        ("STREAMPOOL_PEER_ACCESS", "sometimes"),
        ("STREAMPOOL_IPC", "2"),
        ("STREAMPOOL_SMALL_POOL_MAX", "1MiBs"),
        ("STREAMPOOL_BACKEND", "expandable"),
        ("STREAMPOOL_VMM_PAGE_SIZE", "0"),
        ("STREAMPOOL_VMM_PAGE_SIZE", "50%"),
        ("STREAMPOOL_IDLE_RELEASE", "2"),
        ("STREAMPOOL_IDLE_RELEASE", "-1s"),
        ("STREAMPOOL_IDLE_RELEASE", "2days"),
        ("STREAMPOOL_IDLE_RELEASE", "90000s"),
        ("STREAMPOOL_VMM_COLD_AFTER", "fast"),
        ("STREAMPOOL_VMM_GROWTH_SLACK", "5"),
        ("STREAMPOOL_VMM_GROWTH_SLACK", "2000%"),
    ] {
        let msg = parse(&[(var, value)]).unwrap_err().to_string();
        // the variable and the value, then the fix, then why; one short line (they were ~250
        // characters, the accepted forms last)
        assert!(
            msg.starts_with(&format!("{var}={value:?} is not valid: use ")),
            "{msg}"
        );
        assert!(msg.len() <= 160, "{} characters: {msg}", msg.len());
    }
}

/// The messages of issue 42, each as a user met it.
#[test]
fn a_percentage_of_simulated_memory_is_refused_listing_only_what_is_accepted() {
    // It said "must be a positive byte count", then listed percentages as accepted.
    let msg = parse(&[("STREAMPOOL_SIM_MEMORY", "80%")])
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "STREAMPOOL_SIM_MEMORY=\"80%\" is not valid: use a size up to 1TiB, such as 16GiB or \
         512MiB (this sets the device's memory: a share of it means nothing)"
    );
    // Past 1TiB the devices' addresses would overlap.
    let huge = parse(&[("STREAMPOOL_SIM_MEMORY", "1025GiB")]).unwrap_err();
    assert!(huge.to_string().contains("at most 1TiB"), "{huge}");
    assert_eq!(
        parse(&[("STREAMPOOL_SIM_MEMORY", "1TiB")])
            .unwrap()
            .sim_memory_bytes,
        1 << 40
    );
    let max = parse(&[("STREAMPOOL_SIM_MEMORY", "max")]).unwrap_err();
    assert!(!max.to_string().contains('%'), "{max}");
}

#[test]
fn too_many_simulated_devices_is_out_of_range_not_a_count_that_is_not_one() {
    // It said "not a count".
    let msg = |value: &str| {
        parse(&[("STREAMPOOL_SIM_DEVICES", value)])
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        msg("100"),
        "STREAMPOOL_SIM_DEVICES=\"100\" is not valid: use a whole number from 1 to 64 \
         (more than 64 devices)"
    );
    assert!(msg("0").ends_with("(no devices)"), "{}", msg("0"));
    assert!(
        msg("two").ends_with("(not a whole number)"),
        "{}",
        msg("two")
    );
}

#[test]
fn a_decimal_page_size_is_a_whole_number_of_bytes_or_is_refused_saying_so() {
    // `1.5GiB` was refused with the unknown unit ".5gib".
    let c = parse(&[("STREAMPOOL_VMM_PAGE_SIZE", "1.5GiB")]).unwrap();
    assert_eq!(c.vmm_page_size, SizeSpec::Bytes(3 << 29));
    let msg = |value: &str| {
        parse(&[("STREAMPOOL_VMM_PAGE_SIZE", value)])
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        msg("1.3KiB"),
        "STREAMPOOL_VMM_PAGE_SIZE=\"1.3KiB\" is not valid: use a size such as 2MiB or 20MiB, \
         at most 1 TiB (1.3KiB is not a whole number of bytes)"
    );
    assert!(
        msg("2TiB").ends_with("(larger than 1 TiB)"),
        "{}",
        msg("2TiB")
    );
    // every refusal of the variable lists the same accepted forms (no percentages)
    for value in ["50%", "max", "0", "lots"] {
        assert!(
            msg(value).contains("use a size such as 2MiB or 20MiB, at most 1 TiB ("),
            "{}",
            msg(value)
        );
    }
}

#[test]
fn log_filters_are_levels_and_streampool_modules() {
    for good in [
        "warn",
        "INFO",
        "off",
        "streampool",
        "streampool=trace",
        "streampool::device=debug,warn",
        "warn, streampool::pool = info,",
    ] {
        assert!(
            validate_log_filter(good).is_ok(),
            "{good:?} should be accepted"
        );
    }
    for bad in [
        "verbose",
        "streampool=loud",
        "cudarc=debug",
        "streampoolx=debug",
        "streampool::=info",
        "streampool::a::=info",
        "=info",
        "info/alloc",
        "warn,verbose",
    ] {
        let msg = validate_log_filter(bad).unwrap_err().to_string();
        assert!(
            msg.contains("not a level or a streampool module"),
            "{bad:?}: {msg}"
        );
    }
    // An empty filter reads as errors only under env_logger: every warning silenced.
    for empty in ["", ",", " , "] {
        let msg = validate_log_filter(empty).unwrap_err().to_string();
        assert!(
            msg.contains("STREAMPOOL_LOG") && msg.contains("empty: no level or module"),
            "{empty:?}: {msg}"
        );
    }
}

/// A value that is not UTF-8 text was taken for an unset variable (`env::var().ok()`): a
/// `MAX_POOL_SIZE` cap was dropped, `DRIVER` fell back to cuda. Every variable refuses it
/// by name, like any malformed value.
#[test]
fn values_that_are_not_utf8_are_refused_by_name() {
    use std::os::unix::ffi::OsStringExt;
    for var in [
        "STREAMPOOL_DRIVER",
        "STREAMPOOL_BACKEND",
        "STREAMPOOL_RELEASE_THRESHOLD",
        "STREAMPOOL_MAX_POOL_SIZE",
        "STREAMPOOL_CACHE_LIMIT",
        "STREAMPOOL_CACHE_MAX_BLOCK",
        "STREAMPOOL_SMALL_POOL_MAX",
        "STREAMPOOL_VMM_PAGE_SIZE",
        "STREAMPOOL_TRIM_ON_GROWTH",
        "STREAMPOOL_IPC",
        "STREAMPOOL_PEER_ACCESS",
        "STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES",
        "STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC",
        "STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES",
        "STREAMPOOL_SIM_DEVICES",
        "STREAMPOOL_SIM_MEMORY",
        "STREAMPOOL_LOG",
        "STREAMPOOL_VMM_HEADROOM",
        "STREAMPOOL_IDLE_RELEASE",
        "STREAMPOOL_VMM_COLD_AFTER",
        "STREAMPOOL_VMM_GROWTH_SLACK",
        "STREAMPOOL_VMM_SPAN_SIZE",
    ] {
        let raw = OsString::from_vec(b"8\xffGiB".to_vec());
        let e = Config::from_os_lookup(|k| (k == var).then(|| raw.clone())).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Config { var: v, .. } if v == var)
                && msg.starts_with(&format!("{var}=\"8\u{fffd}GiB\" is not valid"))
                && msg.contains("not UTF-8 text: byte 0xff at offset 1"),
            "{msg}"
        );
        // It accepts what the variable accepts when malformed otherwise.
        let malformed = match var {
            "STREAMPOOL_SIM_DEVICES" | "STREAMPOOL_VMM_PAGE_SIZE" => "0",
            "STREAMPOOL_LOG" => "verbose",
            _ => "sometimes",
        };
        let Error::Config {
            accepted: usual, ..
        } = parse(&[(var, malformed)]).unwrap_err()
        else {
            panic!("{var}={malformed:?} is not a configuration error");
        };
        assert!(
            matches!(e, Error::Config { accepted, .. } if accepted == usual),
            "{var}: {msg}, usually accepted: {usual}"
        );
    }
}

#[test]
fn a_negative_size_variable_says_negative_sizes_are_refused() {
    let msg = parse(&[("STREAMPOOL_CACHE_LIMIT", "-1")])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("STREAMPOOL_CACHE_LIMIT=\"-1\"")
            && msg.contains("negative sizes are not accepted"),
        "{msg}"
    );
}

/// `STREAMPOOL_MAX_POOL_SIZE` of zero is no cap however it is written: `0%` capped every
/// backend at 0 bytes, so that each allocation failed as out of memory.
#[test]
fn a_zero_pool_size_cap_in_any_form_is_no_cap() {
    for zero in ["0", "0MiB", "0GiB", "0%", "0.0%", "max"] {
        let c = parse(&[("STREAMPOOL_MAX_POOL_SIZE", zero)]).unwrap();
        assert_eq!(c.max_pool_size, SizeSpec::Max, "{zero}");
    }
    let c = parse(&[("STREAMPOOL_MAX_POOL_SIZE", "0.5%")]).unwrap();
    assert_eq!(c.max_pool_size, SizeSpec::Percent(0.5));
}

/// A headroom of the whole device leaves nothing to allocate: refused at parse as a share
/// (`100%`, `max`), and for a device no larger than the bytes it names, by the device's layout.
#[test]
fn a_headroom_of_the_whole_device_is_refused() {
    for value in ["max", "100%"] {
        let e = parse(&[("STREAMPOOL_VMM_HEADROOM", value)]).unwrap_err();
        assert!(
            e.to_string().contains("STREAMPOOL_VMM_HEADROOM"),
            "{value}: {e}"
        );
        assert!(e.to_string().contains("cannot stay free"), "{value}: {e}");
    }
    assert!(parse(&[("STREAMPOOL_VMM_HEADROOM", "150%")]).is_err());
    assert!(parse(&[("STREAMPOOL_VMM_HEADROOM", "99%")]).is_ok());
    let gib = 1u64 << 30;
    for (headroom, ok) in [(16 * gib, false), (17 * gib, false), (16 * gib - 1, true)] {
        let c = parse(&[("STREAMPOOL_VMM_HEADROOM", &headroom.to_string())]).unwrap();
        let spec = crate::config::Settings::from(&c)
            .for_device(16 * gib)
            .sources
            .vmm;
        let layout = spec.layout(0, "sim", 2 << 20, 16 * gib, 2);
        assert_eq!(
            layout.is_ok(),
            ok,
            "{headroom} B on a 16 GiB device: {layout:?}"
        );
        if let Err(e) = layout {
            assert!(e.to_string().contains("STREAMPOOL_VMM_HEADROOM"), "{e}");
        }
    }
}

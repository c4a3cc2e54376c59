//! Byte quantities: parsing `"8GiB"`, `"1.5GiB"`, `"512MB"`, `"80%"`, `"max"` and printing
//! human-readable sizes.
//!
//! Invariant: parsing is exact (integer arithmetic, overflow is an error, never a wrap; a decimal
//! size that is not a whole number of bytes is an error, never rounded).

/// A size as written by a user, resolved against a device's memory when a pool is created.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeSpec {
    Bytes(u64),
    /// Percentage of the device's total memory, 0..=100.
    Percent(f64),
    /// No limit (`u64::MAX` bytes).
    Max,
}

impl SizeSpec {
    pub fn resolve_bytes(self, device_total_bytes: u64) -> u64 {
        match self {
            SizeSpec::Bytes(b) => b,
            SizeSpec::Percent(p) => ((device_total_bytes as f64) * p / 100.0) as u64,
            SizeSpec::Max => u64::MAX,
        }
    }

    pub fn is_max(self) -> bool {
        self == SizeSpec::Max
    }
}

/// What a size variable accepts, for its error message (kept short: the README's table has the
/// units, KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB powers of 1024).
pub const SIZE_ACCEPTED: &str =
    "a size such as 512MiB, 1.5GiB or 8GB, 80% of device memory, or max";

/// Decimals a size may have (`1.5GiB`): more cannot make a whole number of bytes with any unit.
const MAX_DECIMALS: usize = 12;

/// Parses a size; the error is the reason, for the caller to wrap with the variable's name.
pub fn parse_size(text: &str) -> Result<SizeSpec, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty value".into());
    }
    if t.starts_with('-') {
        return Err("negative sizes are not accepted".into());
    }
    if t.eq_ignore_ascii_case("max") || t.eq_ignore_ascii_case("unlimited") {
        return Ok(SizeSpec::Max);
    }
    if let Some(number) = t.strip_suffix('%') {
        let p: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("{number:?} is not a number"))?;
        if p.is_nan() {
            return Err(format!("{number:?} is not a number"));
        }
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("{p}% is more than 100%"));
        }
        return Ok(SizeSpec::Percent(p));
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let (digits, decimals) = number.split_once('.').unwrap_or((number, ""));
    if digits.is_empty() {
        return Err("no leading digits".into());
    }
    if number.ends_with('.') || decimals.contains('.') || decimals.len() > MAX_DECIMALS {
        return Err(format!("{number:?} is not a number"));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        other => return Err(format!("unknown unit {other:?}")),
    };
    // number × multiplier exactly: (digits and decimals as one integer) × multiplier ÷ 10^decimals.
    let scale = 10u128.pow(decimals.len() as u32);
    let mantissa: u128 = format!("{digits}{decimals}")
        .parse()
        .map_err(|_| "number too large".to_string())?;
    let scaled = mantissa
        .checked_mul(u128::from(multiplier))
        .ok_or_else(|| "value overflows 64 bits".to_string())?;
    if scaled % scale != 0 {
        return Err(format!(
            "{number}{unit} is not a whole number of bytes",
            unit = unit.trim()
        ));
    }
    u64::try_from(scaled / scale)
        .map(SizeSpec::Bytes)
        .map_err(|_| "value overflows 64 bits".to_string())
}

/// `1536` -> `"1.50 KiB"`, like PyTorch's memory summaries.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Like [`format_bytes`], but `u64::MAX` (no limit) reads "max".
pub fn format_limit(bytes: u64) -> String {
    match bytes {
        u64::MAX => "max".into(),
        _ => format_bytes(bytes),
    }
}

/// Rounds up to a multiple of `align` (a power of two); `None` if that overflows 64 bits.
#[inline]
pub const fn round_up(bytes: u64, align: u64) -> Option<u64> {
    match bytes.checked_add(align - 1) {
        Some(b) => Some(b & !(align - 1)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_percentages() {
        assert_eq!(parse_size("4096"), Ok(SizeSpec::Bytes(4096)));
        assert_eq!(parse_size("512MB"), Ok(SizeSpec::Bytes(512_000_000)));
        assert_eq!(parse_size("8GiB"), Ok(SizeSpec::Bytes(8 << 30)));
        assert_eq!(parse_size(" 2 kib "), Ok(SizeSpec::Bytes(2048)));
        assert_eq!(parse_size("80%"), Ok(SizeSpec::Percent(80.0)));
        assert_eq!(parse_size("MAX"), Ok(SizeSpec::Max));
        assert_eq!(SizeSpec::Percent(50.0).resolve_bytes(1000), 500);
    }

    #[test]
    fn rejects_malformed_sizes() {
        for bad in [
            "",
            "12XB",
            "GiB",
            "-5",
            "120%",
            "abc%",
            "99999999999999999999",
            "20000000TiB",
            ".5GiB",
            "1.GiB",
            "1.2.3MiB",
            "16777216.5TiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    /// `1.5GiB` was refused as having the unknown unit ".5gib": a decimal size is accepted when
    /// it is a whole number of bytes, and refused saying so when it is not.
    #[test]
    fn decimal_sizes_are_exact_whole_bytes() {
        assert_eq!(parse_size("1.5GiB"), Ok(SizeSpec::Bytes(3 << 29)));
        assert_eq!(parse_size("0.5KB"), Ok(SizeSpec::Bytes(500)));
        assert_eq!(parse_size("1.25 KiB"), Ok(SizeSpec::Bytes(1280)));
        // NaN is no share of anything (it was refused as "NaN% is more than 100%").
        assert_eq!(
            parse_size("nan%"),
            Err("\"nan\" is not a number".to_string())
        );
        assert_eq!(
            parse_size("101%"),
            Err("101% is more than 100%".to_string())
        );
        assert_eq!(parse_size("2.000MiB"), Ok(SizeSpec::Bytes(2 << 20)));
        assert_eq!(
            parse_size("0.000000000001TB"),
            Ok(SizeSpec::Bytes(1)),
            "exact, no floating point"
        );
        assert_eq!(
            parse_size("1.5"),
            Err("1.5 is not a whole number of bytes".to_string())
        );
        assert_eq!(
            parse_size("1.3KiB"),
            Err("1.3KiB is not a whole number of bytes".to_string())
        );
        assert_eq!(
            parse_size("1.GiB"),
            Err("\"1.\" is not a number".to_string())
        );
    }

    #[test]
    fn negative_sizes_are_refused_as_negative() {
        for bad in ["-1", " -5GiB", "-0", "-50%"] {
            assert_eq!(
                parse_size(bad),
                Err("negative sizes are not accepted".to_string()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(format_bytes(12), "12 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(10 << 40), "10.00 TiB");
        assert_eq!(format_limit(u64::MAX), "max");
        assert_eq!(format_limit(1536), "1.50 KiB");
        assert_eq!(round_up(1, 512), Some(512));
        assert_eq!(round_up(1024, 512), Some(1024));
        assert_eq!(
            round_up(u64::MAX - 510, 512),
            None,
            "overflow is None, never a wrap"
        );
        assert_eq!(round_up(u64::MAX - 1024, 512), Some(u64::MAX - 1023));
    }
}

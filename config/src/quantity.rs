//! Strict parsing of byte quantities (`4Gi`, `512Mi`, `20G`, `1073741824`) and shares (`25%`).
//!
//! Quantities are parsed with exact integer arithmetic: a decimal fraction is accepted only
//! when it names a whole number of bytes (`1.5Gi`), never rounded, and every overflow is an
//! error. Kubernetes' milli suffix (`100m`) is refused instead of being read as megabytes.

use std::fmt;

/// What the parser accepts, for error messages.
pub const ACCEPTED_BYTES: &str = "bytes (`1073741824`), binary units (`512Mi`, `4Gi`; Ki Mi Gi Ti Pi Ei) or decimal units (`20G`; k M G T P E)";
/// What the parser accepts when a percentage is allowed too.
pub const ACCEPTED_QUANTITY: &str = "bytes (`1073741824`), binary units (`512Mi`, `4Gi`; Ki Mi Gi Ti Pi Ei), decimal units (`20G`; k M G T P E) or a percentage of the GPU (`25%`, 1-100)";

/// A parsed quantity: an exact byte count or a whole percentage (1-100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// An exact number of bytes.
    Bytes(u64),
    /// A percentage of a GPU's memory, 1-100.
    Percent(u8),
}

impl Quantity {
    /// The byte count this quantity names on a GPU of `total` bytes (percentages round down).
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Quantity::Bytes(b) => b,
            Quantity::Percent(p) => {
                // p <= 100, so the product fits in u128 and the quotient in u64.
                ((u128::from(total) * u128::from(p)) / 100) as u64
            }
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Bytes(b) => write!(f, "{}", format_bytes(*b)),
            Quantity::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Why a quantity was refused. The message names the value; callers add the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("`{value}` is not a quantity; accepted: {accepted}")]
    Syntax {
        value: String,
        accepted: &'static str,
    },
    #[error(
        "`{value}` uses suffix `{suffix}`, which is not accepted ({hint}); accepted: {accepted}"
    )]
    Suffix {
        value: String,
        suffix: String,
        hint: &'static str,
        accepted: &'static str,
    },
    #[error("`{value}` is not a whole number of bytes; accepted: {accepted}")]
    Fraction {
        value: String,
        accepted: &'static str,
    },
    #[error("`{value}` is too large (more than 2^64-1 bytes)")]
    Overflow { value: String },
    #[error("`{value}` is not a percentage from 1% to 100%")]
    Percent { value: String },
    #[error("`{value}` is a percentage, but only an absolute size is accepted here: {accepted}")]
    PercentNotAllowed {
        value: String,
        accepted: &'static str,
    },
}

fn multiplier(suffix: &str) -> Option<u128> {
    Some(match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    })
}

fn suffix_hint(suffix: &str) -> &'static str {
    match suffix {
        "m" => "`m` means milli; write `M` for megabytes or `Mi` for mebibytes",
        "g" | "t" | "p" | "e" => "units are case-sensitive",
        "ki" | "mi" | "gi" | "ti" | "pi" | "ei" => "binary units start with a capital letter",
        "B" | "b" | "KB" | "MB" | "GB" | "TB" | "KiB" | "MiB" | "GiB" | "TiB" => {
            "write the unit without `B`, e.g. `4Gi` or `20G`"
        }
        _ => "unknown unit",
    }
}

/// Parses a quantity that may be a percentage (`25%`) or a byte count.
pub fn parse_quantity(input: &str) -> Result<Quantity, QuantityError> {
    parse_inner(input, true)
}

/// Parses an absolute byte count; a percentage is refused.
pub fn parse_bytes(input: &str) -> Result<u64, QuantityError> {
    match parse_inner(input, false)? {
        Quantity::Bytes(b) => Ok(b),
        // parse_inner(.., false) never returns a percentage.
        Quantity::Percent(_) => Err(QuantityError::PercentNotAllowed {
            value: input.to_string(),
            accepted: ACCEPTED_BYTES,
        }),
    }
}

fn parse_inner(input: &str, allow_percent: bool) -> Result<Quantity, QuantityError> {
    let value = input.trim();
    let accepted = if allow_percent {
        ACCEPTED_QUANTITY
    } else {
        ACCEPTED_BYTES
    };
    let syntax = || QuantityError::Syntax {
        value: input.to_string(),
        accepted,
    };
    if let Some(num) = value.strip_suffix('%') {
        if !allow_percent {
            return Err(QuantityError::PercentNotAllowed {
                value: input.to_string(),
                accepted,
            });
        }
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) || num.len() > 3 {
            return Err(QuantityError::Percent {
                value: input.to_string(),
            });
        }
        let p: u16 = num.parse().map_err(|_| QuantityError::Percent {
            value: input.to_string(),
        })?;
        if !(1..=100).contains(&p) {
            return Err(QuantityError::Percent {
                value: input.to_string(),
            });
        }
        return Ok(Quantity::Percent(p as u8));
    }
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    if number.is_empty() {
        return Err(syntax());
    }
    let mult = match multiplier(suffix) {
        Some(m) => m,
        None => {
            return Err(QuantityError::Suffix {
                value: input.to_string(),
                suffix: suffix.to_string(),
                hint: suffix_hint(suffix),
                accepted,
            })
        }
    };
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty()
        || number.matches('.').count() > 1
        || (number.contains('.') && frac_part.is_empty())
    {
        return Err(syntax());
    }
    let overflow = || QuantityError::Overflow {
        value: input.to_string(),
    };
    // Exact rational arithmetic: value = (int * 10^k + frac) * mult / 10^k.
    let mut numerator: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        numerator = numerator
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(b - b'0')))
            .ok_or_else(overflow)?;
    }
    let mut denominator: u128 = 1;
    for _ in 0..frac_part.len() {
        denominator = denominator.checked_mul(10).ok_or_else(overflow)?;
    }
    let scaled = numerator.checked_mul(mult).ok_or_else(overflow)?;
    if !scaled.is_multiple_of(denominator) {
        return Err(QuantityError::Fraction {
            value: input.to_string(),
            accepted,
        });
    }
    let bytes = u64::try_from(scaled / denominator).map_err(|_| overflow())?;
    Ok(Quantity::Bytes(bytes))
}

/// Formats bytes for people: the largest binary unit that divides exactly, else the largest
/// unit that fits (from MiB up) with two decimals (`4Gi`, `512Mi`, `3.27 GiB`, `16.00 EiB`
/// for 2^64-1).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 6] = [
        ("Ei", 1 << 60),
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{}", bytes / size, name);
        }
    }
    match UNITS[..5].iter().find(|(_, size)| bytes >= *size) {
        Some((name, size)) => format!("{:.2} {name}B", bytes as f64 / *size as f64),
        None => format!("{bytes} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse_quantity("4Gi"), Ok(Quantity::Bytes(4 << 30)));
        assert_eq!(parse_quantity("512Mi"), Ok(Quantity::Bytes(512 << 20)));
        assert_eq!(parse_quantity("20G"), Ok(Quantity::Bytes(20_000_000_000)));
        assert_eq!(parse_quantity("1073741824"), Ok(Quantity::Bytes(1 << 30)));
        assert_eq!(parse_quantity("25%"), Ok(Quantity::Percent(25)));
        assert_eq!(parse_quantity("100%"), Ok(Quantity::Percent(100)));
        assert_eq!(parse_quantity("1.5Gi"), Ok(Quantity::Bytes(3 << 29)));
        assert_eq!(parse_quantity(" 8Gi "), Ok(Quantity::Bytes(8 << 30)));
        assert_eq!(parse_quantity("0"), Ok(Quantity::Bytes(0)));
        assert_eq!(parse_quantity("15Ei"), Ok(Quantity::Bytes(15 << 60)));
    }

    #[test]
    fn refuses_milli_and_says_why() {
        let err = parse_quantity("100m").unwrap_err();
        assert!(matches!(err, QuantityError::Suffix { .. }));
        assert!(err.to_string().contains("milli"), "{err}");
    }

    #[test]
    fn refuses_inexact_fractions_instead_of_rounding() {
        assert!(matches!(
            parse_quantity("0.5"),
            Err(QuantityError::Fraction { .. })
        ));
        assert!(matches!(
            parse_quantity("1.0000000001Ki"),
            Err(QuantityError::Fraction { .. })
        ));
        assert!(parse_quantity("1.").is_err());
        assert!(parse_quantity(".5Gi").is_err());
        assert!(parse_quantity("1.2.3").is_err());
    }

    #[test]
    fn refuses_overflow() {
        assert!(matches!(
            parse_quantity("16Ei"),
            Err(QuantityError::Overflow { .. })
        ));
        // An exact fraction above u64::MAX bytes is an overflow, not a fraction error.
        assert!(matches!(
            parse_quantity("16.125Ei"),
            Err(QuantityError::Overflow { .. })
        ));
        assert_eq!(
            parse_quantity("15.5Ei"),
            Ok(Quantity::Bytes((15 << 60) + (1 << 59)))
        );
        assert!(matches!(
            parse_quantity("99999999999999999999999999999999999999999"),
            Err(QuantityError::Overflow { .. })
        ));
        assert_eq!(
            parse_quantity("18446744073709551615"),
            Ok(Quantity::Bytes(u64::MAX))
        );
        assert!(matches!(
            parse_quantity("18446744073709551616"),
            Err(QuantityError::Overflow { .. })
        ));
    }

    #[test]
    fn refuses_bad_percentages_and_words() {
        for bad in [
            "0%", "101%", "150%", "%", "2.5%", "-5%", "lots", "", "Gi", "-1Gi", "4 Gi", "4GB",
            "4gi",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(matches!(
            parse_bytes("25%"),
            Err(QuantityError::PercentNotAllowed { .. })
        ));
    }

    #[test]
    fn resolves_percent_of_total() {
        assert_eq!(Quantity::Percent(25).resolve(40 << 30), 10 << 30);
        assert_eq!(Quantity::Percent(100).resolve(u64::MAX), u64::MAX);
        assert_eq!(Quantity::Percent(33).resolve(100), 33);
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(format_bytes(4 << 30), "4Gi");
        assert_eq!(format_bytes(512 << 20), "512Mi");
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes((3 << 30) + (1 << 28) + 1), "3.25 GiB");
        assert_eq!(format_bytes((3 << 20) + 1), "3.00 MiB");
        assert_eq!(format_bytes(u64::MAX), "16.00 EiB");
        assert_eq!(format_bytes(u64::MAX - (1 << 50)), "16.00 EiB");
        assert_eq!(format_bytes((5 << 40) + 1), "5.00 TiB");
        assert_eq!(format_bytes(1 << 60), "1Ei");
    }

    const SUFFIXES: [(&str, u64); 13] = [
        ("", 1),
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
    ];

    proptest! {
        #[test]
        fn integer_with_suffix_is_exact(n in 0u64..1_000_000, idx in 0usize..SUFFIXES.len()) {
            let (suffix, mult) = SUFFIXES[idx];
            let expected = u128::from(n) * u128::from(mult);
            let parsed = parse_quantity(&format!("{n}{suffix}"));
            if expected > u128::from(u64::MAX) {
                let is_overflow = matches!(parsed, Err(QuantityError::Overflow { .. }));
                prop_assert!(is_overflow);
            } else {
                prop_assert_eq!(parsed, Ok(Quantity::Bytes(expected as u64)));
            }
        }

        #[test]
        fn plain_bytes_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse_quantity(&n.to_string()), Ok(Quantity::Bytes(n)));
            prop_assert_eq!(parse_bytes(&n.to_string()), Ok(n));
        }

        #[test]
        fn percent_in_range(p in 0u16..300) {
            let parsed = parse_quantity(&format!("{p}%"));
            if (1..=100).contains(&p) {
                prop_assert_eq!(parsed, Ok(Quantity::Percent(p as u8)));
            } else {
                prop_assert!(parsed.is_err());
            }
        }

        #[test]
        fn fractions_are_exact_or_refused(int in 0u64..10_000, frac in 0u32..1000, idx in 0usize..SUFFIXES.len()) {
            let (suffix, mult) = SUFFIXES[idx];
            let text = format!("{int}.{frac:03}{suffix}");
            let exact_num = (u128::from(int) * 1000 + u128::from(frac)) * u128::from(mult);
            let fits = exact_num / 1000 <= u128::from(u64::MAX);
            match parse_quantity(&text) {
                Ok(Quantity::Bytes(b)) => {
                    prop_assert_eq!(exact_num % 1000, 0);
                    prop_assert_eq!(u128::from(b), exact_num / 1000);
                }
                Err(QuantityError::Fraction { .. }) => prop_assert_ne!(exact_num % 1000, 0),
                // Above 16 Ei no byte count fits in u64, exact or not.
                Err(QuantityError::Overflow { .. }) => prop_assert!(!fits, "{} fits in u64", text),
                other => prop_assert!(false, "unexpected {:?} for {}", other, text),
            }
        }

        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_quantity(&s);
        }
    }
}

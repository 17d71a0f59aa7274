//! Kubernetes quantities (`20Gi`, `1536Mi`, `30`, `1e3`) as exact integers: what a claim's
//! `consumedCapacity` says is booked to the byte, so nothing is rounded here; and the
//! canonical spelling the slice publisher writes.

/// A quantity that is not a whole, non-negative number in Kubernetes' quantity syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a whole non-negative Kubernetes quantity ({detail}); accepted: digits with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or an exponent (`20Gi`, `1536Mi`, `30`)")]
pub struct QuantityError {
    pub value: String,
    pub detail: &'static str,
}

/// Parses `s` exactly; a value with a fractional part (`1.5`, `500m`) is refused.
pub fn parse_whole(s: &str) -> Result<u64, QuantityError> {
    let err = |detail| QuantityError {
        value: s.to_string(),
        detail,
    };
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(err("negative"));
    }
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(num_end);
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(err("no digits"));
    }
    if frac.contains('.') {
        return Err(err("two decimal points"));
    }
    // (power of two, power of ten)
    let (shift, mut exp10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        other => {
            let e = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(|| err("unknown suffix"))?;
            let e: i32 = e.parse().map_err(|_| err("unknown suffix"))?;
            if !(-30..=30).contains(&e) {
                return Err(err("exponent out of range"));
            }
            (0, e)
        }
    };
    let digits: String = format!("{int}{frac}");
    let mut mantissa: u128 = 0;
    for b in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    exp10 -= i32::try_from(frac.len()).map_err(|_| err("too many digits"))?;
    let mut v = mantissa
        .checked_shl(shift)
        .ok_or_else(|| err("too large"))?;
    if shift > 0 && v >> shift != mantissa {
        return Err(err("too large"));
    }
    if exp10 >= 0 {
        for _ in 0..exp10 {
            v = v.checked_mul(10).ok_or_else(|| err("too large"))?;
        }
    } else {
        for _ in 0..(-exp10) {
            if v % 10 != 0 {
                return Err(err("not a whole number"));
            }
            v /= 10;
        }
    }
    u64::try_from(v).map_err(|_| err("too large"))
}

/// The canonical spelling of `bytes`: the largest binary suffix that divides it exactly.
pub fn format_binary(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes != 0 {
        for (s, shift) in SUFFIXES {
            if bytes.trailing_zeros() >= shift {
                return format!("{}{s}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_quantities_parse_exactly() {
        for (s, v) in [
            ("0", 0),
            ("30", 30),
            ("+7", 7),
            ("20Gi", 20 << 30),
            ("1536Mi", 1536 << 20),
            ("1.5Gi", 3 << 29),
            ("4k", 4000),
            ("1e3", 1000),
            ("2E2", 200),
            ("3000m", 3),
            ("12G", 12_000_000_000),
            ("15Ei", 15 << 60),
        ] {
            assert_eq!(parse_whole(s), Ok(v), "{s}");
        }
        for bad in [
            "", "-1", "1.5", "500m", "1x", "Gi", "1..2", "16Ei", "1e99", "1.2.3",
        ] {
            let e = parse_whole(bad).expect_err(bad);
            assert!(e.to_string().contains("accepted"), "{e}");
        }
    }

    #[test]
    fn binary_formatting_round_trips() {
        for (v, s) in [
            (0, "0"),
            (100, "100"),
            (143_360u64 << 20, "140Gi"),
            (1023 << 20, "1023Mi"),
            (1536, "1536"),
            (2048, "2Ki"),
        ] {
            assert_eq!(format_binary(v), s);
            assert_eq!(parse_whole(s), Ok(v));
        }
    }
}

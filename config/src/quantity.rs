//! gpuslice's one quantity grammar and its byte spellings, shared by the config file, the
//! annotations, the DRA plugin and the console so that no two readers of `20Gi` can disagree.
//!
//! The grammar is Kubernetes': `[+]number suffix`, where the number is digits with an optional
//! decimal fraction and the suffix a binary unit (Ki Mi Gi Ti Pi Ei), a decimal unit (n u m k M
//! G T P E) or a decimal exponent (`e3`). Values are computed with exact integer arithmetic: a
//! fraction is accepted only when it names a whole number (`1.5Gi`), never rounded, and every
//! overflow is an error. Two contracts read it, and differ only in what they accept:
//!
//! - what people write (the config file, annotations; [`parse_quantity`], [`parse_bytes`]):
//!   no sign, no sub-units and no exponents (`100m` is refused instead of being read as
//!   0.1 byte where megabytes were meant), `K` as well as `k`, and a percentage where allowed;
//! - what the API server stores (a claim's `consumedCapacity`, a slice's capacity;
//!   [`parse_kube_quantity`]): every spelling Kubernetes itself may write (`3000m`, `1e3`,
//!   `+7`, `.5Ki`), as long as the value is whole.
//!
//! Bytes are written in three spellings, one function each, because their readers differ:
//! [`format_kube_quantity`] (exact, for API objects), [`format_bytes`] (exact where it can be,
//! for messages) and [`format_bytes_rounded`] (short, for table columns).

use std::fmt;

/// What the parser accepts, for error messages.
pub const ACCEPTED_BYTES: &str = "bytes (`1073741824`), binary units (`512Mi`, `4Gi`; Ki Mi Gi Ti Pi Ei) or decimal units (`20G`; k M G T P E)";
/// What the parser accepts when a percentage is allowed too.
pub const ACCEPTED_QUANTITY: &str = "bytes (`1073741824`), binary units (`512Mi`, `4Gi`; Ki Mi Gi Ti Pi Ei), decimal units (`20G`; k M G T P E) or a percentage of the GPU (`25%`, 1-100)";
/// What [`parse_kube_quantity`] accepts, for error messages.
pub const ACCEPTED_KUBE: &str = "digits with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or an exponent (`20Gi`, `1536Mi`, `30`)";

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

/// Why a quantity people wrote was refused. The message names the value, the reason and (when
/// one applies) what is accepted; callers that name the value themselves, with the key, take
/// [`QuantityError::reason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantityError {
    Syntax {
        value: String,
        accepted: &'static str,
    },
    Suffix {
        value: String,
        suffix: String,
        accepted: &'static str,
    },
    Fraction {
        value: String,
        accepted: &'static str,
    },
    Overflow {
        value: String,
    },
    Percent {
        value: String,
    },
    PercentNotAllowed {
        value: String,
        accepted: &'static str,
    },
}

impl QuantityError {
    /// The value as written.
    pub fn value(&self) -> &str {
        match self {
            QuantityError::Syntax { value, .. }
            | QuantityError::Suffix { value, .. }
            | QuantityError::Fraction { value, .. }
            | QuantityError::Overflow { value }
            | QuantityError::Percent { value }
            | QuantityError::PercentNotAllowed { value, .. } => value,
        }
    }

    /// Why the value is refused, in a few words that name neither the value nor what is
    /// accepted (`` unit `m` is milli ... ``, `too large, more than 2^64-1 bytes`).
    pub fn reason(&self) -> String {
        match self {
            QuantityError::Syntax { .. } => "not a number with an optional unit".to_string(),
            QuantityError::Suffix { suffix, .. } => suffix_reason(suffix),
            QuantityError::Fraction { .. } => "not a whole number of bytes".to_string(),
            QuantityError::Overflow { .. } => "too large, more than 2^64-1 bytes".to_string(),
            QuantityError::Percent { .. } => "not a whole percentage from 1% to 100%".to_string(),
            QuantityError::PercentNotAllowed { .. } => {
                "a percentage, where only an absolute size is accepted".to_string()
            }
        }
    }

    /// What is accepted where the value was refused, when the grammar says it.
    pub fn accepted(&self) -> Option<&'static str> {
        match self {
            QuantityError::Syntax { accepted, .. }
            | QuantityError::Suffix { accepted, .. }
            | QuantityError::Fraction { accepted, .. }
            | QuantityError::PercentNotAllowed { accepted, .. } => Some(accepted),
            QuantityError::Overflow { .. } | QuantityError::Percent { .. } => None,
        }
    }
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not accepted ({})", self.value(), self.reason())?;
        match self.accepted() {
            Some(a) => write!(f, "; accepted: {a}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for QuantityError {}

/// Why a quantity from the API server was refused: one reason in a few words (`detail`), which
/// callers that check a user's flag against the same contract put in their own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a whole non-negative Kubernetes quantity ({detail}); accepted: {ACCEPTED_KUBE}")]
pub struct KubeQuantityError {
    pub value: String,
    pub detail: &'static str,
}

/// A suffix of the grammar: its factor is 2^`shift` · 10^`exp10`; `people` and `kube` say which
/// contract accepts it.
struct Suffix {
    text: &'static str,
    shift: u32,
    exp10: i32,
    people: bool,
    kube: bool,
}

const fn suffix(text: &'static str, shift: u32, exp10: i32, people: bool, kube: bool) -> Suffix {
    Suffix {
        text,
        shift,
        exp10,
        people,
        kube,
    }
}

const SUFFIXES: [Suffix; 17] = [
    suffix("", 0, 0, true, true),
    suffix("Ki", 10, 0, true, true),
    suffix("Mi", 20, 0, true, true),
    suffix("Gi", 30, 0, true, true),
    suffix("Ti", 40, 0, true, true),
    suffix("Pi", 50, 0, true, true),
    suffix("Ei", 60, 0, true, true),
    // Sub-units: whole only in multiples; people who write `m` mean megabytes.
    suffix("n", 0, -9, false, true),
    suffix("u", 0, -6, false, true),
    suffix("m", 0, -3, false, true),
    suffix("k", 0, 3, true, true),
    // Not Kubernetes syntax; people write it for kilo.
    suffix("K", 0, 3, true, false),
    suffix("M", 0, 6, true, true),
    suffix("G", 0, 9, true, true),
    suffix("T", 0, 12, true, true),
    suffix("P", 0, 15, true, true),
    suffix("E", 0, 18, true, true),
];

/// A number's spelling cut into its parts; nothing is judged yet.
struct Spelling<'a> {
    /// The leading run of digits and dots.
    number: &'a str,
    /// The number's digits before its first dot.
    int: &'a str,
    /// What follows the number's first dot (may hold another dot); `None` without one.
    frac: Option<&'a str>,
    /// Everything after the number.
    suffix: &'a str,
}

fn cut(value: &str) -> Spelling<'_> {
    let end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(end);
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (number, None),
    };
    Spelling {
        number,
        int,
        frac,
        suffix,
    }
}

/// Why a well-formed number has no exact `u64` value.
enum Inexact {
    TooLarge,
    NotWhole,
}

/// The exact value of `int.frac` · 2^`shift` · 10^`exp10`; `int` and `frac` are ASCII digits.
///
/// Computed on the decimal digits themselves, so the length of the spelling never decides
/// the outcome (`1.` followed by forty zeros `Gi` is exactly 1 GiB, and `0.`…`Ei` with sixty
/// fraction digits may be exactly one byte): the digits are multiplied by 2^`shift`, the
/// decimal point moved by `exp10`, and the value is whole when no non-zero digit is left
/// after the point. The work is linear in the input's length (at most two passes over the
/// digits for the largest binary unit); nothing is built from the number's magnitude.
fn exact(int: &str, frac: &str, shift: u32, exp10: i32) -> Result<u64, Inexact> {
    // Trailing zeros of the fraction change nothing.
    let frac = frac.trim_end_matches('0');
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    // Where the decimal point stands, counted in digits from the left (may lie outside).
    let int_len = i64::try_from(int.len()).map_err(|_| Inexact::TooLarge)?;
    let mut point = int_len + i64::from(exp10);
    // Times 2^shift, at most 2^32 per pass: 9 · 2^32 plus a carry below 2^32 fits in u64.
    let mut left = shift;
    while left > 0 {
        let step = left.min(32);
        left -= step;
        let mut carry: u64 = 0;
        for d in digits.iter_mut().rev() {
            let x = (u64::from(*d) << step) + carry;
            *d = (x % 10) as u8;
            carry = x / 10;
        }
        let mut head = Vec::new();
        while carry > 0 {
            head.push((carry % 10) as u8);
            carry /= 10;
        }
        head.reverse();
        point += i64::try_from(head.len()).map_err(|_| Inexact::TooLarge)?;
        digits.splice(0..0, head);
    }
    let len = i64::try_from(digits.len()).map_err(|_| Inexact::TooLarge)?;
    // `point` is clamped into 0..=len, so it is a valid index.
    let split = usize::try_from(point.clamp(0, len)).map_err(|_| Inexact::TooLarge)?;
    let (whole, rest) = digits.split_at(split);
    if rest.iter().any(|&d| d != 0) {
        return Err(Inexact::NotWhole);
    }
    let Some(first) = whole.iter().position(|&d| d != 0) else {
        return Ok(0);
    };
    let significant = &whole[first..];
    // Zeros the point's move appends after the last digit.
    let zeros = (point - len).max(0);
    // u64::MAX has 20 digits.
    if i64::try_from(significant.len()).map_err(|_| Inexact::TooLarge)? + zeros > 20 {
        return Err(Inexact::TooLarge);
    }
    let mut v: u128 = 0;
    for &d in significant {
        v = v * 10 + u128::from(d);
    }
    for _ in 0..zeros {
        v *= 10;
    }
    u64::try_from(v).map_err(|_| Inexact::TooLarge)
}

/// Why a unit people write is refused, with what to write instead where that is clear.
fn suffix_reason(suffix: &str) -> String {
    match suffix {
        "m" => "unit `m` is Kubernetes' milli, a thousandth, not megabytes: write `M` or `Mi`"
            .to_string(),
        "g" | "t" | "p" | "e" => format!(
            "unit `{suffix}`: units are case-sensitive, write `{}`",
            suffix.to_ascii_uppercase()
        ),
        "ki" | "mi" | "gi" | "ti" | "pi" | "ei" => {
            let (head, tail) = suffix.split_at(1);
            format!(
                "unit `{suffix}`: binary units start with a capital letter, write `{}{tail}`",
                head.to_ascii_uppercase()
            )
        }
        "B" | "b" => format!("unit `{suffix}`: write bytes without a unit"),
        "KB" | "MB" | "GB" | "TB" | "KiB" | "MiB" | "GiB" | "TiB" => format!(
            "unit `{suffix}`: write units without `B`, here `{}`",
            &suffix[..suffix.len() - 1]
        ),
        other => format!("unknown unit `{other}`"),
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
    // A sign leaves the number empty: refused as syntax.
    let s = cut(value);
    if s.number.is_empty() {
        return Err(syntax());
    }
    let Some(unit) = SUFFIXES.iter().find(|u| u.people && u.text == s.suffix) else {
        return Err(QuantityError::Suffix {
            value: input.to_string(),
            suffix: s.suffix.to_string(),
            accepted,
        });
    };
    let frac = s.frac.unwrap_or("");
    if s.int.is_empty() || frac.contains('.') || s.frac == Some("") {
        return Err(syntax());
    }
    match exact(s.int, frac, unit.shift, unit.exp10) {
        Ok(bytes) => Ok(Quantity::Bytes(bytes)),
        Err(Inexact::TooLarge) => Err(QuantityError::Overflow {
            value: input.to_string(),
        }),
        Err(Inexact::NotWhole) => Err(QuantityError::Fraction {
            value: input.to_string(),
            accepted,
        }),
    }
}

/// Parses a quantity the API server stores (a claim's `consumedCapacity`, a slice's capacity,
/// a claim template's request) exactly, in any spelling Kubernetes writes; a value with a
/// fractional part (`1.5`, `500m`) is refused, as is a negative one.
pub fn parse_kube_quantity(input: &str) -> Result<u64, KubeQuantityError> {
    let err = |detail| KubeQuantityError {
        value: input.to_string(),
        detail,
    };
    let t = input.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(err("negative"));
    }
    let s = cut(t);
    let frac = s.frac.unwrap_or("");
    if s.int.is_empty() && frac.is_empty() {
        return Err(err("no digits"));
    }
    if frac.contains('.') {
        return Err(err("two decimal points"));
    }
    let (shift, exp10) = match SUFFIXES.iter().find(|u| u.kube && u.text == s.suffix) {
        Some(u) => (u.shift, u.exp10),
        None => {
            let e = s
                .suffix
                .strip_prefix('e')
                .or_else(|| s.suffix.strip_prefix('E'))
                .ok_or_else(|| err("unknown suffix"))?;
            let e: i32 = e.parse().map_err(|_| err("unknown suffix"))?;
            if !(-30..=30).contains(&e) {
                return Err(err("exponent out of range"));
            }
            (0, e)
        }
    };
    exact(s.int, frac, shift, exp10).map_err(|e| match e {
        Inexact::TooLarge => err("too large"),
        Inexact::NotWhole => err("not a whole number"),
    })
}

/// The binary units from the largest down, as (suffix, power of two).
const BINARY_UNITS: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

/// `bytes` in the largest binary unit that divides it exactly (`140Gi`, `2Ki`); `None` for 0
/// and for counts that are not whole KiB.
fn exact_binary(bytes: u64) -> Option<String> {
    if bytes == 0 {
        return None;
    }
    BINARY_UNITS
        .iter()
        .find(|(_, shift)| bytes.trailing_zeros() >= *shift)
        .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
}

/// Bytes as a Kubernetes quantity, for what is written into API objects (a ResourceSlice's
/// capacities, a claim template's request) and read back by the scheduler and
/// [`parse_kube_quantity`]: exact and in Kubernetes' canonical syntax, so the largest binary
/// suffix that divides it exactly, else plain digits (`140Gi`, `1023Mi`, `1536`, `0`).
pub fn format_kube_quantity(bytes: u64) -> String {
    exact_binary(bytes).unwrap_or_else(|| bytes.to_string())
}

/// Formats bytes for people reading a message (a refusal, a report), where the exact figure
/// matters: the largest binary unit that divides exactly, else the largest unit that fits
/// (from MiB up) with two decimals and a `B` that marks the figure as rounded (`4Gi`,
/// `512Mi`, `3.27 GiB`, `100 B`, `16.00 EiB` for 2^64-1).
pub fn format_bytes(bytes: u64) -> String {
    if let Some(exact) = exact_binary(bytes) {
        return exact;
    }
    match BINARY_UNITS[..5]
        .iter()
        .find(|(_, shift)| bytes >> shift > 0)
    {
        Some((name, shift)) => format!("{:.2} {name}B", bytes as f64 / (1u64 << shift) as f64),
        None => format!("{bytes} B"),
    }
}

/// Formats bytes for a table column, where width matters more than the last byte (the
/// console's kubectl-style tables and web page): the largest binary unit (Ki to Pi) that
/// gives at least 1, rounded to one decimal shown only when not whole (`141Gi`, `20.5Gi`,
/// `512Mi`, `512`, `0`).
pub fn format_bytes_rounded(bytes: u64) -> String {
    for (unit, shift) in &BINARY_UNITS[1..] {
        if bytes >> shift > 0 {
            let v = bytes as f64 / (1u64 << shift) as f64;
            let tenths = (v * 10.0).round() / 10.0;
            return if tenths.fract() == 0.0 {
                format!("{tenths:.0}{unit}")
            } else {
                format!("{tenths:.1}{unit}")
            };
        }
    }
    bytes.to_string()
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
    fn every_refusal_says_why() {
        for (value, reason) in [
            ("100m", "milli"),
            ("4GB", "here `G`"),
            ("4GiB", "here `Gi`"),
            ("4gi", "write `Gi`"),
            ("4g", "case-sensitive, write `G`"),
            ("4x", "unknown unit `x`"),
            ("16Ei", "too large, more than 2^64-1 bytes"),
            ("0.5", "not a whole number of bytes"),
            ("lots", "not a number"),
            ("150%", "from 1% to 100%"),
        ] {
            let e = parse_quantity(value).expect_err(value);
            assert!(e.reason().contains(reason), "{value}: {}", e.reason());
            assert!(!e.reason().contains(value), "{value}: {}", e.reason());
            let shown = e.to_string();
            assert!(
                shown.contains(&format!("`{value}`")) && shown.contains(&e.reason()),
                "{shown}"
            );
            assert_eq!(e.value(), value);
        }
        let e = parse_bytes("25%").unwrap_err();
        assert_eq!(e.accepted(), Some(ACCEPTED_BYTES));
        assert!(e.to_string().ends_with(ACCEPTED_BYTES), "{e}");
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
    fn long_spellings_of_exact_values_are_exact() {
        let zeros = "0".repeat(40);
        assert_eq!(
            parse_quantity(&format!("1.{zeros}Gi")),
            Ok(Quantity::Bytes(1 << 30))
        );
        assert_eq!(parse_bytes(&format!("4.{zeros}")), Ok(4));
        assert_eq!(parse_kube_quantity(&format!("1.{zeros}Gi")), Ok(1 << 30));
        assert_eq!(
            parse_quantity(&format!("{zeros}2Ki")),
            Ok(Quantity::Bytes(2048))
        );
        // One byte written as a fraction of an EiB: 2^-60 has sixty decimal places.
        let one_byte = "0.000000000000000000867361737988403547205962240695953369140625Ei";
        assert_eq!(parse_quantity(one_byte), Ok(Quantity::Bytes(1)));
        // Long but not whole, and long and too large, say so.
        assert!(matches!(
            parse_quantity(&format!("1.{zeros}1Gi")),
            Err(QuantityError::Fraction { .. })
        ));
        assert!(matches!(
            parse_quantity(&format!("1{zeros}.{zeros}")),
            Err(QuantityError::Overflow { .. })
        ));
        // Absurd lengths cost linear work, not a refusal for their length.
        let long = format!("1.{}Ei", "0".repeat(100_000));
        assert_eq!(parse_quantity(&long), Ok(Quantity::Bytes(1 << 60)));
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

    #[test]
    fn kube_quantities_parse_exactly() {
        for (s, v) in [
            ("0", 0),
            ("30", 30),
            ("+7", 7),
            ("20Gi", 20 << 30),
            ("1536Mi", 1536 << 20),
            ("1.5Gi", 3 << 29),
            (".5Ki", 512),
            ("2.", 2),
            ("4k", 4000),
            ("1e3", 1000),
            ("2E2", 200),
            ("3000m", 3),
            ("12G", 12_000_000_000),
            ("15Ei", 15 << 60),
        ] {
            assert_eq!(parse_kube_quantity(s), Ok(v), "{s}");
        }
        for (bad, detail) in [
            ("", "no digits"),
            ("-1", "negative"),
            ("1.5", "not a whole number"),
            ("500m", "not a whole number"),
            ("1x", "unknown suffix"),
            ("1K", "unknown suffix"),
            ("Gi", "no digits"),
            ("1..2", "two decimal points"),
            ("16Ei", "too large"),
            ("1e99", "exponent out of range"),
            ("1.2.3", "two decimal points"),
        ] {
            let e = parse_kube_quantity(bad).expect_err(bad);
            assert_eq!(e.detail, detail, "{bad}");
            assert!(e.to_string().contains("accepted"), "{e}");
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn both_contracts_read_one_grammar_alike() {
        // What people may write means the same in the API server's spelling.
        for s in [
            "0", "1", "4Gi", "512Mi", "1.5Gi", "0.5Ki", "20G", "1k", "7E", "15.5Ei",
        ] {
            assert_eq!(
                parse_kube_quantity(s).ok(),
                parse_bytes(s).ok(),
                "{s} reads differently"
            );
        }
        // And what one refuses as too large or not whole, the other refuses too.
        for s in ["16Ei", "0.5", "1.0000000001Ki", "18446744073709551616"] {
            assert!(
                parse_kube_quantity(s).is_err() && parse_bytes(s).is_err(),
                "{s}"
            );
        }
    }

    #[test]
    fn kube_quantities_are_written_exactly_and_read_back() {
        for (v, s) in [
            (0, "0"),
            (100, "100"),
            (143_360u64 << 20, "140Gi"),
            (1023 << 20, "1023Mi"),
            (1536, "1536"),
            (2048, "2Ki"),
            (u64::MAX, "18446744073709551615"),
        ] {
            assert_eq!(format_kube_quantity(v), s);
            assert_eq!(parse_kube_quantity(s), Ok(v));
        }
    }

    #[test]
    fn table_figures_are_short() {
        assert_eq!(format_bytes_rounded(0), "0");
        assert_eq!(format_bytes_rounded(512), "512");
        assert_eq!(format_bytes_rounded(141 << 30), "141Gi");
        assert_eq!(format_bytes_rounded(41 << 29), "20.5Gi");
        assert_eq!(format_bytes_rounded(1536 << 20), "1.5Gi");
        assert_eq!(format_bytes_rounded(512 << 20), "512Mi");
        assert_eq!(format_bytes_rounded((3 << 30) + (1 << 28) + 1), "3.3Gi");
        assert_eq!(format_bytes_rounded(u64::MAX), "16384Pi");
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
            let _ = parse_kube_quantity(&s);
        }

        #[test]
        fn kube_quantities_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse_kube_quantity(&format_kube_quantity(n)), Ok(n));
        }
    }
}

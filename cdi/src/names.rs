//! CDI naming rules: kinds (`vendor/class`), device names, qualified device names
//! (`vendor/class=name`) and the spec file names derived from a kind.
//!
//! Character rules follow the reference library's `pkg/parser`; the lengths (vendor a DNS
//! subdomain of at most 253 characters, class at most 63) come from the specification text.

use std::fmt;
use std::str::FromStr;

/// A name that breaks the CDI naming rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A kind without exactly one `/` separating two non-empty parts.
    #[error("kind {kind:?} is not of the form vendor/class (e.g. gpuslice.io/gpu)")]
    KindShape { kind: String },
    /// A vendor that breaks the rules.
    #[error("vendor {vendor:?} is invalid: {reason}; accepted: a domain-like name of letters, digits, '-', '_', '.', starting with a letter, ending with a letter or digit, at most 253 characters")]
    Vendor {
        vendor: String,
        reason: &'static str,
    },
    /// A class that breaks the rules.
    #[error("class {class:?} is invalid: {reason}; accepted: letters, digits, '-', '_', '.', starting with a letter, ending with a letter or digit, at most 63 characters")]
    Class { class: String, reason: &'static str },
    /// A device name that breaks the rules.
    #[error("device name {name:?} is invalid: {reason}; accepted: letters, digits, '-', '_', '.', ':', starting and ending with a letter or digit")]
    Device { name: String, reason: &'static str },
    /// A qualified name without `=` or with an empty side.
    #[error("device {device:?} is not a qualified name; accepted: vendor/class=name (e.g. gpuslice.io/gpu=0)")]
    QualifiedShape { device: String },
    /// A transient spec id that cannot be part of a file name.
    #[error("transient spec id {id:?} is invalid; accepted: a non-empty id of letters, digits, '-', '_', '.'")]
    TransientId { id: String },
}

/// Longest vendor (a DNS subdomain).
pub const MAX_VENDOR_LEN: usize = 253;
/// Longest class.
pub const MAX_CLASS_LEN: usize = 63;

/// A parsed kind, `vendor/class`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    vendor: String,
    class: String,
}

impl Kind {
    /// Parses and validates `vendor/class`.
    pub fn parse(kind: &str) -> Result<Self, NameError> {
        let (vendor, class) = kind
            .split_once('/')
            .filter(|(v, c)| !v.is_empty() && !c.is_empty())
            .ok_or_else(|| NameError::KindShape {
                kind: kind.to_string(),
            })?;
        validate_vendor(vendor)?;
        validate_class(class)?;
        Ok(Self {
            vendor: vendor.to_string(),
            class: class.to_string(),
        })
    }

    /// The vendor, e.g. `gpuslice.io`.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class, e.g. `gpu`.
    pub fn class(&self) -> &str {
        &self.class
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl FromStr for Kind {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A parsed qualified device name, `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    kind: Kind,
    name: String,
}

impl QualifiedName {
    /// Builds a qualified name from a kind and a device name, validating both.
    pub fn new(kind: &str, name: &str) -> Result<Self, NameError> {
        let kind = Kind::parse(kind)?;
        validate_device_name(name)?;
        Ok(Self {
            kind,
            name: name.to_string(),
        })
    }

    /// Parses and validates `vendor/class=name`.
    pub fn parse(device: &str) -> Result<Self, NameError> {
        let (kind, name) = device
            .split_once('=')
            .filter(|(k, n)| !k.is_empty() && !n.is_empty())
            .ok_or_else(|| NameError::QualifiedShape {
                device: device.to_string(),
            })?;
        Self::new(kind, name)
    }

    /// The kind part.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The device name part.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// `vendor/class=name` after validating both parts.
pub fn qualified_name(kind: &str, name: &str) -> Result<String, NameError> {
    QualifiedName::new(kind, name).map(|q| q.to_string())
}

/// True for a syntactically valid qualified device name.
pub fn is_qualified_name(device: &str) -> bool {
    QualifiedName::parse(device).is_ok()
}

/// Checks a vendor: letters, digits, `-`, `_`, `.`; starts with a letter, ends with a letter
/// or digit, no empty DNS label, at most [`MAX_VENDOR_LEN`] characters.
pub fn validate_vendor(vendor: &str) -> Result<(), NameError> {
    let err = |reason| NameError::Vendor {
        vendor: vendor.to_string(),
        reason,
    };
    check_segment(vendor).map_err(err)?;
    if vendor.len() > MAX_VENDOR_LEN {
        return Err(err("longer than 253 characters"));
    }
    if vendor.contains("..") {
        return Err(err("has an empty DNS label"));
    }
    Ok(())
}

/// Checks a class: letters, digits, `-`, `_`, `.`; starts with a letter, ends with a letter
/// or digit, at most [`MAX_CLASS_LEN`] characters. (Dots need CDI 0.6.0.)
pub fn validate_class(class: &str) -> Result<(), NameError> {
    let err = |reason| NameError::Class {
        class: class.to_string(),
        reason,
    };
    check_segment(class).map_err(err)?;
    if class.len() > MAX_CLASS_LEN {
        return Err(err("longer than 63 characters"));
    }
    Ok(())
}

fn check_segment(s: &str) -> Result<(), &'static str> {
    let bytes = s.as_bytes();
    let (first, last) = match (bytes.first(), bytes.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return Err("empty"),
    };
    if !first.is_ascii_alphabetic() {
        return Err("does not start with a letter");
    }
    if !bytes
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Err("has a character other than letters, digits, '-', '_', '.'");
    }
    if !last.is_ascii_alphanumeric() {
        return Err("does not end with a letter or digit");
    }
    Ok(())
}

/// Checks a device name: letters, digits, `-`, `_`, `.`, `:`; starts and ends with a letter
/// or digit. (A leading digit needs CDI 0.5.0.)
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    let err = |reason| NameError::Device {
        name: name.to_string(),
        reason,
    };
    let bytes = name.as_bytes();
    let (first, last) = match (bytes.first(), bytes.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return Err(err("empty")),
    };
    if !first.is_ascii_alphanumeric() {
        return Err(err("does not start with a letter or digit"));
    }
    if !bytes
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'))
    {
        return Err(err(
            "has a character other than letters, digits, '-', '_', '.', ':'",
        ));
    }
    if !last.is_ascii_alphanumeric() {
        return Err(err("does not end with a letter or digit"));
    }
    Ok(())
}

/// The conventional file name of the spec of `kind`: `vendor-class.json`
/// (the reference library's `GenerateSpecName`), e.g. `gpuslice.io-gpu.json`.
pub fn spec_file_name(kind: &str) -> Result<String, NameError> {
    let kind = Kind::parse(kind)?;
    Ok(format!("{}-{}.json", kind.vendor, kind.class))
}

/// The conventional file name of a transient spec of `kind` tied to `id` (a reservation,
/// a claim): `vendor-class_id.json` (the reference library's `GenerateTransientSpecName`),
/// e.g. `gpuslice.io-slice_3f9a0c1d2e4b5a69.json`.
pub fn transient_spec_file_name(kind: &str, id: &str) -> Result<String, NameError> {
    let kind = Kind::parse(kind)?;
    let ok = !id.is_empty()
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && !id.starts_with('.');
    if !ok {
        return Err(NameError::TransientId { id: id.to_string() });
    }
    Ok(format!("{}-{}_{}.json", kind.vendor, kind.class, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        for ok in [
            "gpuslice.io/gpu",
            "vendor.com/foo",
            "foo.bar.baz/foo-bar123.B_az",
            "a/b",
            "x1/y2",
        ] {
            assert!(Kind::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "foo",
            "vendor.com/foo/",
            "vendor.com/foo/bar",
            "/gpu",
            "gpuslice.io/",
            "1v.io/gpu",
            "v.io/-gpu",
            "v.io/gpu-",
            "v-/gpu",
            "v..io/gpu",
            "v.io/g pu",
            "vé.io/gpu",
            "",
        ] {
            assert!(Kind::parse(bad).is_err(), "{bad}");
        }
        let long_class = format!("v.io/{}", "c".repeat(64));
        assert!(matches!(
            Kind::parse(&long_class),
            Err(NameError::Class { .. })
        ));
        let long_vendor = format!("{}/c", "v".repeat(254));
        assert!(matches!(
            Kind::parse(&long_vendor),
            Err(NameError::Vendor { .. })
        ));
    }

    #[test]
    fn device_names() {
        for ok in [
            "0",
            "all",
            "GPU-0b7f3c1e-1111-2222-3333-444455556666",
            "3f9a0c1d2e4b5a69",
            "a:b.c_d-e",
            "x",
        ] {
            assert!(validate_device_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a/b", "a=b", "a b", ":a", "a:"] {
            assert!(validate_device_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn qualified_names_parse_and_build() {
        let q = QualifiedName::parse("gpuslice.io/gpu=GPU-1234").expect("valid");
        assert_eq!(q.kind().vendor(), "gpuslice.io");
        assert_eq!(q.kind().class(), "gpu");
        assert_eq!(q.name(), "GPU-1234");
        assert_eq!(q.to_string(), "gpuslice.io/gpu=GPU-1234");
        assert_eq!(
            qualified_name("gpuslice.io/slice", "3f9a").expect("valid"),
            "gpuslice.io/slice=3f9a"
        );
        for bad in [
            "gpuslice.io/gpu",
            "=0",
            "gpuslice.io/gpu=",
            "gpu=0",
            "/dev/null",
            "gpuslice.io/gpu=a=b",
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_value_and_accepted_form() {
        let e = Kind::parse("gpuslice.io/-x")
            .expect_err("bad class")
            .to_string();
        assert!(e.contains("\"-x\"") && e.contains("accepted"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn file_names() {
        assert_eq!(
            spec_file_name("gpuslice.io/gpu").expect("ok"),
            "gpuslice.io-gpu.json"
        );
        assert_eq!(
            transient_spec_file_name("gpuslice.io/slice", "3f9a0c1d2e4b5a69").expect("ok"),
            "gpuslice.io-slice_3f9a0c1d2e4b5a69.json"
        );
        assert!(transient_spec_file_name("gpuslice.io/slice", "../x").is_err());
        assert!(transient_spec_file_name("gpuslice.io/slice", "").is_err());
        assert!(spec_file_name("nokind").is_err());
    }
}

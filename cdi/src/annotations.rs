//! The annotation rules CDI borrows from Kubernetes (`ValidateAnnotations`): each key is a
//! qualified name (`[dns-subdomain/]name`, checked lowercased) and all keys and values
//! together stay within 256 KiB.

use std::collections::BTreeMap;

/// Upper bound of the summed byte length of all annotation keys and values.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Why an annotation key is not a Kubernetes qualified name, or `None` when it is.
pub(crate) fn key_problem(key: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    let (prefix, name) = match key.split_once('/') {
        None => (None, key.as_str()),
        Some((p, n)) => (Some(p), n),
    };
    if name.contains('/') {
        return Some("has more than one '/'");
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("has an empty prefix before '/'");
        }
        if !is_dns1123_subdomain(prefix) {
            return Some(
                "has a prefix that is not a lowercase DNS subdomain of at most 253 characters",
            );
        }
    }
    if name.is_empty() {
        return Some("has an empty name");
    }
    if name.len() > 63 {
        return Some("has a name longer than 63 characters");
    }
    let b = name.as_bytes();
    let edges_ok = b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if !edges_ok
        || !b
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Some("has a name that is not letters, digits, '-', '_', '.' starting and ending with a letter or digit");
    }
    None
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Summed byte length of all keys and values.
pub(crate) fn total_size(annotations: &BTreeMap<String, String>) -> usize {
    annotations.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for ok in [
            "a",
            "gpuslice.io/node",
            "example.com/Some_Key.v1",
            "A-b",
            "x.y-z/q",
        ] {
            assert_eq!(key_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "a b",
            "under_score.io/x",
            &"k".repeat(64),
            "é",
        ] {
            assert!(key_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn size_counts_keys_and_values() {
        let mut m = BTreeMap::new();
        m.insert("ab".to_string(), "cde".to_string());
        m.insert("f".to_string(), String::new());
        assert_eq!(total_size(&m), 6);
    }
}

//! Mount edits: replace a mount with the same destination, append, then order mounts as
//! the reference library does (stable, by the number of `/` in the cleaned destination,
//! so parents are mounted before their children).

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::oci::{array_mut, string_field};
use super::InjectError;
use crate::model::Mount;

/// Applies `mounts` to `root.mounts`: the same result as removing, for each edit in turn,
/// the mounts with its destination and appending it, then sorting once.
pub(crate) fn apply_mounts(root: &mut Value, mounts: &[Mount]) -> Result<(), InjectError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let list = array_mut(root, &["mounts"])?;
    let edit_destinations: Vec<String> = mounts.iter().map(|m| clean(&m.container_path)).collect();
    let replaced: HashSet<&str> = edit_destinations.iter().map(String::as_str).collect();
    let mut keyed = Vec::with_capacity(list.len() + mounts.len());
    for (i, existing) in list.drain(..).enumerate() {
        let destination = clean(string_field(&existing, "mounts", i, "destination")?);
        if !replaced.contains(destination.as_str()) {
            keyed.push((parts(&destination), existing));
        }
    }
    for (i, (mount, destination)) in mounts.iter().zip(&edit_destinations).enumerate() {
        // A later edit with the same destination replaces this one.
        if !edit_destinations[i + 1..].contains(destination) {
            keyed.push((parts(destination), to_oci(mount)));
        }
    }
    // `sort_by_key` is stable, like Go's `sort.Stable`.
    keyed.sort_by_key(|(parts, _)| *parts);
    list.extend(keyed.into_iter().map(|(_, m)| m));
    Ok(())
}

/// The library's sort key: the number of `/` in the cleaned destination.
fn parts(clean_destination: &str) -> usize {
    clean_destination.matches('/').count()
}

fn to_oci(mount: &Mount) -> Value {
    let mut m = Map::new();
    m.insert("destination".into(), mount.container_path.clone().into());
    if let Some(t) = &mount.mount_type {
        m.insert("type".into(), t.clone().into());
    }
    m.insert("source".into(), mount.host_path.clone().into());
    if !mount.options.is_empty() {
        m.insert("options".into(), mount.options.clone().into());
    }
    Value::Object(m)
}

/// Lexical path cleaning with Go's `filepath.Clean` rules.
pub(crate) fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clean_matches_go() {
        for (input, want) in [
            ("/", "/"),
            ("", "."),
            ("/a/b/", "/a/b"),
            ("//a//b", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("/../a", "/a"),
            ("a/../../b", "../b"),
            ("./", "."),
        ] {
            assert_eq!(clean(input), want, "{input}");
        }
    }

    #[test]
    fn replaces_by_destination_and_sorts_stably() {
        let mut oci = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
            {"destination": "/run/x/", "source": "/old"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        ]});
        let edits = [
            Mount::bind("/new", "/run/x", &["ro"]),
            Mount::bind("/lib.so", "/usr/lib/a/lib.so", &[]),
            Mount::bind("/etc", "/etc2", &[]),
        ];
        apply_mounts(&mut oci, &edits).expect("apply");
        let dests: Vec<&str> = oci["mounts"]
            .as_array()
            .expect("array")
            .iter()
            .map(|m| m["destination"].as_str().expect("str"))
            .collect();
        assert_eq!(
            dests,
            [
                "/proc",
                "/dev",
                "/etc2",
                "/dev/shm",
                "/run/x",
                "/usr/lib/a/lib.so"
            ]
        );
        assert_eq!(
            oci["mounts"][4],
            json!({"destination": "/run/x", "source": "/new", "options": ["ro"]})
        );
    }

    #[test]
    fn a_later_edit_with_the_same_destination_wins() {
        let mut oci = json!({});
        let edits = [
            Mount::bind("/first", "/x", &[]),
            Mount::bind("/other", "/y", &[]),
            Mount::bind("/second", "/x/", &[]),
        ];
        apply_mounts(&mut oci, &edits).expect("apply");
        assert_eq!(
            oci["mounts"],
            json!([
                {"destination": "/y", "source": "/other"},
                {"destination": "/x/", "source": "/second"}
            ])
        );
    }

    #[test]
    fn mount_without_destination_is_a_shape_error() {
        let mut oci = json!({"mounts": [{"source": "x"}]});
        let e = apply_mounts(&mut oci, &[Mount::bind("/a", "/b", &[])])
            .expect_err("shape")
            .to_string();
        assert!(e.contains("mounts[0].destination is not a string"), "{e}");
    }
}

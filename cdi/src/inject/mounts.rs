//! Mount edits: replace a mount with the same destination, append, then order mounts as
//! the reference library does (stable, by the number of `/` in the cleaned destination,
//! so parents are mounted before their children).

use serde_json::{Map, Value};

use super::oci::{array_mut, string_field};
use super::InjectError;
use crate::model::Mount;

/// Applies `mounts` to `root.mounts`.
pub(crate) fn apply_mounts(root: &mut Value, mounts: &[Mount]) -> Result<(), InjectError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let list = array_mut(root, &["mounts"])?;
    for mount in mounts {
        let destination = clean(&mount.container_path);
        let mut kept = Vec::with_capacity(list.len() + 1);
        for (i, existing) in list.drain(..).enumerate() {
            if clean(string_field(&existing, "mounts", i, "destination")?) != destination {
                kept.push(existing);
            }
        }
        kept.push(to_oci(mount));
        *list = kept;
    }
    let mut keyed = Vec::with_capacity(list.len());
    for (i, m) in list.drain(..).enumerate() {
        let parts = clean(string_field(&m, "mounts", i, "destination")?)
            .matches('/')
            .count();
        keyed.push((parts, m));
    }
    // `sort_by_key` is stable, like Go's `sort.Stable`.
    keyed.sort_by_key(|(parts, _)| *parts);
    list.extend(keyed.into_iter().map(|(_, m)| m));
    Ok(())
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
    fn mount_without_destination_is_a_shape_error() {
        let mut oci = json!({"mounts": [{"source": "x"}]});
        let e = apply_mounts(&mut oci, &[Mount::bind("/a", "/b", &[])])
            .expect_err("shape")
            .to_string();
        assert!(e.contains("mounts[0].destination is not a string"), "{e}");
    }
}

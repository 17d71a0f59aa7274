//! The copy edits are applied to: only the parts of an OCI spec that CDI edits touch
//! (`process`, `mounts`, `hooks`, and `linux.devices`, `linux.resources`,
//! `linux.intelRdt`, `linux.netDevices`), so large untouched parts such as the seccomp
//! profile are never copied. It is written back only after every edit succeeded.

use serde_json::{Map, Value};

use super::InjectError;

const TOP_LEVEL: [&str; 3] = ["process", "mounts", "hooks"];
const UNDER_LINUX: [&str; 4] = ["devices", "resources", "intelRdt", "netDevices"];

/// Copies the touched parts of `root` into a spec of the same shape.
pub(crate) fn extract(root: &Value) -> Result<Value, InjectError> {
    let root = root.as_object().ok_or(InjectError::NotAnObject)?;
    let mut scratch = Map::new();
    for key in TOP_LEVEL {
        if let Some(v) = root.get(key) {
            scratch.insert(key.to_string(), v.clone());
        }
    }
    match root.get("linux") {
        Some(Value::Object(linux)) => {
            let mut part = Map::new();
            for key in UNDER_LINUX {
                if let Some(v) = linux.get(key) {
                    part.insert(key.to_string(), v.clone());
                }
            }
            scratch.insert("linux".to_string(), Value::Object(part));
        }
        // Null or a wrong shape: the edits see it as it is.
        Some(other) => {
            scratch.insert("linux".to_string(), other.clone());
        }
        None => {}
    }
    Ok(Value::Object(scratch))
}

/// Stores the edited parts back into `root`; fields keep their positions, new ones are
/// appended in the order the edits created them.
pub(crate) fn write_back(root: &mut Value, scratch: Value) {
    let (Some(root), Value::Object(scratch)) = (root.as_object_mut(), scratch) else {
        return;
    };
    for (key, value) in scratch {
        match (key.as_str(), root.get_mut("linux"), value) {
            ("linux", Some(Value::Object(linux)), Value::Object(edited)) => {
                for (k, v) in edited {
                    linux.insert(k, v);
                }
            }
            (_, _, value) => {
                root.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extracts_only_touched_parts_and_writes_back_in_place() {
        let mut root = json!({
            "ociVersion": "1.0.2",
            "process": {"env": ["A=1"]},
            "linux": {"seccomp": {"big": true}, "devices": [], "resources": {"pids": {"limit": 5}}},
            "hooks": null
        });
        let mut scratch = extract(&root).expect("object");
        assert_eq!(
            scratch,
            json!({"process": {"env": ["A=1"]}, "hooks": null,
                   "linux": {"devices": [], "resources": {"pids": {"limit": 5}}}})
        );
        scratch["linux"]["devices"] = json!([1]);
        scratch["linux"]["netDevices"] = json!({"eth1": {"name": "n"}});
        scratch["mounts"] = json!([]);
        write_back(&mut root, scratch);
        assert_eq!(
            root,
            json!({
                "ociVersion": "1.0.2",
                "process": {"env": ["A=1"]},
                "linux": {"seccomp": {"big": true}, "devices": [1], "resources": {"pids": {"limit": 5}},
                          "netDevices": {"eth1": {"name": "n"}}},
                "hooks": null,
                "mounts": []
            })
        );
        let linux_keys: Vec<&String> = root["linux"].as_object().expect("linux").keys().collect();
        assert_eq!(
            linux_keys,
            ["seccomp", "devices", "resources", "netDevices"]
        );
    }

    #[test]
    fn linux_absent_or_null_is_created() {
        let mut root = json!({"linux": null});
        let mut scratch = extract(&root).expect("object");
        scratch["linux"] = json!({"devices": []});
        write_back(&mut root, scratch);
        assert_eq!(root, json!({"linux": {"devices": []}}));
    }
}

//! A spec read with its devices' edits left unparsed until asked for. A container's create
//! path needs the node spec's common edits and the one or two devices of the GPUs it booked,
//! not the seventeen devices (index, UUID and `all` names) of an 8-GPU node.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::json::JsonError;
use crate::model::{ContainerEdits, Device, Spec};

/// The file as read; the same fields as [`Spec`], unknown fields refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(rename = "cdiVersion")]
    cdi_version: String,
    kind: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    devices: Vec<RawDevice>,
    #[serde(rename = "containerEdits", default)]
    container_edits: ContainerEdits,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(rename = "containerEdits")]
    container_edits: Box<RawValue>,
}

/// A spec whose devices are parsed on demand ([`LazySpec::with_devices`]).
pub struct LazySpec {
    common: Spec,
    devices: Vec<RawDevice>,
}

impl std::fmt::Debug for LazySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazySpec")
            .field("kind", &self.common.kind)
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl LazySpec {
    /// Parses everything but the devices' edits, strictly; nothing is validated (this is for
    /// specs the node wrote and validated itself, see [`read_own_spec`]).
    pub fn parse(bytes: &[u8]) -> Result<LazySpec, JsonError> {
        let w: Wire = serde_json::from_slice(bytes).map_err(JsonError::Parse)?;
        Ok(LazySpec {
            common: Spec {
                cdi_version: w.cdi_version,
                kind: w.kind,
                annotations: w.annotations,
                devices: Vec::new(),
                container_edits: w.container_edits,
            },
            devices: w.devices,
        })
    }

    /// The spec with only the devices named in `names` (in file order; names it lacks are
    /// simply absent, as [`Spec::device`] would say).
    pub fn with_devices(&self, names: &[&str]) -> Result<Spec, JsonError> {
        let mut spec = self.common.clone();
        for d in self
            .devices
            .iter()
            .filter(|d| names.contains(&d.name.as_str()))
        {
            let edits: ContainerEdits =
                serde_json::from_str(d.container_edits.get()).map_err(JsonError::Parse)?;
            spec.devices.push(Device {
                name: d.name.clone(),
                annotations: d.annotations.clone(),
                container_edits: edits,
            });
        }
        Ok(spec)
    }

    /// The names of all devices, in file order.
    pub fn device_names(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|d| d.name.as_str())
    }
}

/// Reads a spec this node wrote (and validated) itself, such as the node spec cache: parsed
/// strictly, not validated again, devices' edits parsed on demand. What a slice takes from it
/// is validated when the slice's own spec is written.
pub fn read_own_spec(path: &Path) -> Result<LazySpec, crate::files::SpecFileError> {
    let bytes = std::fs::read(path).map_err(|source| crate::files::SpecFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    LazySpec::parse(&bytes).map_err(|source| crate::files::SpecFileError::Decode {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceNode, Mount};

    fn spec() -> Spec {
        let mut s = Spec::new("gpuslice.io/gpu");
        for (name, minor) in [("0", 0), ("GPU-a", 0), ("1", 1), ("GPU-b", 1)] {
            s.devices.push(Device::new(
                name,
                ContainerEdits {
                    device_nodes: vec![DeviceNode::char_device(
                        format!("/dev/nvidia{minor}"),
                        195,
                        minor,
                    )],
                    ..Default::default()
                },
            ));
        }
        s.container_edits
            .mounts
            .push(Mount::bind("/a", "/b", &["ro"]));
        s
    }

    #[test]
    fn named_devices_parse_as_the_whole_spec_would() {
        let s = spec();
        let bytes = crate::json::to_json(&s).unwrap_or_else(|e| panic!("{e}"));
        let full = crate::json::from_json(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let lazy = LazySpec::parse(&bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lazy.device_names().collect::<Vec<_>>(),
            ["0", "GPU-a", "1", "GPU-b"]
        );
        let part = lazy
            .with_devices(&["GPU-b", "nope"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(part.devices.len(), 1);
        assert_eq!(part.device("GPU-b"), full.device("GPU-b"));
        assert_eq!(part.container_edits, full.container_edits);
        assert_eq!(
            (part.kind.as_str(), part.cdi_version.as_str()),
            (full.kind.as_str(), full.cdi_version.as_str())
        );
        // All of them: the whole spec.
        let all: Vec<&str> = lazy.device_names().collect();
        assert_eq!(
            lazy.with_devices(&all).unwrap_or_else(|e| panic!("{e}")),
            full
        );
    }

    #[test]
    fn unknown_fields_are_refused_and_a_bad_device_fails_when_asked_for() {
        let bad_top = br#"{"cdiVersion":"0.5.0","kind":"a.b/c","devices":[],"extra":1}"#;
        assert!(matches!(LazySpec::parse(bad_top), Err(JsonError::Parse(_))));
        let bad_dev = br#"{"cdiVersion":"0.5.0","kind":"a.b/c","devices":[
            {"name":"0","containerEdits":{"env":["A=1"]}},
            {"name":"1","containerEdits":{"bogus":true}}]}"#;
        let lazy = LazySpec::parse(bad_dev).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lazy.with_devices(&["0"]).map(|s| s.devices.len()).ok(),
            Some(1)
        );
        let e = lazy
            .with_devices(&["1"])
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}

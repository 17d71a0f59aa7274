//! Strict validation of what the CDI specification requires, beyond what serde checks:
//! names, versions, paths, device node types and permissions, hook names, environment
//! form, annotations, duplicates. Each error is one line naming the field path, e.g.
//! `devices[2].containerEdits.mounts[0].containerPath "run/x" is not an absolute path`.

use std::collections::HashMap;

use crate::annotations::{key_problem, total_size, TOTAL_ANNOTATION_SIZE_LIMIT};
use crate::model::{ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
use crate::names::{validate_device_name, Kind, NameError};
use crate::version::{minimum_version, CdiVersion};

/// The OCI hook names a CDI hook may use.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The device node types CDI accepts: block, character, unbuffered character, FIFO.
pub const DEVICE_TYPES: [&str; 4] = ["b", "c", "u", "p"];

/// The first rule a spec breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `cdiVersion` is not a released version.
    #[error("cdiVersion {value:?} is not a known CDI version; accepted: 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0")]
    UnknownVersion { value: String },
    /// `cdiVersion` is older than the fields used require.
    #[error("cdiVersion {declared} is too old for the fields used; accepted: {required} or newer")]
    VersionTooOld {
        declared: CdiVersion,
        required: CdiVersion,
    },
    /// `kind` breaks the naming rules.
    #[error("kind: {0}")]
    Kind(NameError),
    /// A device name breaks the naming rules.
    #[error("{field}: {source}")]
    DeviceName { field: String, source: NameError },
    /// Two devices, or two net devices, share a name.
    #[error("{field} {value:?} duplicates {first}; accepted: names unique within their list")]
    Duplicate {
        field: String,
        value: String,
        first: String,
    },
    /// The spec has no devices.
    #[error("devices is empty; accepted: at least one device")]
    NoDevices,
    /// A device whose edits change nothing.
    #[error("{field} is empty; accepted: a device with at least one edit")]
    EmptyDeviceEdits { field: String },
    /// A path that must be absolute is not.
    #[error("{field} {value:?} is not an absolute path")]
    NotAbsolute { field: String, value: String },
    /// Any other field whose value is not accepted.
    #[error("{field} {value:?} {problem}; accepted: {accepted}")]
    Invalid {
        field: String,
        value: String,
        problem: &'static str,
        accepted: &'static str,
    },
    /// Annotations over the size limit.
    #[error("{field} hold {size} bytes of keys and values; accepted: at most 262144 bytes")]
    AnnotationsTooLarge { field: String, size: usize },
}

fn invalid(
    field: String,
    value: &str,
    problem: &'static str,
    accepted: &'static str,
) -> ValidationError {
    ValidationError::Invalid {
        field,
        value: value.to_string(),
        problem,
        accepted,
    }
}

impl Spec {
    /// Checks everything the CDI specification requires of a spec, including that
    /// `cdiVersion` is known and not older than the fields used need.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let declared: CdiVersion =
            self.cdi_version
                .parse()
                .map_err(|_| ValidationError::UnknownVersion {
                    value: self.cdi_version.clone(),
                })?;
        let required = minimum_version(self);
        if declared < required {
            return Err(ValidationError::VersionTooOld { declared, required });
        }
        self.validate_content()
    }

    /// Checks everything except `cdiVersion` (which the writer stamps).
    pub fn validate_content(&self) -> Result<(), ValidationError> {
        Kind::parse(&self.kind).map_err(ValidationError::Kind)?;
        validate_annotations("annotations", &self.annotations)?;
        validate_edits(&self.container_edits, "containerEdits")?;
        if self.devices.is_empty() {
            return Err(ValidationError::NoDevices);
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, device) in self.devices.iter().enumerate() {
            let field = format!("devices[{i}]");
            validate_device_name(&device.name).map_err(|source| ValidationError::DeviceName {
                field: format!("{field}.name"),
                source,
            })?;
            if let Some(first) = seen.insert(&device.name, i) {
                return Err(ValidationError::Duplicate {
                    field: format!("{field}.name"),
                    value: device.name.clone(),
                    first: format!("devices[{first}].name"),
                });
            }
            validate_annotations(&format!("{field}.annotations"), &device.annotations)?;
            let edits_field = format!("{field}.containerEdits");
            if device.container_edits.is_empty() {
                return Err(ValidationError::EmptyDeviceEdits { field: edits_field });
            }
            validate_edits(&device.container_edits, &edits_field)?;
        }
        Ok(())
    }
}

fn validate_annotations(
    field: &str,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<(), ValidationError> {
    for key in annotations.keys() {
        if let Some(problem) = key_problem(key) {
            return Err(invalid(
                format!("{field} key"),
                key,
                problem,
                "a qualified name [dns-subdomain/]name, the name at most 63 characters",
            ));
        }
    }
    let size = total_size(annotations);
    if size > TOTAL_ANNOTATION_SIZE_LIMIT {
        return Err(ValidationError::AnnotationsTooLarge {
            field: field.to_string(),
            size,
        });
    }
    Ok(())
}

/// Checks one set of container edits; `field` is its path in the spec, e.g.
/// `devices[0].containerEdits`, and prefixes every error.
pub fn validate_edits(edits: &ContainerEdits, field: &str) -> Result<(), ValidationError> {
    validate_env(&edits.env, &format!("{field}.env"))?;
    for (i, node) in edits.device_nodes.iter().enumerate() {
        validate_device_node(node, &format!("{field}.deviceNodes[{i}]"))?;
    }
    validate_net_devices(&edits.net_devices, &format!("{field}.netDevices"))?;
    for (i, hook) in edits.hooks.iter().enumerate() {
        validate_hook(hook, &format!("{field}.hooks[{i}]"))?;
    }
    for (i, mount) in edits.mounts.iter().enumerate() {
        validate_mount(mount, &format!("{field}.mounts[{i}]"))?;
    }
    if let Some(rdt) = &edits.intel_rdt {
        validate_intel_rdt(rdt, &format!("{field}.intelRdt"))?;
    }
    Ok(())
}

fn validate_env(env: &[String], field: &str) -> Result<(), ValidationError> {
    for (i, entry) in env.iter().enumerate() {
        let key_len = entry.find('=').unwrap_or(0);
        if key_len == 0 || entry.contains('\0') {
            return Err(invalid(
                format!("{field}[{i}]"),
                entry,
                "is not of the form KEY=VALUE",
                "KEY=VALUE with a non-empty KEY and no NUL byte",
            ));
        }
    }
    Ok(())
}

fn validate_absolute(value: &str, field: String) -> Result<(), ValidationError> {
    if !value.starts_with('/') {
        return Err(ValidationError::NotAbsolute {
            field,
            value: value.to_string(),
        });
    }
    if value.contains('\0') {
        return Err(invalid(
            field,
            value,
            "contains a NUL byte",
            "an absolute path without NUL bytes",
        ));
    }
    Ok(())
}

fn validate_device_node(node: &DeviceNode, field: &str) -> Result<(), ValidationError> {
    validate_absolute(&node.path, format!("{field}.path"))?;
    if let Some(host_path) = &node.host_path {
        validate_absolute(host_path, format!("{field}.hostPath"))?;
    }
    if let Some(t) = &node.device_type {
        if !DEVICE_TYPES.contains(&t.as_str()) {
            return Err(invalid(
                format!("{field}.type"),
                t,
                "is not a device node type",
                "b, c, u or p",
            ));
        }
    }
    for (name, number) in [("major", node.major), ("minor", node.minor)] {
        if let Some(n) = number.filter(|n| *n < 0) {
            return Err(invalid(
                format!("{field}.{name}"),
                &n.to_string(),
                "is negative",
                "a number of 0 or more",
            ));
        }
    }
    if let Some(p) = &node.permissions {
        if p.is_empty() || !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(invalid(
                format!("{field}.permissions"),
                p,
                "is not a cgroup access string",
                "a non-empty combination of r, w, m",
            ));
        }
    }
    Ok(())
}

fn validate_hook(hook: &Hook, field: &str) -> Result<(), ValidationError> {
    if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
        return Err(invalid(
            format!("{field}.hookName"),
            &hook.hook_name,
            "is not an OCI hook name",
            "prestart, createRuntime, createContainer, startContainer, poststart, poststop",
        ));
    }
    validate_absolute(&hook.path, format!("{field}.path"))?;
    validate_env(&hook.env, &format!("{field}.env"))?;
    if let Some(t) = hook.timeout {
        if t <= 0 || t > i64::from(u32::MAX) {
            return Err(invalid(
                format!("{field}.timeout"),
                &t.to_string(),
                "is out of range",
                "seconds from 1 to 4294967295",
            ));
        }
    }
    Ok(())
}

fn validate_mount(mount: &Mount, field: &str) -> Result<(), ValidationError> {
    if mount.host_path.is_empty() || mount.host_path.contains('\0') {
        return Err(invalid(
            format!("{field}.hostPath"),
            &mount.host_path,
            "is empty or holds a NUL byte",
            "a non-empty source (a host path for bind mounts)",
        ));
    }
    validate_absolute(&mount.container_path, format!("{field}.containerPath"))?;
    if let Some(t) = &mount.mount_type {
        if t.is_empty() {
            return Err(invalid(
                format!("{field}.type"),
                t,
                "is empty",
                "a filesystem type such as bind or tmpfs, or no type field",
            ));
        }
    }
    for (i, option) in mount.options.iter().enumerate() {
        if option.is_empty() {
            return Err(invalid(
                format!("{field}.options[{i}]"),
                option,
                "is empty",
                "a mount option such as ro, nosuid, bind",
            ));
        }
    }
    Ok(())
}

fn validate_intel_rdt(rdt: &IntelRdt, field: &str) -> Result<(), ValidationError> {
    if let Some(clos) = &rdt.clos_id {
        let bad = clos != "/"
            && (clos.len() >= 4096 || clos == "." || clos == ".." || clos.contains(['/', '\n']));
        if bad {
            return Err(invalid(
                format!("{field}.closID"),
                clos,
                "is not a valid class of service",
                "a file name (no '/', not . or ..) or / for the root class",
            ));
        }
    }
    Ok(())
}

fn validate_net_devices(devices: &[NetDevice], field: &str) -> Result<(), ValidationError> {
    let mut hosts: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, dev) in devices.iter().enumerate() {
        for (sub, value, seen) in [
            (
                "hostInterfaceName",
                dev.host_interface_name.as_str(),
                &mut hosts,
            ),
            ("name", dev.name.as_str(), &mut names),
        ] {
            if !is_interface_name(value) {
                return Err(invalid(
                    format!("{field}[{i}].{sub}"),
                    value,
                    "is not a network interface name",
                    "1 to 15 bytes, not . or .., without '/', ':' or whitespace",
                ));
            }
            if let Some(first) = seen.insert(value, i) {
                return Err(ValidationError::Duplicate {
                    field: format!("{field}[{i}].{sub}"),
                    value: value.to_string(),
                    first: format!("{field}[{first}].{sub}"),
                });
            }
        }
    }
    Ok(())
}

/// The kernel's `dev_valid_name`: shorter than IFNAMSIZ (16), not `.`/`..`, no `/`, `:`,
/// whitespace.
fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Device;

    fn good() -> Spec {
        let mut s = Spec::new("gpuslice.io/gpu");
        s.cdi_version = "0.5.0".into();
        s.devices.push(Device::new(
            "0",
            ContainerEdits {
                env: vec!["A=1".into()],
                ..Default::default()
            },
        ));
        s.devices.push(Device::new(
            "all",
            ContainerEdits {
                device_nodes: vec![DeviceNode::char_device("/dev/nvidia0", 195, 0)],
                mounts: vec![Mount::bind(
                    "/usr/lib/x.so",
                    "/usr/lib/x.so",
                    &["ro", "nosuid", "bind"],
                )],
                hooks: vec![Hook {
                    hook_name: "createRuntime".into(),
                    path: "/usr/bin/gpuslice".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ));
        s
    }

    fn err_of(mutate: impl FnOnce(&mut Spec)) -> String {
        let mut s = good();
        mutate(&mut s);
        let e = s.validate().expect_err("should be invalid").to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    #[test]
    fn good_spec_passes() {
        good().validate().expect("valid");
    }

    #[test]
    fn errors_name_the_field_path() {
        let e = err_of(|s| s.devices[1].container_edits.mounts[0].container_path = "run/x".into());
        assert_eq!(
            e,
            "devices[1].containerEdits.mounts[0].containerPath \"run/x\" is not an absolute path"
        );
        let e = err_of(|s| s.devices[1].container_edits.device_nodes[0].path = "dev/x".into());
        assert!(
            e.starts_with("devices[1].containerEdits.deviceNodes[0].path \"dev/x\""),
            "{e}"
        );
        let e = err_of(|s| s.devices[1].container_edits.hooks[0].path = "gpuslice".into());
        assert!(
            e.starts_with("devices[1].containerEdits.hooks[0].path"),
            "{e}"
        );
        let e = err_of(|s| s.container_edits.env.push("NOVALUE".into()));
        assert!(e.starts_with("containerEdits.env[0] \"NOVALUE\""), "{e}");
        let e = err_of(|s| s.container_edits.env.push("=x".into()));
        assert!(e.starts_with("containerEdits.env[0]"), "{e}");
    }

    #[test]
    fn device_node_rules() {
        let e =
            err_of(|s| s.devices[1].container_edits.device_nodes[0].device_type = Some("x".into()));
        assert!(
            e.contains(".type \"x\"") && e.contains("b, c, u or p"),
            "{e}"
        );
        let e = err_of(|s| {
            s.devices[1].container_edits.device_nodes[0].permissions = Some("rwx".into())
        });
        assert!(e.contains(".permissions \"rwx\""), "{e}");
        let e = err_of(|s| {
            s.devices[1].container_edits.device_nodes[0].permissions = Some(String::new())
        });
        assert!(e.contains(".permissions"), "{e}");
        let e = err_of(|s| s.devices[1].container_edits.device_nodes[0].major = Some(-1));
        assert!(e.contains(".major \"-1\""), "{e}");
        let e = err_of(|s| {
            s.devices[1].container_edits.device_nodes[0].host_path = Some("nvidia0".into())
        });
        assert!(
            e.contains(".hostPath \"nvidia0\" is not an absolute path"),
            "{e}"
        );
        for ok in ["r", "rw", "mwr", "rwm"] {
            let mut s = good();
            s.devices[1].container_edits.device_nodes[0].permissions = Some(ok.into());
            s.validate().expect(ok);
        }
        for t in DEVICE_TYPES {
            let mut s = good();
            s.devices[1].container_edits.device_nodes[0].device_type = Some(t.into());
            s.validate().expect(t);
        }
    }

    #[test]
    fn hook_rules() {
        let e = err_of(|s| s.devices[1].container_edits.hooks[0].hook_name = "preStart".into());
        assert!(
            e.contains("hookName \"preStart\"") && e.contains("createRuntime"),
            "{e}"
        );
        let e = err_of(|s| s.devices[1].container_edits.hooks[0].timeout = Some(0));
        assert!(e.contains("hooks[0].timeout"), "{e}");
        let e = err_of(|s| s.devices[1].container_edits.hooks[0].env = vec!["PATH".into()]);
        assert!(e.contains("hooks[0].env[0]"), "{e}");
        for name in HOOK_NAMES {
            let mut s = good();
            s.devices[1].container_edits.hooks[0].hook_name = name.into();
            s.validate().expect(name);
        }
    }

    #[test]
    fn spec_level_rules() {
        let e = err_of(|s| s.devices[1].name = "0".into());
        assert_eq!(e, "devices[1].name \"0\" duplicates devices[0].name; accepted: names unique within their list");
        let e = err_of(|s| s.devices[0].name = "-0".into());
        assert!(e.starts_with("devices[0].name: device name \"-0\""), "{e}");
        let e = err_of(|s| s.devices.clear());
        assert!(e.starts_with("devices is empty"), "{e}");
        let e = err_of(|s| s.devices[0].container_edits = ContainerEdits::default());
        assert!(e.starts_with("devices[0].containerEdits is empty"), "{e}");
        let e = err_of(|s| s.kind = "gpuslice.io".into());
        assert!(e.starts_with("kind: kind \"gpuslice.io\""), "{e}");
        let e = err_of(|s| s.cdi_version = "0.2.0".into());
        assert!(e.starts_with("cdiVersion \"0.2.0\""), "{e}");
        let e = err_of(|s| s.cdi_version = "0.4.0".into());
        assert!(e.contains("0.5.0 or newer"), "{e}");
    }

    #[test]
    fn annotation_rules() {
        let e = err_of(|s| {
            s.cdi_version = "0.6.0".into();
            s.devices[0]
                .annotations
                .insert("bad key".into(), "v".into());
        });
        assert!(
            e.starts_with("devices[0].annotations key \"bad key\""),
            "{e}"
        );
        let e = err_of(|s| {
            s.cdi_version = "0.6.0".into();
            s.annotations
                .insert("big".into(), "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT));
        });
        assert!(e.starts_with("annotations hold 262147 bytes"), "{e}");
        let mut s = good();
        s.cdi_version = "0.6.0".into();
        s.annotations
            .insert("gpuslice.io/generated-by".into(), "gpuslice".into());
        s.validate().expect("valid annotation");
    }

    #[test]
    fn net_device_and_rdt_rules() {
        let e = err_of(|s| {
            s.cdi_version = "1.1.0".into();
            s.container_edits.net_devices = vec![
                NetDevice {
                    host_interface_name: "eth1".into(),
                    name: "net0".into(),
                },
                NetDevice {
                    host_interface_name: "eth2".into(),
                    name: "net0".into(),
                },
            ];
        });
        assert!(e.starts_with("containerEdits.netDevices[1].name \"net0\" duplicates containerEdits.netDevices[0].name"), "{e}");
        let e = err_of(|s| {
            s.cdi_version = "1.1.0".into();
            s.container_edits.net_devices = vec![NetDevice {
                host_interface_name: "a-very-long-name0".into(),
                name: "n".into(),
            }];
        });
        assert!(e.contains("hostInterfaceName"), "{e}");
        let e = err_of(|s| {
            s.cdi_version = "0.7.0".into();
            s.container_edits.intel_rdt = Some(IntelRdt {
                clos_id: Some("a/b".into()),
                ..Default::default()
            });
        });
        assert!(
            e.starts_with("containerEdits.intelRdt.closID \"a/b\""),
            "{e}"
        );
        let mut s = good();
        s.cdi_version = "0.7.0".into();
        s.container_edits.intel_rdt = Some(IntelRdt {
            clos_id: Some("/".into()),
            ..Default::default()
        });
        s.validate().expect("root clos");
    }

    #[test]
    fn mount_rules() {
        let e = err_of(|s| s.devices[1].container_edits.mounts[0].host_path = String::new());
        assert!(
            e.starts_with("devices[1].containerEdits.mounts[0].hostPath"),
            "{e}"
        );
        let e = err_of(|s| {
            s.devices[1].container_edits.mounts[0]
                .options
                .push(String::new())
        });
        assert!(
            e.starts_with("devices[1].containerEdits.mounts[0].options[3]"),
            "{e}"
        );
    }
}

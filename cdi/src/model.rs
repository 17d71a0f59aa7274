//! The CDI spec data model, every field up to CDI 1.1.0, with the JSON names of the
//! reference `specs-go` package; empty and absent fields are omitted so output is minimal.
//!
//! Strings that the specification restricts (kinds, names, device types, permissions, hook
//! names) stay strings here so that a file read from disk reaches [`Spec::validate`], which
//! reports every problem with its field path; the constructors below produce valid values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A CDI spec file: a kind (`vendor/class`), its devices, and edits common to all of them.
///
/// Unknown fields are rejected on reading, as the reference library does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The CDI version the file claims. The writer replaces it with the lowest version
    /// that expresses the fields used ([`crate::minimum_version`]).
    #[serde(rename = "cdiVersion")]
    pub cdi_version: String,
    /// `vendor/class`, e.g. `gpuslice.io/gpu`.
    pub kind: String,
    /// CDI-level metadata (added in 0.6.0); not applied to containers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices this spec names; at least one.
    pub devices: Vec<Device>,
    /// Edits applied once whenever any device of this spec is injected.
    #[serde(
        rename = "containerEdits",
        default,
        skip_serializing_if = "ContainerEdits::is_empty"
    )]
    pub container_edits: ContainerEdits,
}

/// One device of a spec, requested as `kind=name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// The device name, unique within the spec (e.g. `0`, `GPU-…`, `all`).
    pub name: String,
    /// CDI-level metadata (added in 0.6.0); not applied to containers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The edits this device makes; must not be empty.
    #[serde(rename = "containerEdits")]
    pub container_edits: ContainerEdits,
}

/// Edits to an OCI runtime spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries, replacing a variable of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create, each with a device cgroup allow rule.
    #[serde(rename = "deviceNodes", default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Host network interfaces moved into the container (added in 1.1.0).
    #[serde(rename = "netDevices", default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add, replacing a mount with the same destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Intel RDT settings (added in 0.7.0).
    #[serde(rename = "intelRdt", default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Supplementary groups of the container process (added in 0.7.0).
    #[serde(
        rename = "additionalGids",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// True when these edits change nothing (allowed for a spec, not for a device).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.net_devices.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
    }

    /// Appends `other` after `self`, as the reference library merges the spec's edits with
    /// each requested device's: lists concatenate, a later `intelRdt` wins.
    pub fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.net_devices.extend(other.net_devices.iter().cloned());
        self.hooks.extend(other.hooks.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt.clone_from(&other.intel_rdt);
        }
        self.additional_gids
            .extend(other.additional_gids.iter().copied());
    }
}

/// A device node in the container.
///
/// `type`, `major` and `minor` may be left out; they are then taken from the host node
/// (`hostPath`, else `path`) when the edits are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceNode {
    /// Absolute path in the container.
    pub path: String,
    /// Absolute path of the node on the host, when it differs from `path` (added in 0.5.0).
    #[serde(rename = "hostPath", default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `b` (block), `c` or `u` (character), `p` (FIFO).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub device_type: Option<String>,
    /// Major number; 0 or absent means "from the host node".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node (Go `os.FileMode` bits).
    #[serde(rename = "fileMode", default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access, a combination of `r`, `w`, `m`; `rwm` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// A character device at `path` in the container, backed by the same host path.
    pub fn char_device(path: impl Into<String>, major: i64, minor: i64) -> Self {
        Self {
            path: path.into(),
            device_type: Some("c".to_string()),
            major: Some(major),
            minor: Some(minor),
            ..Self::default()
        }
    }
}

/// A mount in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Source on the host (a path for bind mounts).
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// Absolute destination in the container.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// OCI mount options, e.g. `ro`, `nosuid`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Filesystem type, e.g. `bind` (added in 0.4.0).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

impl Mount {
    /// A bind mount of `host_path` at `container_path` with the given options; no `type`
    /// field, so it stays expressible in CDI 0.3.0.
    pub fn bind(
        host_path: impl Into<String>,
        container_path: impl Into<String>,
        options: &[&str],
    ) -> Self {
        Self {
            host_path: host_path.into(),
            container_path: container_path.into(),
            options: options.iter().map(|o| (*o).to_string()).collect(),
            mount_type: None,
        }
    }
}

/// An OCI hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    /// One of [`crate::HOOK_NAMES`].
    #[serde(rename = "hookName")]
    pub hook_name: String,
    /// Absolute path of the program.
    pub path: String,
    /// `argv`, including `argv[0]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The hook's whole environment, `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds before the hook is aborted; greater than zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT settings as in CDI 1.1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntelRdt {
    /// Class of service: a file name, or `/` for the root class.
    #[serde(rename = "closID", default, skip_serializing_if = "Option::is_none")]
    pub clos_id: Option<String>,
    /// L3 cache schema line.
    #[serde(
        rename = "l3CacheSchema",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub l3_cache_schema: Option<String>,
    /// Memory bandwidth schema line.
    #[serde(
        rename = "memBwSchema",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_bw_schema: Option<String>,
    /// Raw schemata lines (added in 1.1.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemata: Vec<String>,
    /// Enable resctrl monitoring (added in 1.1.0).
    #[serde(
        rename = "enableMonitoring",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub enable_monitoring: bool,
}

/// A host network interface moved into the container (added in 1.1.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetDevice {
    /// Interface name on the host.
    #[serde(rename = "hostInterfaceName")]
    pub host_interface_name: String,
    /// Interface name in the container.
    pub name: String,
}

impl Spec {
    /// An empty spec of `kind`; the version is stamped when it is written.
    pub fn new(kind: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            ..Self::default()
        }
    }

    /// The device called `name`, if any.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// The qualified names (`kind=name`) of all devices, in spec order.
    pub fn qualified_device_names(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| format!("{}={}", self.kind, d.name))
            .collect()
    }
}

impl Device {
    /// A device called `name` with `edits`.
    pub fn new(name: impl Into<String>, edits: ContainerEdits) -> Self {
        Self {
            name: name.into(),
            annotations: BTreeMap::new(),
            container_edits: edits,
        }
    }
}

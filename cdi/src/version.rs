//! CDI versions and the lowest version that expresses the fields a spec uses, with the
//! rules of the reference library's `specs-go/version.go`. Engines reject versions newer
//! than their library knows (podman 4.3 knows 0.3.0–0.5.0), so writers stamp the lowest.

use std::fmt;
use std::str::FromStr;

use crate::model::{ContainerEdits, Spec};

/// A CDI version string that is not a released version this crate knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CDI version {version:?} is not known; accepted: 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0")]
pub struct VersionError {
    /// The rejected text.
    pub version: String,
}

/// A released CDI specification version, ordered oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CdiVersion {
    /// Earliest supported: env, deviceNodes, mounts, hooks.
    V0_3_0,
    /// Adds `mounts[].type`.
    V0_4_0,
    /// Adds `deviceNodes[].hostPath`; device names may start with a digit.
    V0_5_0,
    /// Adds spec and device `annotations`; dots in the class of `kind`.
    V0_6_0,
    /// Adds `intelRdt` and `additionalGids`.
    V0_7_0,
    /// No spec change.
    V0_8_0,
    /// No spec change.
    V1_0_0,
    /// Adds `netDevices`, `intelRdt.schemata` and `intelRdt.enableMonitoring`.
    V1_1_0,
}

impl CdiVersion {
    /// Every known version, oldest first.
    pub const ALL: [CdiVersion; 8] = [
        Self::V0_3_0,
        Self::V0_4_0,
        Self::V0_5_0,
        Self::V0_6_0,
        Self::V0_7_0,
        Self::V0_8_0,
        Self::V1_0_0,
        Self::V1_1_0,
    ];
    /// The newest version this crate knows.
    pub const LATEST: CdiVersion = Self::V1_1_0;

    /// The version as written in `cdiVersion`, e.g. `0.5.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_4_0 => "0.4.0",
            Self::V0_5_0 => "0.5.0",
            Self::V0_6_0 => "0.6.0",
            Self::V0_7_0 => "0.7.0",
            Self::V0_8_0 => "0.8.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CdiVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| VersionError {
                version: s.to_string(),
            })
    }
}

/// The lowest CDI version that expresses every field `spec` uses.
pub fn minimum_version(spec: &Spec) -> CdiVersion {
    let all_edits = || {
        std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits))
    };
    if all_edits().any(requires_v1_1_0) {
        return CdiVersion::V1_1_0;
    }
    if all_edits().any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty()) {
        return CdiVersion::V0_7_0;
    }
    let class_has_dot = spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || class_has_dot
    {
        return CdiVersion::V0_6_0;
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
        || all_edits().any(|e| {
            e.device_nodes
                .iter()
                .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()))
        })
    {
        return CdiVersion::V0_5_0;
    }
    if all_edits().any(|e| {
        e.mounts
            .iter()
            .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
    }) {
        return CdiVersion::V0_4_0;
    }
    CdiVersion::V0_3_0
}

fn requires_v1_1_0(edits: &ContainerEdits) -> bool {
    !edits.net_devices.is_empty()
        || edits
            .intel_rdt
            .as_ref()
            .is_some_and(|r| !r.schemata.is_empty() || r.enable_monitoring)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerEdits, Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn spec_with(kind: &str, name: &str, edits: ContainerEdits) -> Spec {
        let mut s = Spec::new(kind);
        s.devices.push(Device::new(name, edits));
        s
    }

    fn env_edits() -> ContainerEdits {
        ContainerEdits {
            env: vec!["A=1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn each_feature_raises_the_version_it_was_added_in() {
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", env_edits())),
            CdiVersion::V0_3_0
        );

        let typed_mount = ContainerEdits {
            mounts: vec![Mount {
                mount_type: Some("bind".into()),
                ..Mount::bind("/a", "/b", &[])
            }],
            ..Default::default()
        };
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", typed_mount)),
            CdiVersion::V0_4_0
        );
        let untyped_mount = ContainerEdits {
            mounts: vec![Mount::bind("/a", "/b", &["ro"])],
            ..Default::default()
        };
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", untyped_mount)),
            CdiVersion::V0_3_0
        );

        assert_eq!(
            minimum_version(&spec_with("v.io/c", "0", env_edits())),
            CdiVersion::V0_5_0
        );
        let host_path = ContainerEdits {
            device_nodes: vec![DeviceNode {
                host_path: Some("/dev/x".into()),
                ..DeviceNode::char_device("/dev/y", 1, 3)
            }],
            ..Default::default()
        };
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", host_path)),
            CdiVersion::V0_5_0
        );

        assert_eq!(
            minimum_version(&spec_with("v.io/c.d", "dev", env_edits())),
            CdiVersion::V0_6_0
        );
        let mut annotated = spec_with("v.io/c", "dev", env_edits());
        annotated.annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&annotated), CdiVersion::V0_6_0);
        let mut dev_annotated = spec_with("v.io/c", "dev", env_edits());
        dev_annotated.devices[0]
            .annotations
            .insert("a".into(), "b".into());
        assert_eq!(minimum_version(&dev_annotated), CdiVersion::V0_6_0);

        let mut gids = spec_with("v.io/c", "dev", env_edits());
        gids.container_edits.additional_gids.push(44);
        assert_eq!(minimum_version(&gids), CdiVersion::V0_7_0);
        let rdt = ContainerEdits {
            intel_rdt: Some(IntelRdt {
                clos_id: Some("c".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", rdt)),
            CdiVersion::V0_7_0
        );

        let rdt_mon = ContainerEdits {
            intel_rdt: Some(IntelRdt {
                enable_monitoring: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            minimum_version(&spec_with("v.io/c", "dev", rdt_mon)),
            CdiVersion::V1_1_0
        );
        let mut net = spec_with("v.io/c", "dev", env_edits());
        net.container_edits.net_devices.push(NetDevice {
            host_interface_name: "eth1".into(),
            name: "net0".into(),
        });
        assert_eq!(minimum_version(&net), CdiVersion::V1_1_0);
    }

    #[test]
    fn parse_and_order() {
        assert_eq!(
            "0.5.0".parse::<CdiVersion>().expect("known"),
            CdiVersion::V0_5_0
        );
        assert!("0.2.0".parse::<CdiVersion>().is_err());
        assert!("v0.5.0".parse::<CdiVersion>().is_err());
        assert!(CdiVersion::V0_5_0 < CdiVersion::V0_6_0);
        for v in CdiVersion::ALL {
            assert_eq!(v.as_str().parse::<CdiVersion>().expect("round trip"), v);
        }
    }
}

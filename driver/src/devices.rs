//! NVIDIA device nodes under a driver root: `/dev/nvidia<N>`, `nvidiactl`, `nvidia-uvm`,
//! `nvidia-uvm-tools` and `nvidia-modeset`, with their real major and minor numbers.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Major number of `/dev/nvidia<N>`, `nvidiactl` and `nvidia-modeset`.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor number of `/dev/nvidia-modeset`.
pub const MODESET_MINOR: u32 = 254;

/// What a device node is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeKind {
    /// `/dev/nvidia<minor>`: one GPU.
    Gpu(u32),
    /// `/dev/nvidiactl`.
    Control,
    /// `/dev/nvidia-uvm`.
    Uvm,
    /// `/dev/nvidia-uvm-tools`.
    UvmTools,
    /// `/dev/nvidia-modeset`.
    Modeset,
}

/// One character device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    pub kind: NodeKind,
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub container_path: PathBuf,
    /// Path on the host, under the driver root.
    pub host_path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

/// The device nodes of a driver root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceNodes {
    /// GPU nodes by minor number.
    pub gpus: BTreeMap<u32, DeviceNode>,
    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset` as present.
    pub control: Vec<DeviceNode>,
}

impl DeviceNodes {
    /// The node of the GPU with this minor number.
    pub fn gpu(&self, minor: u32) -> Option<&DeviceNode> {
        self.gpus.get(&minor)
    }
}

/// Device nodes that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("cannot list device nodes in {dir}: {source}")]
    ReadDir { dir: PathBuf, source: io::Error },
    #[error("cannot inspect device node {path}: {source}")]
    Stat { path: PathBuf, source: io::Error },
    #[error("{path} is not a character device; expected an NVIDIA device node")]
    NotCharDevice { path: PathBuf },
    #[error("no {path}: the NVIDIA control device is missing (is the driver loaded? `nvidia-modprobe` creates it)")]
    NoControl { path: PathBuf },
}

/// The seam to inspect device files (tests use fixtures instead of real nodes).
pub trait NodeInspector {
    /// `Some((major, minor))` for a character device, `None` for anything else.
    fn char_device(&self, path: &Path) -> io::Result<Option<(u32, u32)>>;
}

/// Inspects real files with `stat`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealInspector;

impl NodeInspector for RealInspector {
    fn char_device(&self, path: &Path) -> io::Result<Option<(u32, u32)>> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(path)?;
        if !meta.file_type().is_char_device() {
            return Ok(None);
        }
        let dev = meta.rdev();
        Ok(Some((rustix::fs::major(dev), rustix::fs::minor(dev))))
    }
}

fn control_kind(name: &str) -> Option<NodeKind> {
    Some(match name {
        "nvidiactl" => NodeKind::Control,
        "nvidia-uvm" => NodeKind::Uvm,
        "nvidia-uvm-tools" => NodeKind::UvmTools,
        "nvidia-modeset" => NodeKind::Modeset,
        _ => return None,
    })
}

/// Finds the NVIDIA device nodes in `<root>/dev`. `nvidiactl` must exist; GPU nodes are
/// `nvidia<N>`; the others are taken when present.
pub fn discover_device_nodes(
    root: &Path,
    inspector: &dyn NodeInspector,
) -> Result<DeviceNodes, DevicesError> {
    let dev = root.join("dev");
    let entries = std::fs::read_dir(&dev).map_err(|source| DevicesError::ReadDir {
        dir: dev.clone(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    names.sort();
    let mut nodes = DeviceNodes::default();
    for name in names {
        let gpu_minor = name
            .strip_prefix("nvidia")
            .filter(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|rest| rest.parse::<u32>().ok());
        let kind = match (gpu_minor, control_kind(&name)) {
            (Some(n), _) => NodeKind::Gpu(n),
            (None, Some(k)) => k,
            (None, None) => continue, // e.g. nvidia-caps/, nvidia-nvswitchctl: not needed
        };
        let host_path = dev.join(&name);
        let (major, minor) = inspector
            .char_device(&host_path)
            .map_err(|source| DevicesError::Stat {
                path: host_path.clone(),
                source,
            })?
            .ok_or_else(|| DevicesError::NotCharDevice {
                path: host_path.clone(),
            })?;
        let node = DeviceNode {
            kind,
            container_path: PathBuf::from("/dev").join(&name),
            host_path,
            major,
            minor,
        };
        match kind {
            NodeKind::Gpu(_) => {
                nodes.gpus.insert(minor, node);
            }
            _ => nodes.control.push(node),
        }
    }
    if !nodes.control.iter().any(|n| n.kind == NodeKind::Control) {
        return Err(DevicesError::NoControl {
            path: dev.join("nvidiactl"),
        });
    }
    nodes.control.sort_by_key(|n| n.kind);
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fixture(HashMap<String, (u32, u32)>);

    impl NodeInspector for Fixture {
        fn char_device(&self, path: &Path) -> io::Result<Option<(u32, u32)>> {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            Ok(self.0.get(name).copied())
        }
    }

    fn root_with(names: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("dev/nvidia-caps")).expect("mkdir");
        for n in names {
            std::fs::write(root.path().join("dev").join(n), b"").expect("touch");
        }
        root
    }

    #[test]
    fn finds_gpus_and_control_nodes_with_numbers() {
        let root = root_with(&[
            "nvidia0",
            "nvidia1",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
            "null",
        ]);
        let fx = Fixture(HashMap::from([
            ("nvidia0".into(), (195, 0)),
            ("nvidia1".into(), (195, 1)),
            ("nvidiactl".into(), (195, 255)),
            ("nvidia-uvm".into(), (508, 0)),
            ("nvidia-uvm-tools".into(), (508, 1)),
            ("nvidia-modeset".into(), (195, 254)),
        ]));
        let nodes = discover_device_nodes(root.path(), &fx).expect("discover");
        assert_eq!(nodes.gpus.len(), 2);
        let g1 = nodes.gpu(1).expect("gpu 1");
        assert_eq!((g1.major, g1.minor), (195, 1));
        assert_eq!(g1.container_path, Path::new("/dev/nvidia1"));
        assert_eq!(g1.host_path, root.path().join("dev/nvidia1"));
        let kinds: Vec<_> = nodes
            .control
            .iter()
            .map(|n| (n.kind, n.major, n.minor))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (NodeKind::Control, 195, 255),
                (NodeKind::Uvm, 508, 0),
                (NodeKind::UvmTools, 508, 1),
                (NodeKind::Modeset, 195, 254)
            ]
        );
    }

    #[test]
    fn missing_control_node_is_an_error() {
        let root = root_with(&["nvidia0"]);
        let fx = Fixture(HashMap::from([("nvidia0".into(), (195, 0))]));
        let e = discover_device_nodes(root.path(), &fx).expect_err("no nvidiactl");
        assert!(e.to_string().contains("nvidiactl"), "{e}");
    }

    #[test]
    fn regular_file_is_refused() {
        let root = root_with(&["nvidia0", "nvidiactl"]);
        let fx = Fixture(HashMap::from([("nvidiactl".into(), (195, 255))]));
        let e = discover_device_nodes(root.path(), &fx).expect_err("nvidia0 is a file");
        assert!(
            e.to_string().contains("nvidia0 is not a character device"),
            "{e}"
        );
    }

    #[test]
    fn missing_dev_dir_names_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let e = discover_device_nodes(root.path(), &RealInspector).expect_err("no dev");
        assert!(e.to_string().contains("/dev"), "{e}");
    }
}

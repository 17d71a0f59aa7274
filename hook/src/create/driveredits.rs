//! The driver's container edits: device nodes, driver-library mounts and, on a simulated
//! node, the simulated driver's state — discovered once by `gpuslice cdi generate` and
//! shared by the node spec (whole GPUs) and every slice spec.

use std::collections::BTreeMap;

use gpuslice_cdi::{DeviceNode, Mount};
use gpuslice_config::Config;
use gpuslice_driver::{
    discover_device_nodes, discover_libraries, DevicesError, LibrariesError, NodeKind,
    RealInspector, COMPUTE_LIBRARIES,
};

use gpuslice_driver::simnode::SimLayout;

/// Mount options of driver files: read-only, no setuid, no device files.
pub const RO_BIND: &[&str] = &["ro", "nosuid", "nodev", "bind"];
/// Mount options of files a container may write.
pub const RW_BIND: &[&str] = &["rw", "nosuid", "nodev", "bind"];

/// The driver could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum DriverEditsError {
    #[error("driver root {root}: {source}")]
    Devices { root: String, source: DevicesError },
    #[error("driver root {root}: {source}")]
    Libraries {
        root: String,
        source: LibrariesError,
    },
    #[error("driver root {root} has no libcuda.so: the NVIDIA user-space driver is not installed there (set driver.root)")]
    NoLibcuda { root: String },
}

/// What every GPU container gets from the driver, and each GPU's own node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverEdits {
    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset` as present.
    pub control: Vec<DeviceNode>,
    /// `/dev/nvidia<minor>` by minor number.
    pub gpus: BTreeMap<u32, DeviceNode>,
    /// Driver libraries (and the simulated driver's state on a simulated node).
    pub mounts: Vec<Mount>,
}

fn cdi_node(n: &gpuslice_driver::DeviceNode) -> DeviceNode {
    let container = n.container_path.display().to_string();
    let host = n.host_path.display().to_string();
    let mut node =
        DeviceNode::char_device(container.clone(), i64::from(n.major), i64::from(n.minor));
    if host != container {
        node.host_path = Some(host);
    }
    node
}

/// Discovers the driver of `config` (its driver root, `state_dir/sim` when simulated).
pub fn discover(config: &Config) -> Result<DriverEdits, DriverEditsError> {
    let root = config.effective_driver_root();
    let shown = root.display().to_string();
    let nodes = discover_device_nodes(&root, &RealInspector).map_err(|source| {
        DriverEditsError::Devices {
            root: shown.clone(),
            source,
        }
    })?;
    let libraries = discover_libraries(&root, COMPUTE_LIBRARIES).map_err(|source| {
        DriverEditsError::Libraries {
            root: shown.clone(),
            source,
        }
    })?;
    if !libraries
        .iter()
        .any(|l| l.soname.starts_with("libcuda.so."))
    {
        return Err(DriverEditsError::NoLibcuda { root: shown });
    }
    let mut mounts: Vec<Mount> = libraries
        .iter()
        .map(|l| {
            Mount::bind(
                l.host_path.display().to_string(),
                l.container_path.display().to_string(),
                RO_BIND,
            )
        })
        .collect();
    // nvidia-smi and the driver's other utility programs, when the host has them.
    let binaries = gpuslice_driver::discover_binaries(&root, gpuslice_driver::UTILITY_BINARIES)
        .map_err(|source| DriverEditsError::Libraries {
            root: shown.clone(),
            source,
        })?;
    mounts.extend(binaries.iter().map(|b| {
        Mount::bind(
            b.host_path.display().to_string(),
            b.container_path.display().to_string(),
            RO_BIND,
        )
    }));
    if config.is_simulated() {
        let state = SimLayout::of(config).state;
        mounts.push(Mount::bind(
            state.display().to_string(),
            gpuslice_driver::simulated::CONTAINER_STATE_DIR,
            RW_BIND,
        ));
    }
    Ok(DriverEdits {
        // Compute and NVML need nvidiactl and the UVM nodes; nvidia-modeset is for display.
        control: nodes
            .control
            .iter()
            .filter(|n| n.kind != NodeKind::Modeset)
            .map(cdi_node)
            .collect(),
        gpus: nodes.gpus.iter().map(|(m, n)| (*m, cdi_node(n))).collect(),
        mounts,
    })
}

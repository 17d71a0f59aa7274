//! The node's GPU inventory: from NVML through nvml-wrapper on a real node, or from the
//! config's `[[inventory.simulated]]` list on a simulated one.

use std::ffi::OsStr;
use std::path::Path;

use gpuslice_config::{Config, InventorySource};
use nvml_wrapper_sys::bindings::NvmlLib;

use crate::memory::{bookable_memory, device_memory};

/// One GPU as the driver reports it (NVML) or the config simulates it. `gpuslice cdi
/// generate` caches these in the registry's inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub model: String,
    /// Memory gpuslice books, in bytes: NVML's total less what the driver reserves, what
    /// CUDA can allocate ([`crate::memory::bookable_memory`]).
    pub memory_total: u64,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `DDDDDDDD:BB:DD.F`, as NVML prints it, where known.
    pub pci_bus_id: Option<String>,
    /// The NUMA node of the GPU's PCI device, where the kernel tells.
    pub numa_node: Option<i32>,
    /// The PCIe root complex the GPU hangs off (`pci<domain>:<bus>`, as sysfs names it),
    /// where sysfs tells: what aligns a GPU with a NIC under the same root.
    pub pcie_root: Option<String>,
}

/// A GPU NVML counts but cannot read (fallen off the bus, `NVML_ERROR_GPU_IS_LOST`, or
/// any other failure of a query the inventory needs). It is left out of the inventory, so
/// nothing offers or books it; the GPUs around it keep their own index and minor number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {index}: NVML cannot read it ({what}: {detail}); it is left out of the inventory, so no one is given it until it reads and `gpuslice cdi generate` runs again")]
pub struct UnreadableGpu {
    /// NVML index.
    pub index: u32,
    /// The query that failed, with the UUID where it was read before.
    pub what: String,
    /// NVML's error.
    pub detail: String,
}

/// The node's GPUs: those that could be read, and those NVML counts but cannot read (none
/// on a simulated inventory, which reads the config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInventory {
    pub gpus: Vec<Gpu>,
    pub unreadable: Vec<UnreadableGpu>,
}

/// The inventory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("NVML is not available ({detail}): no NVIDIA driver is loaded on this node; to try gpuslice without a GPU set `source = \"simulated\"` under [inventory] and add [[inventory.simulated]] GPUs in {config} (see docs/configuration.md)")]
    NvmlUnavailable { detail: String, config: String },
    #[error("NVML cannot count the GPUs of this node: {detail}")]
    Count { detail: String },
    #[error("NVML reports no GPUs on this node")]
    NoGpus,
    #[error("NVML cannot read any GPU of this node: {}", join_unreadable(.0))]
    NoReadableGpus(Vec<UnreadableGpu>),
}

fn join_unreadable(list: &[UnreadableGpu]) -> String {
    list.iter()
        .map(|u| format!("GPU {}: {}: {}", u.index, u.what, u.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The inventory configured for this node. `config_path` names the config in errors. A
/// GPU NVML cannot read is reported in `unreadable` and the others are listed; a node with
/// no GPU, or none that reads, is an error.
pub fn inventory(config: &Config, config_path: &Path) -> Result<NodeInventory, InventoryError> {
    match config.inventory.source {
        InventorySource::Simulated => Ok(NodeInventory {
            gpus: simulated_inventory(config),
            unreadable: Vec::new(),
        }),
        InventorySource::Nvml => {
            let inv = nvml_inventory(OsStr::new("libnvidia-ml.so.1"), Path::new("/sys")).map_err(
                |e| match e {
                    InventoryError::NvmlUnavailable { detail, .. } => {
                        InventoryError::NvmlUnavailable {
                            detail,
                            config: config_path.display().to_string(),
                        }
                    }
                    other => other,
                },
            )?;
            match (inv.gpus.is_empty(), inv.unreadable.is_empty()) {
                (true, true) => Err(InventoryError::NoGpus),
                (true, false) => Err(InventoryError::NoReadableGpus(inv.unreadable)),
                _ => Ok(inv),
            }
        }
    }
}

/// The simulated GPUs of the config: minor = index, a synthetic PCI bus id, NUMA node 0, no
/// PCIe root (nothing in sysfs to take one from), the memory the simulated NVML would give
/// [`nvml_inventory`].
pub fn simulated_inventory(config: &Config) -> Vec<Gpu> {
    config
        .inventory
        .simulated
        .iter()
        .enumerate()
        .map(|(i, g)| Gpu {
            index: i as u32,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_total: bookable_memory(g.memory, g.reserved_memory),
            minor: i as u32,
            pci_bus_id: Some(gpuslice_config::simulated_pci_bus_id(i)),
            numa_node: Some(0),
            pcie_root: None,
        })
        .collect()
}

/// Reads the GPUs through NVML loaded from `lib` (a soname or a path), each with the memory
/// CUDA can allocate (NVML v2's total less its reserved memory; v1's total on a driver
/// without v2). The NUMA node and the PCIe root come from
/// `<sys_root>/bus/pci/devices/<bus id>` where the kernel tells. A GPU whose handle, UUID,
/// name, memory or minor number cannot be read is reported in `unreadable` (its index and
/// NVML's error) and the others are still read: one GPU fallen off the bus takes no other
/// out of service. Only NVML itself failing (not loaded, or unable to count the GPUs) is an
/// error.
pub fn nvml_inventory(lib: &OsStr, sys_root: &Path) -> Result<NodeInventory, InventoryError> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib)
        .init()
        .map_err(|e| InventoryError::NvmlUnavailable {
            detail: e.to_string(),
            config: String::new(),
        })?;
    // SAFETY: loads the library NVML was just initialised from, a second handle of the same
    // object; only its v2 memory query is called, with devices of `nvml`.
    let v2 = unsafe { NvmlLib::new(lib) }.ok();
    let count = nvml.device_count().map_err(|e| InventoryError::Count {
        detail: e.to_string(),
    })?;
    let mut inv = NodeInventory::default();
    for index in 0..count {
        match nvml_gpu(&nvml, v2.as_ref(), sys_root, index) {
            Ok(gpu) => inv.gpus.push(gpu),
            Err(u) => inv.unreadable.push(u),
        }
    }
    Ok(inv)
}

/// GPU `index` read through `nvml`, or what could not be read of it.
fn nvml_gpu(
    nvml: &nvml_wrapper::Nvml,
    v2: Option<&NvmlLib>,
    sys_root: &Path,
    index: u32,
) -> Result<Gpu, UnreadableGpu> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: nvml_wrapper::error::NvmlError| UnreadableGpu {
            index,
            what,
            detail: e.to_string(),
        }
    };
    let dev = nvml.device_by_index(index).map_err(failed("its handle"))?;
    let uuid = dev.uuid().map_err(failed("its UUID"))?;
    let of = |what: &str| format!("{what} of {uuid}");
    let model = dev.name().map_err(failed(&of("the name")))?;
    let memory_total = device_memory(v2, &dev)
        .map_err(failed(&of("the memory")))?
        .bookable();
    let minor = dev
        .minor_number()
        .map_err(failed(&of("the minor number")))?;
    let pci_bus_id = dev.pci_info().ok().map(|p| p.bus_id);
    let numa_node = pci_bus_id.as_deref().and_then(|b| numa_node(sys_root, b));
    let pcie_root = pci_bus_id.as_deref().and_then(|b| pcie_root(sys_root, b));
    Ok(Gpu {
        index,
        uuid,
        model,
        memory_total,
        minor,
        pci_bus_id,
        numa_node,
        pcie_root,
    })
}

/// sysfs's name of the PCI device NVML calls `bus_id`: NVML prints `00000000:17:00.0`,
/// sysfs `0000:17:00.0` in lower case; `None` for anything else (the name reaches a path).
fn sysfs_pci_name(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let name = format!("{domain:04x}:{}", rest.to_ascii_lowercase());
    let (_, rest) = name.split_once(':')?;
    let r = rest.as_bytes();
    let shaped = r.len() == 7
        && (r[2], r[5]) == (b':', b'.')
        && [0, 1, 3, 4, 6].iter().all(|&i| is_hex(r[i]));
    shaped.then_some(name)
}

fn is_hex(c: u8) -> bool {
    matches!(c, b'0'..=b'9' | b'a'..=b'f')
}

fn numa_node(sys_root: &Path, bus_id: &str) -> Option<i32> {
    let name = sysfs_pci_name(bus_id)?;
    let text = std::fs::read_to_string(
        sys_root
            .join("bus/pci/devices")
            .join(name)
            .join("numa_node"),
    )
    .ok()?;
    let n: i32 = text.trim().parse().ok()?;
    (n >= 0).then_some(n)
}

/// The root complex of the device: `<sys_root>/bus/pci/devices/<name>` links to
/// `../../../devices/pci<domain>:<bus>/…/<name>`, whose first component under `devices` is
/// the root (Kubernetes' standard `resource.kubernetes.io/pcieRoot` value). `None` when the
/// link is missing or does not have that shape.
fn pcie_root(sys_root: &Path, bus_id: &str) -> Option<String> {
    let name = sysfs_pci_name(bus_id)?;
    let target = std::fs::read_link(sys_root.join("bus/pci/devices").join(&name)).ok()?;
    // The link's target, relative to sysfs's root: from `bus/pci/devices`, or absolute.
    let mut path: Vec<String> = if target.is_absolute() {
        Vec::new()
    } else {
        vec!["bus".into(), "pci".into(), "devices".into()]
    };
    for c in target.components() {
        match c {
            std::path::Component::Normal(s) => path.push(s.to_str()?.to_string()),
            std::path::Component::ParentDir => {
                path.pop()?;
            }
            std::path::Component::CurDir => {}
            std::path::Component::RootDir | std::path::Component::Prefix(_) => path.clear(),
        }
    }
    // An absolute link names the real sysfs (`/sys/devices/…`).
    if target.is_absolute() && path.first().map(String::as_str) == Some("sys") {
        path.remove(0);
    }
    let [devices, root, .., last] = path.as_slice() else {
        return None;
    };
    // `pci<domain>:<bus>`: a domain of 4 to 8 hex digits (VMD's are 5), a bus of 2.
    let (domain, bus) = root.strip_prefix("pci")?.split_once(':')?;
    let is_root = (4..=8).contains(&domain.len())
        && bus.len() == 2
        && domain.bytes().chain(bus.bytes()).all(is_hex);
    (devices == "devices" && is_root && *last == name).then(|| root.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_inventory_follows_config() {
        let cfg = gpuslice_config::parse_config(
            "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory=\"10Gi\"\n[[inventory.simulated]]\nmodel=\"NVIDIA A100\"\nmemory=\"40Gi\"\n",
            Path::new("/c.toml"),
        )
        .expect("config");
        let inv = inventory(&cfg, Path::new("/c.toml")).expect("inventory");
        assert!(inv.unreadable.is_empty());
        let inv = inv.gpus;
        assert_eq!(inv.len(), 2);
        assert_eq!(inv[1].model, "NVIDIA A100");
        assert_eq!(inv[1].memory_total, 40 << 30);
        assert_eq!(inv[1].minor, 1);
        assert_eq!(
            inv[0].uuid,
            gpuslice_config::simulated_uuid(0, "NVIDIA H200")
        );
        assert_eq!(inv[1].pci_bus_id.as_deref(), Some("00000000:19:00.0"));
    }

    #[test]
    fn missing_driver_says_how_to_simulate() {
        let e = nvml_inventory(
            OsStr::new("libnvidia-ml-does-not-exist.so.1"),
            Path::new("/sys"),
        )
        .expect_err("no NVML here");
        assert!(matches!(e, InventoryError::NvmlUnavailable { .. }), "{e}");
        let cfg = gpuslice_config::Config::default();
        let e = inventory(&cfg, Path::new("/etc/gpuslice/config.toml"));
        // On a machine with a real driver this would succeed; CI has none.
        if let Err(e) = e {
            let line = e.to_string();
            assert!(
                line.contains("source = \"simulated\"")
                    && line.contains("/etc/gpuslice/config.toml"),
                "{line}"
            );
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn numa_node_from_sysfs() {
        let sys = tempfile::tempdir().expect("tempdir");
        let dev = sys.path().join("bus/pci/devices/0000:17:00.0");
        std::fs::create_dir_all(&dev).expect("mkdir");
        std::fs::write(dev.join("numa_node"), "1\n").expect("write");
        assert_eq!(numa_node(sys.path(), "00000000:17:00.0"), Some(1));
        std::fs::write(dev.join("numa_node"), "-1\n").expect("write");
        assert_eq!(numa_node(sys.path(), "00000000:17:00.0"), None);
        assert_eq!(numa_node(sys.path(), "garbage"), None);
        assert_eq!(numa_node(sys.path(), "00000000:17:00.0/../x"), None);
    }

    /// sysfs as the kernel lays it out: the device under its root complex, linked from
    /// `bus/pci/devices`.
    fn sysfs_with(link: &str, target: &str) -> tempfile::TempDir {
        let sys = tempfile::tempdir().expect("tempdir");
        let devices = sys.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).expect("mkdir");
        std::os::unix::fs::symlink(target, devices.join(link)).expect("symlink");
        sys
    }

    #[test]
    fn pcie_root_from_sysfs() {
        let sys = sysfs_with(
            "0000:17:00.0",
            "../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0",
        );
        assert_eq!(
            pcie_root(sys.path(), "00000000:17:00.0").as_deref(),
            Some("pci0000:16")
        );
        // The name NVML prints in upper case is found too.
        let sys = sysfs_with("0001:a3:00.0", "/sys/devices/pci0001:a0/0001:a3:00.0");
        assert_eq!(
            pcie_root(sys.path(), "00000001:A3:00.0").as_deref(),
            Some("pci0001:a0")
        );
    }

    #[test]
    fn no_pcie_root_from_a_link_of_another_shape() {
        for target in [
            // Not under a root complex.
            "../../../devices/platform/0000:17:00.0",
            // Another device.
            "../../../devices/pci0000:16/0000:18:00.0",
            // Escapes sysfs.
            "../../../../../devices/pci0000:16/0000:17:00.0",
            // A root name of another shape.
            "../../../devices/pciXYZ/0000:17:00.0",
        ] {
            let sys = sysfs_with("0000:17:00.0", target);
            assert_eq!(pcie_root(sys.path(), "00000000:17:00.0"), None, "{target}");
        }
        let sys = tempfile::tempdir().expect("tempdir");
        assert_eq!(pcie_root(sys.path(), "00000000:17:00.0"), None);
        assert_eq!(pcie_root(sys.path(), "garbage"), None);
    }
}

//! `gpuslice cdi generate`: the node's CDI spec for whole GPUs (`gpuslice.io/gpu=0`,
//! `=GPU-<uuid>`, `=all`), with the registry hooks that book them, plus the inventory cache
//! the create path reads instead of NVML; and `gpuslice cdi list`.

use std::path::{Path, PathBuf};

use gpuslice_cdi::{ContainerEdits, Device, Hook, Spec, SpecFileError};
use gpuslice_driver::InventoryError;
use gpuslice_registry::{Gpu, Inventory, RegistryError};

use gpuslice_driver::simnode::{default_driver_dirs, setup_sim_node, RealMknod, SimError};
use gpuslice_hook::create::driveredits::{discover, DriverEdits, DriverEditsError};
use gpuslice_hook::node::{NodeContext, NodeError};
use gpuslice_hook::output::{out, OutputError};
use gpuslice_hook::specfiles::{self, NODE_SPEC_CACHE, VISIBLE_DEVICES_VOID};

use crate::args::CdiCommand;

/// Kind of the node spec's whole-GPU devices.
pub const GPU_KIND: &str = "gpuslice.io/gpu";

/// `cdi generate` failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Driver(#[from] DriverEditsError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Spec(#[from] SpecFileError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot write to standard output: {0}")]
    Stdout(#[from] OutputError),
    #[error(
        "GPU {index} ({uuid}) has no device node /dev/nvidia{minor} under the driver root {root}"
    )]
    MissingGpuNode {
        index: u32,
        uuid: String,
        minor: u32,
        root: PathBuf,
    },
}

/// What `generate` produced.
#[derive(Debug)]
pub struct Generated {
    pub spec: Spec,
    pub path: PathBuf,
    pub gpus: Vec<Gpu>,
}

/// The node's GPUs as the registry caches them: what the driver reports (NVML) or the
/// config simulates. A GPU NVML cannot read is left out, each logged on one line naming
/// its index and NVML's error, so the others stay in service.
pub fn take_inventory(node: &NodeContext) -> Result<Vec<Gpu>, InventoryError> {
    let inv = gpuslice_driver::inventory(node.config(), &node.loaded.path)?;
    for u in &inv.unreadable {
        eprintln!("gpuslice: {u}");
    }
    Ok(inv
        .gpus
        .into_iter()
        .map(|g| Gpu {
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            memory_total: g.memory_total,
            minor: g.minor,
            pci_bus_id: g.pci_bus_id,
            numa_node: g.numa_node,
            pcie_root: g.pcie_root,
        })
        .collect())
}

/// The createRuntime/poststop hooks that book `uuids` whole for the container.
pub fn whole_gpu_hooks(node: &NodeContext, binary: &Path, uuids: &[&str]) -> Vec<Hook> {
    let mut sub = vec!["hook", "create-runtime"];
    for u in uuids {
        sub.push("--whole-gpu");
        sub.push(u);
    }
    vec![
        node.hook(binary, "createRuntime", &sub),
        node.hook(binary, "poststop", &["hook", "poststop"]),
    ]
}

/// Builds the node spec for `gpus` from the driver's edits. Deterministic: the same
/// inventory and driver give byte-identical output.
pub fn node_spec(
    node: &NodeContext,
    binary: &Path,
    gpus: &[Gpu],
    driver: &DriverEdits,
) -> Result<Spec, GenerateError> {
    let mut spec = Spec::new(GPU_KIND);
    spec.container_edits = ContainerEdits {
        env: vec![VISIBLE_DEVICES_VOID.to_string()],
        device_nodes: driver.control.clone(),
        mounts: driver.mounts.clone(),
        ..Default::default()
    };
    let mut all = ContainerEdits::default();
    for g in gpus {
        let dev = driver
            .gpus
            .get(&g.minor)
            .ok_or_else(|| GenerateError::MissingGpuNode {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
                root: node.config().effective_driver_root(),
            })?;
        let edits = ContainerEdits {
            device_nodes: vec![dev.clone()],
            hooks: whole_gpu_hooks(node, binary, &[&g.uuid]),
            ..Default::default()
        };
        spec.devices
            .push(Device::new(g.index.to_string(), edits.clone()));
        spec.devices.push(Device::new(g.uuid.clone(), edits));
        all.device_nodes.push(dev.clone());
    }
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    all.hooks = whole_gpu_hooks(node, binary, &uuids);
    spec.devices.push(Device::new("all", all));
    Ok(spec)
}

/// Takes the inventory (setting up the simulated node first when configured), caches it in
/// the registry, and writes the node spec to `output` (default `cdi.spec_dir`) and to the
/// state dir's cache.
pub fn generate(
    node: &NodeContext,
    output: Option<&Path>,
    sim_driver: Option<&Path>,
) -> Result<Generated, GenerateError> {
    let config = node.config();
    if config.is_simulated() {
        let dirs = match sim_driver {
            Some(d) => vec![d.to_path_buf()],
            None => default_driver_dirs(),
        };
        setup_sim_node(config, &dirs, &RealMknod)?;
    }
    let gpus = take_inventory(node)?;
    let driver = discover(config)?;
    let binary = node.hook_binary()?;
    let spec = node_spec(node, &binary, &gpus, &driver)?;
    record_inventory(node, &gpus)?;
    gpuslice_cdi::write_spec_compact_as(&config.state_dir, NODE_SPEC_CACHE, &spec)?;
    let dir = output
        .map(Path::to_path_buf)
        .unwrap_or_else(|| config.cdi.spec_dir.clone());
    let path = gpuslice_cdi::write_spec(&dir, &spec)?;
    Ok(Generated { spec, path, gpus })
}

/// Caches `gpus` as the registry's inventory. The transaction also reaps what lost its
/// owner, so the registry is opened the node's one way (`NodeContext::open_registry`): a
/// reservation reaped here loses its CDI spec with it (a claim's would otherwise stay for
/// good; `gc` only looks for slice specs).
fn record_inventory(node: &NodeContext, gpus: &[Gpu]) -> Result<(), GenerateError> {
    let registry = node.open_registry()?;
    registry.set_inventory(Inventory {
        gpus: gpus.to_vec(),
    })?;
    Ok(())
}

/// `cdi generate` prints what it wrote; `cdi list` the node spec's device names.
pub fn run(node: &NodeContext, command: CdiCommand) -> Result<(), GenerateError> {
    match command {
        CdiCommand::Generate(args) => {
            let g = generate(node, args.output.as_deref(), args.sim_driver.as_deref())?;
            let names = g.spec.qualified_device_names();
            Ok(out(&format!(
                "wrote {} ({} GPUs, {} devices: {})\n",
                g.path.display(),
                g.gpus.len(),
                names.len(),
                names.join(" ")
            ))?)
        }
        CdiCommand::List => Ok(out(&specfiles::cached_node_spec(
            &node.config().state_dir,
        )?
        .qualified_device_names()
        .iter()
        .map(|n| format!("{n}\n"))
        .collect::<String>())?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_hook::specfiles::{claim_spec_path, CLAIM_KIND};

    /// A node config under `dir` whose registry holds `reservations` (JSON), and its
    /// context.
    fn node_with(dir: &Path, reservations: serde_json::Value) -> NodeContext {
        let state = dir.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n",
                state.display(),
                dir.join("cdi").display()
            ),
        )
        .unwrap();
        let registry = state.join("registry.json");
        let file = serde_json::json!({
            "version": gpuslice_registry::REGISTRY_VERSION,
            "inventory": {"gpus": []},
            "reservations": reservations,
        });
        std::fs::write(&registry, serde_json::to_vec(&file).unwrap()).unwrap();
        std::fs::set_permissions(
            &registry,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        NodeContext::from_loaded(gpuslice_config::load_config(Some(&cfg), None).unwrap())
    }

    /// A DRA claim kept after its claim left the API server, whose last container is gone,
    /// is reaped by the transaction `cdi generate` caches the inventory in; the claim's CDI
    /// spec goes with it (nothing else would ever remove it: `gc` only looks for slice
    /// specs).
    #[test]
    fn a_claim_reaped_while_caching_the_inventory_loses_its_spec() {
        let dir = tempfile::tempdir().unwrap();
        let uuid = "GPU-00000000-1111-2222-3333-444444444444";
        let claim = serde_json::json!({
            "id": "00000000000000c1", "state": "bound",
            "owner": {"kind": "dra_claim", "claim_uid": "uid-gone", "namespace": "tenant",
                "name": "c", "members": [],
                "gone": {"since_ms": 1, "why": "the claim no longer exists"}},
            "gpus": [{"index": 0, "uuid": uuid, "memory": 1024, "cores": 0}],
            "created_ms": 0, "bound_ms": 0,
        });
        let node = node_with(dir.path(), serde_json::json!([claim]));
        let spec_dir = node.config().cdi.spec_dir.clone();
        let mut spec = Spec::new(CLAIM_KIND);
        let edits = ContainerEdits {
            env: vec!["GPUSLICE_CLAIM=uid-gone".into()],
            ..Default::default()
        };
        spec.devices.push(Device::new("uid-gone", edits));
        let path = gpuslice_cdi::write_transient_spec(&spec_dir, &spec, "uid-gone").unwrap();
        assert_eq!(Some(&path), claim_spec_path(&spec_dir, "uid-gone").as_ref());
        let gpus = vec![Gpu {
            index: 0,
            uuid: uuid.into(),
            model: "NVIDIA H200".into(),
            memory_total: 1 << 30,
            minor: 0,
            pci_bus_id: None,
            numa_node: None,
            pcie_root: None,
        }];
        record_inventory(&node, &gpus).unwrap();
        let file = gpuslice_registry::read_registry(&node.config().state_dir).unwrap();
        assert!(file.reservations.is_empty(), "{:?}", file.reservations);
        assert_eq!(file.inventory.gpus, gpus);
        assert!(!path.exists(), "the reaped claim's spec {path:?} was left");
    }
}

//! A simulated node on disk for the tests that drive `gpuslice` through its config: the
//! config file, the inventory taken and cached, the node spec written as `cdi generate`
//! leaves them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpuslice_agent::nodespec::{node_spec, take_inventory};
use gpuslice_cdi::DeviceNode;
use gpuslice_hook::create::driveredits::DriverEdits;
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::specfiles::NODE_SPEC_CACHE;
use gpuslice_registry::Inventory;

/// A node under `dir` whose config ends with `inventory` (the `[inventory]` table and its
/// `[[inventory.simulated]]` GPUs); returns the config file.
pub fn node(dir: &Path, inventory: &str) -> PathBuf {
    let shim = dir.join("libgpuslice_shim.so");
    std::fs::write(&shim, b"shim").unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n[shim]\nlibrary = \"{}\"\n[hook]\npath = \"{}\"\n{inventory}",
            dir.join("state").display(),
            dir.join("cdi").display(),
            shim.display(),
            env!("CARGO_BIN_EXE_gpuslice"),
        ),
    )
    .unwrap();
    let n = NodeContext::from_loaded(gpuslice_config::load_config(Some(&cfg), None).unwrap());
    let config = n.config().clone();
    std::fs::create_dir_all(&config.state_dir).unwrap();
    let gpus = take_inventory(&n).unwrap();
    let dev = |name: &str, minor: u32| {
        DeviceNode::char_device(format!("/dev/{name}"), 195, i64::from(minor))
    };
    let driver = DriverEdits {
        control: vec![dev("nvidiactl", 255)],
        gpus: gpus
            .iter()
            .map(|g| (g.index, dev(&format!("nvidia{}", g.minor), g.minor)))
            .collect::<BTreeMap<_, _>>(),
        mounts: Vec::new(),
    };
    let spec = node_spec(&n, &n.hook_binary().unwrap(), &gpus, &driver).unwrap();
    gpuslice_cdi::write_spec_compact_as(&config.state_dir, NODE_SPEC_CACHE, &spec).unwrap();
    n.open_registry()
        .unwrap()
        .set_inventory(Inventory { gpus })
        .unwrap();
    cfg
}

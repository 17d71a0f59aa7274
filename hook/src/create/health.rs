//! The create path's refusal of GPUs the driver reported unhealthy (`health.json`, which
//! `gpuslice serve` writes; docs/troubleshooting.md, "GPU health and XIDs"): a request
//! naming one is refused with one line naming the GPU, the XID and its time; a request
//! naming none is placed on the healthy GPUs only, and one too few of them can take is
//! refused naming the unhealthy GPUs left out (counted as `unhealthy`). With every GPU
//! healthy the file does not exist and this costs one failed `open`.

use gpuslice_driver::health::{find, read_health, HealthError, Unhealthy};
use gpuslice_registry::{Inventory, Registry, RegistryError, Request, Selector, UnhealthyGpu};

use crate::node::NodeContext;

/// A request the GPUs' health refuses.
#[derive(Debug, thiserror::Error)]
pub enum HealthRefusal {
    #[error("{0}; gpuslice hands it to no new container until the driver reports it healthy again (see `gpuslice status`)")]
    Unhealthy(Box<Unhealthy>),
    #[error("{0}")]
    Read(#[from] HealthError),
    #[error("{0}")]
    Registry(#[from] Box<RegistryError>),
}

/// The unhealthy GPU `selector` names in `list`, if any. An index is the inventory's GPU at
/// that index now, looked up by its UUID: a record's index is the GPU's when the XID came,
/// and GPUs can be renumbered since (a card removed, the driver reloaded).
fn named<'a>(
    list: &'a [Unhealthy],
    inventory: &Inventory,
    selector: &Selector,
) -> Option<&'a Unhealthy> {
    let uuid = match selector {
        Selector::Index(i) => inventory.gpus.iter().find(|g| g.index == *i)?.uuid.as_str(),
        Selector::Uuid(s) => s.as_str(),
    };
    find(list, uuid)
}

/// Refuses `request` when it names an unhealthy GPU; keeps a request naming none off the
/// unhealthy GPUs: placement leaves them out, and a request too few healthy GPUs can take
/// is refused naming them (`Request::unhealthy`), not as a selector of the user's.
pub fn restrict(
    node: &NodeContext,
    registry: &Registry,
    request: &mut Request,
) -> Result<(), HealthRefusal> {
    let list = read_health(&node.config().health_path())?;
    if list.is_empty() {
        return Ok(());
    }
    let inventory = registry.snapshot().map_err(Box::new)?.inventory;
    refuse_named(&list, &inventory, &request.selectors)?;
    request.unhealthy = unhealthy_gpus(&list, &inventory);
    Ok(())
}

/// The GPUs of `inventory` that `list` records unhealthy, each with its line under the
/// index the inventory gives it now.
fn unhealthy_gpus(list: &[Unhealthy], inventory: &Inventory) -> Vec<UnhealthyGpu> {
    inventory
        .gpus
        .iter()
        .filter_map(|g| {
            let u = find(list, &g.uuid)?;
            let now = Unhealthy {
                index: g.index,
                ..u.clone()
            };
            Some(UnhealthyGpu {
                uuid: g.uuid.clone(),
                why: now.to_string(),
            })
        })
        .collect()
}

/// Refuses when one of `selectors` names a GPU of `list`, an index as `inventory` numbers
/// the GPUs now.
pub fn refuse_named(
    list: &[Unhealthy],
    inventory: &Inventory,
    selectors: &[Selector],
) -> Result<(), HealthRefusal> {
    match selectors.iter().find_map(|s| named(list, inventory, s)) {
        Some(u) => Err(HealthRefusal::Unhealthy(Box::new(u.clone()))),
        None => Ok(()),
    }
}

/// Refuses whole GPU `selector` (the node CDI spec's devices) when it is unhealthy, an
/// index as `inventory` numbers the GPUs now.
pub fn refuse_whole(
    node: &NodeContext,
    inventory: &Inventory,
    selector: &Selector,
) -> Result<(), HealthRefusal> {
    let list = read_health(&node.config().health_path())?;
    refuse_named(&list, inventory, std::slice::from_ref(selector))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::Gpu;

    const SICK: &str = "GPU-11111111-2222-3333-4444-555555555555";
    const WELL: &str = "GPU-22222222-2222-3333-4444-555555555555";

    fn sick() -> Vec<Unhealthy> {
        vec![Unhealthy {
            index: 1,
            uuid: SICK.into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        }]
    }

    /// The inventory with `uuids` at indexes 0, 1, …
    fn inventory(uuids: &[&str]) -> Inventory {
        Inventory {
            gpus: uuids
                .iter()
                .enumerate()
                .map(|(i, u)| Gpu {
                    index: i as u32,
                    uuid: (*u).into(),
                    model: "NVIDIA L4".into(),
                    memory_total: 24 << 30,
                    minor: i as u32,
                    pci_bus_id: None,
                    numa_node: None,
                    pcie_root: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_request_naming_the_gpu_by_index_or_uuid_is_refused_naming_gpu_xid_and_time() {
        let inv = inventory(&[WELL, SICK]);
        for s in [
            Selector::Index(1),
            Selector::Uuid("gpu-11111111-2222-3333-4444-555555555555".into()),
        ] {
            let e = refuse_named(&sick(), &inv, &[Selector::Index(0), s])
                .expect_err("named")
                .to_string();
            assert!(
                e.contains("GPU 1 (GPU-11111111-2222-3333-4444-555555555555)")
                    && e.contains("XID 79")
                    && e.contains("2026-11-30T00:53:20Z"),
                "{e}"
            );
        }
        assert!(refuse_named(&sick(), &inv, &[Selector::Index(0)]).is_ok());
        assert!(refuse_named(&sick(), &inv, &[]).is_ok());
    }

    #[test]
    fn an_index_is_the_inventorys_gpu_now_not_the_recorded_one() {
        // The sick GPU was 1 when its XID came; it is 0 now, and 1 is a healthy GPU.
        let inv = inventory(&[SICK, WELL]);
        assert!(refuse_named(&sick(), &inv, &[Selector::Index(1)]).is_ok());
        let e = refuse_named(&sick(), &inv, &[Selector::Index(0)]).expect_err("renumbered");
        assert!(e.to_string().contains(SICK), "{e}");
        // An index no GPU has names no unhealthy one (the booking refuses it).
        assert!(refuse_named(&sick(), &inv, &[Selector::Index(7)]).is_ok());
    }

    /// A node of `WELL` (GPU 0) and `SICK` (GPU 1, XID 79) with its registry in `dir`.
    fn node_with_sick_gpu(dir: &std::path::Path) -> (NodeContext, Registry) {
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n",
                dir.join("state").display(),
                dir.join("cdi").display()
            ),
        )
        .expect("config");
        let node = NodeContext::from_loaded(
            gpuslice_config::load_config(Some(&cfg), None).expect("config loads"),
        );
        std::fs::create_dir_all(&node.config().state_dir).expect("state dir");
        let registry = node.open_registry().expect("registry");
        registry
            .set_inventory(inventory(&[WELL, SICK]))
            .expect("inventory");
        gpuslice_driver::health::write_health(&node.config().health_path(), &sick())
            .expect("health record");
        (node, registry)
    }

    /// Two GPUs asked for, naming none, on a node whose GPU 1 is unhealthy: refused naming
    /// GPU 1, its XID and health, counted as `unhealthy` (the user gave no selector).
    #[test]
    fn a_request_naming_no_gpu_that_too_few_healthy_gpus_can_take_names_the_unhealthy_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (node, registry) = node_with_sick_gpu(dir.path());
        let mut two = Request {
            gpus: 2,
            ..Request::new(gpuslice_registry::Owner::container())
        };
        restrict(&node, &registry, &mut two).expect("names no unhealthy GPU");
        assert!(two.selectors.is_empty(), "{:?}", two.selectors);
        let line = registry
            .reserve(&two)
            .expect_err("one healthy GPU")
            .to_string();
        assert!(
            line.contains(&format!(
                "GPU 1 ({SICK}) is unhealthy: the driver reported XID 79"
            )) && line.contains("only 1 of the 2 GPUs that are on this node are healthy"),
            "{line}"
        );
        let refused = registry
            .snapshot()
            .expect("snapshot")
            .counters
            .refused_total;
        assert_eq!(
            refused.into_iter().collect::<Vec<_>>(),
            [("unhealthy".to_string(), 1)]
        );
        // One GPU: the healthy one.
        let mut one = Request::new(gpuslice_registry::Owner::container());
        restrict(&node, &registry, &mut one).expect("names no unhealthy GPU");
        let r = registry.reserve(&one).expect("GPU 0 is free");
        assert_eq!(r.gpus[0].uuid, WELL);
    }
}

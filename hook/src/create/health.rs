//! The create path's refusal of GPUs the driver reported unhealthy (`health.json`, which
//! `gpuslice serve` writes; docs/troubleshooting.md, "GPU health and XIDs"): a request
//! naming one is refused with one line naming the GPU, the XID and its time; a request
//! naming none is placed on the healthy GPUs only. With every GPU healthy the file does not
//! exist and this costs one failed `open`.

use gpuslice_driver::health::{read_health, HealthError, Unhealthy};
use gpuslice_registry::{Registry, RegistryError, Request, Selector};

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

/// The unhealthy GPU `selector` names in `list`, if any.
fn named<'a>(list: &'a [Unhealthy], selector: &Selector) -> Option<&'a Unhealthy> {
    list.iter().find(|u| match selector {
        Selector::Index(i) => u.index == *i,
        Selector::Uuid(s) => u.uuid.eq_ignore_ascii_case(s),
    })
}

/// Refuses `request` when it names an unhealthy GPU; keeps a request naming none off the
/// unhealthy GPUs (its selectors become the healthy GPUs of the inventory).
pub fn restrict(
    node: &NodeContext,
    registry: &Registry,
    request: &mut Request,
) -> Result<(), HealthRefusal> {
    let list = read_health(&node.config().health_path())?;
    if list.is_empty() {
        return Ok(());
    }
    refuse_named(&list, &request.selectors)?;
    if request.selectors.is_empty() {
        let inventory = registry.snapshot().map_err(Box::new)?.inventory;
        request.selectors = inventory
            .gpus
            .iter()
            .filter(|g| named(&list, &Selector::Uuid(g.uuid.clone())).is_none())
            .map(|g| Selector::Uuid(g.uuid.clone()))
            .collect();
        if request.selectors.is_empty() {
            // Every GPU is unhealthy: name the first.
            return Err(HealthRefusal::Unhealthy(Box::new(list[0].clone())));
        }
    }
    Ok(())
}

/// Refuses when one of `selectors` names a GPU of `list`.
pub fn refuse_named(list: &[Unhealthy], selectors: &[Selector]) -> Result<(), HealthRefusal> {
    match selectors.iter().find_map(|s| named(list, s)) {
        Some(u) => Err(HealthRefusal::Unhealthy(Box::new(u.clone()))),
        None => Ok(()),
    }
}

/// Refuses whole GPU `selector` (the node CDI spec's devices) when it is unhealthy.
pub fn refuse_whole(node: &NodeContext, selector: &Selector) -> Result<(), HealthRefusal> {
    let list = read_health(&node.config().health_path())?;
    refuse_named(&list, std::slice::from_ref(selector))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sick() -> Vec<Unhealthy> {
        vec![Unhealthy {
            index: 1,
            uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        }]
    }

    #[test]
    fn a_request_naming_the_gpu_by_index_or_uuid_is_refused_naming_gpu_xid_and_time() {
        for s in [
            Selector::Index(1),
            Selector::Uuid("gpu-11111111-2222-3333-4444-555555555555".into()),
        ] {
            let e = refuse_named(&sick(), &[Selector::Index(0), s])
                .expect_err("named")
                .to_string();
            assert!(
                e.contains("GPU 1 (GPU-11111111-2222-3333-4444-555555555555)")
                    && e.contains("XID 79")
                    && e.contains("2026-11-30T00:53:20Z"),
                "{e}"
            );
        }
        assert!(refuse_named(&sick(), &[Selector::Index(0)]).is_ok());
        assert!(refuse_named(&sick(), &[]).is_ok());
    }
}

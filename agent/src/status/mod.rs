//! `gpuslice status` and `gpuslice gc`: the node's registry shown (booked figures next to
//! what `measured` takes, rendered by `render`, and the GPUs' health, `health`) and reaped
//! or rebuilt.

pub mod dra;
pub mod health;
pub mod measured;
pub mod render;
mod table;

use gpuslice_registry::{is_valid_id, Inventory, Registry};

use render::{render_gc, render_rebuild, render_table_measured, status_json_measured};

use crate::args::{GcArgs, StatusArgs};
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::output::{out, OutputError};
use gpuslice_hook::specfiles::{slice_spec_path, SLICE_KIND};

/// Why `status` or `gc` failed; each variant prints as one line naming the file or GPU.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Registry(Box<gpuslice_registry::RegistryError>),
    #[error(transparent)]
    Spec(#[from] gpuslice_cdi::SpecFileError),
    #[error(transparent)]
    Inventory(#[from] gpuslice_driver::InventoryError),
    #[error("cannot write to standard output: {0}")]
    Stdout(#[from] OutputError),
}

impl From<gpuslice_registry::RegistryError> for StatusError {
    fn from(e: gpuslice_registry::RegistryError) -> Self {
        StatusError::Registry(Box::new(e))
    }
}

/// `status [--json]`: per-GPU capacity and allocation and the reservations, with what the
/// exporter's collector measures next to what is booked, and what the enforcer did.
pub fn status(node: &NodeContext, args: &StatusArgs) -> Result<(), StatusError> {
    let file = node.open_registry()?.snapshot()?;
    let measured = measured::measure(node, &file);
    if args.json {
        let mut v = status_json_measured(&file, &measured, &node.config().placement);
        crate::enforce::status::add_json(&mut v, &node.config().state_dir);
        dra::add_json(&mut v, &node.config().kubelet_plugin_path());
        health::add_json(&mut v, &node.config().health_path());
        Ok(out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ))?)
    } else {
        let enforcer = crate::enforce::status::render_text(&node.config().state_dir);
        let dra = dra::render_text(&node.config().kubelet_plugin_path()) + &dra::render_kept(&file);
        let health = health::render_text(&node.config().health_path());
        Ok(out(&format!(
            "{health}{}{enforcer}{dra}",
            render_table_measured(&file, &measured, &node.config().placement)
        ))?)
    }
}

/// `gc [--rebuild]`: reaps the reservations of containers that are gone, or rebuilds a
/// corrupt registry from the inventory and the live slice directories; either way, then
/// removes the slice CDI specs whose reservation is gone.
pub fn gc(node: &NodeContext, args: &GcArgs) -> Result<(), StatusError> {
    let registry = node.open_registry()?;
    let report = if args.rebuild {
        let gpus = crate::nodespec::take_inventory(node)?;
        render_rebuild(&registry.rebuild(Inventory { gpus })?)
    } else {
        render_gc(&registry.gc()?)
    };
    let specs = remove_leftover_specs(node, &registry)?;
    Ok(out(&format!("{report}{specs}"))?)
}

/// Removes gpuslice's slice CDI specs (`gpuslice.io-slice_<id>.json` in `cdi.spec_dir`, `<id>`
/// a reservation id) whose reservation the registry does not list: a hook killed between
/// its reservation being reaped and its spec being written leaves one that no release
/// would remove. The specs are listed before the registry is read, and a create writes its
/// spec only after reserving, so a spec being created is never taken. Returns one line per
/// spec removed.
fn remove_leftover_specs(node: &NodeContext, registry: &Registry) -> Result<String, StatusError> {
    let dir = &node.config().cdi.spec_dir;
    let ids = gpuslice_cdi::list_transient_specs(dir, SLICE_KIND)?;
    if ids.is_empty() {
        return Ok(String::new());
    }
    let file = registry.snapshot()?;
    let mut lines = String::new();
    for id in ids.iter().filter(|id| is_valid_id(id)) {
        if file.reservation(id).is_some() {
            continue;
        }
        if let Some(path) = slice_spec_path(dir, id) {
            gpuslice_cdi::remove_spec(&path)?;
            lines.push_str(&format!(
                "removed CDI spec {} of reservation {id}, which the registry does not list\n",
                path.display()
            ));
        }
    }
    Ok(lines)
}

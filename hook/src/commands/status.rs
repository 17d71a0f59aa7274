//! `gpuslice status` and `gpuslice gc`: the node's registry shown (booked and measured
//! figures, rendered by the registry crate) and reaped or rebuilt.

use gpuslice_registry::{
    render_reaped, render_rebuild, render_table_measured, status_json_measured, Inventory,
};

use crate::cli::{GcArgs, StatusArgs};
use crate::commands::out;
use crate::error::Error;
use crate::node::Node;

/// `status [--json]`: per-GPU capacity and allocation and the reservations, with what the
/// exporter's collector measures next to what is booked, and what the enforcer did.
pub fn status(node: &Node, args: &StatusArgs) -> Result<(), Error> {
    let file = node.open_registry()?.snapshot()?;
    let measured = crate::serve::measured::measure(node, &file);
    if args.json {
        let mut v = status_json_measured(&file, &measured);
        crate::serve::enforce::status::add_json(&mut v, &node.config().state_dir);
        out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ))
    } else {
        let enforcer = crate::serve::enforce::status::render_text(&node.config().state_dir);
        out(&format!(
            "{}{enforcer}",
            render_table_measured(&file, &measured)
        ))
    }
}

/// `gc [--rebuild]`: reaps the reservations of containers that are gone, or rebuilds a
/// corrupt registry from the inventory and the live slice directories.
pub fn gc(node: &Node, args: &GcArgs) -> Result<(), Error> {
    let registry = node.open_registry()?;
    if args.rebuild {
        let gpus = gpuslice_driver::inventory(node.config(), &node.loaded.path)?;
        out(&render_rebuild(&registry.rebuild(Inventory { gpus })?))
    } else {
        out(&render_reaped(&registry.gc()?))
    }
}

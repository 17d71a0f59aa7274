//! Kubernetes quantities under the names this crate's users already call (`parse_whole`,
//! `format_binary`, `QuantityError`): the grammar and the spelling are
//! `gpuslice_config::quantity`'s, one for the whole workspace, so that what the plugin
//! publishes, what it reads back from a claim and what the console writes cannot disagree.
//! These are the same functions, not copies.

pub use gpuslice_config::quantity::{
    format_kube_quantity as format_binary, parse_kube_quantity as parse_whole,
    KubeQuantityError as QuantityError,
};

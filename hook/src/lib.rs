//! gpuslice: the library behind the `gpuslice` and `gpuslice-runtime` binaries, grouped by
//! job: the create path (`create`), the node commands (`commands`), engine registration
//! (`configure`) and the exporter (`serve`), with the node context, the command line and the
//! static build's hand-over they share.

pub mod cli;
pub mod commands;
pub mod configure;
pub mod create;
pub mod error;
#[cfg(feature = "kubernetes")]
pub mod kubelet_plugin;
pub mod node;
pub mod serve;
pub mod simnode;
pub mod staticbuild;

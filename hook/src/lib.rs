//! gpuslice's create path: the runtime wrapper's bundle edit, the OCI hooks (`create`), the
//! one spec edit, where the node spec's cache and each slice's spec live (`specfiles`), and
//! the node context every command starts from (`node`). The static create-path build links
//! this crate alone.

pub mod args;
pub mod create;
pub mod error;
pub mod node;
pub mod output;
pub mod specfiles;
pub mod staticbuild;

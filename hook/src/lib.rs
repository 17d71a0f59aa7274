//! gpuslice's create path: the runtime wrapper's bundle edit, the OCI hooks (`create`), the
//! one spec edit, the node's CDI spec and its cache (`nodespec`), and the node context every
//! command starts from (`node`, with the simulated node's set-up in `simnode`). The static
//! create-path build links this crate alone.

pub mod args;
pub mod create;
pub mod error;
pub mod node;
pub mod nodespec;
pub mod output;
pub mod simnode;
pub mod specfiles;
pub mod staticbuild;

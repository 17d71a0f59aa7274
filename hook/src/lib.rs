//! gpuslice: the spec edit, hooks and CLI shared by the `gpuslice` and `gpuslice-runtime`
//! binaries.

pub mod cdigen;
pub mod cleanup;
pub mod cli;
pub mod commands;
pub mod driveredits;
pub mod error;
pub mod node;
pub mod simnode;

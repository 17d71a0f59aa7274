//! gpuslice: the spec edit, hooks and CLI shared by the `gpuslice` and `gpuslice-runtime`
//! binaries.

pub mod annotations;
pub mod arena;
pub mod cdigen;
pub mod cleanup;
pub mod cli;
pub mod commands;
pub mod configure;
pub mod driveredits;
pub mod error;
pub mod hookargv;
pub mod hooks;
pub mod muslbcmp;
pub mod muslmem;
pub mod node;
pub mod runtime;
pub mod serve;
pub mod simnode;
pub mod slicespec;
pub mod specedit;
pub mod staticbuild;

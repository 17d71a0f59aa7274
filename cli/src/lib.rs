//! The `gpuslice` binaries' own code: the command tree composed of the role crates' flags
//! (`cli`) and the one dispatch of a parsed command line to its role (`dispatch`). Nothing
//! here does a job of its own. The static create-path build (no `full` feature) has neither:
//! it reads hook lines with the create path's own reader and hands any other line over.

#[cfg(feature = "full")]
pub mod cli;
#[cfg(feature = "full")]
pub mod dispatch;

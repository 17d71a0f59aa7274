//! The integration tests of `gpuslice-configure` in one test binary (one link instead of one
//! per file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;
mod containerd;
mod crio;
mod docker;

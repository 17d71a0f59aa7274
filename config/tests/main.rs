//! The integration tests of `gpuslice-config` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod config_file;
mod dra_config;
mod enforce_config;
mod health_config;

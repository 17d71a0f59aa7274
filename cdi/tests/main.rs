//! The integration tests of `gpuslice-cdi` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod concurrent_rewrite;
mod inject;
mod podman_e2e;
mod properties;
mod schema;
mod support;

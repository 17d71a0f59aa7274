//! The integration tests of `gpuslice-agent` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod serve_collect;
mod serve_common;
mod serve_http;
mod serve_packaging;
mod status_render;

//! gpuslice-webhook's integration tests: the server's start-up refusals and its TLS reload,
//! and hostile clients against the running server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod hostile;
mod server;

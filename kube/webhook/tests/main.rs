//! gpuslice-webhook's integration tests: the server's start-up refusals and its TLS reload,
//! hostile clients against the running server, and the placement of a job's ranks whose own
//! claim templates ask gpuslice's devices.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod hostile;
mod job_ranks;
mod server;

//! gpuslice-webhook's integration tests: the server's start-up refusals and its TLS reload,
//! hostile clients against the running server, the placement of a job's ranks whose own
//! claim templates ask gpuslice's devices, the watched copies of templates and quotas past an
//! object that cannot be decoded whole or labelled as the webhook's by a tenant, namespace
//! budgets' refusals and recount (listed a page at a time), and the recount a deletion
//! triggers however the watch of the Pods ends.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod budgets;
mod hostile;
mod job_ranks;
mod mirror;
mod relist;
mod server;

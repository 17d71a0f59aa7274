//! The integration tests of `gpuslice-kube` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod claim_life;
mod grpc_clients;
mod kubelet;
mod manifests;
mod registration_authority;
mod slot_mode;
mod support;

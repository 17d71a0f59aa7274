//! gpuslice's mutating admission webhook behind `gpuslice webhook`: container limits
//! `gpuslice.io/{gpus,memory,cores}` (and, with `--hami-compat` in labelled namespaces, HAMi's
//! `nvidia.com/*` limits and selection annotations) become a DRA claim of the cluster's
//! publication mode, through a ResourceClaimTemplate per shape in the pod's namespace, so that
//! requests and limits written as usual are placed by the scheduler on real free capacity.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod ask;
pub mod budget;
pub mod cluster;
pub mod deletions;
pub mod mirror;
pub mod mutate;
pub mod placement;
pub mod review;
pub mod server;
pub mod sweep;
pub mod tls;
pub mod view;

pub use gpuslice_conn::Limits;
pub use server::{run_until_signal, serve, serve_with, Options, WebhookArgs, WebhookError};

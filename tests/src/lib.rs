//! End-to-end test harness: locates the built binaries, builds a small glibc test image,
//! sets up simulated GPU nodes and drives real runc, podman and containerd with them.
//!
//! These tests need root (they start containers and create device nodes). They serialise
//! on a host-wide lock because podman 4.3 reads CDI specs only from `/etc/cdi` and
//! `/var/run/cdi`, which every test shares.

// A test harness: a failed step must fail the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod cri;
pub mod env;
pub mod image;
pub mod kube;
pub mod kube_node;
pub mod kubelet;
pub mod kubelet_plugin;
pub mod node;
pub mod podman;
pub mod prometheus;
pub mod published;
pub mod runc;
pub mod serve;
pub mod view;

pub use env::{bin, portable, require_root, serial, Serial};
pub use node::TestNode;

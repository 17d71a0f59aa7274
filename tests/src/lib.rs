//! End-to-end test harness: locates the built binaries, builds a small glibc test image,
//! sets up simulated GPU nodes and drives real runc, podman and containerd with them.
//!
//! These tests need root (they start containers and create device nodes). They run in one
//! test binary, several at a time, kept apart by host-wide locks ([`env`]): each test takes
//! [`lock`] with the host resources it shares with others (e.g. [`Resource::Cdi`]: podman 4.3
//! reads CDI specs only from `/etc/cdi` and `/var/run/cdi`), or [`serial`] when it needs the
//! machine alone (it measures time or compute shares).

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

pub use env::{bin, lock, portable, require_root, serial, Resource, Serial};
pub use node::TestNode;

//! The integration tests of `gpuslice-e2e` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod budgets;
mod build_install;
mod console_kubectl;
mod console_web;
mod containerd;
mod context_memory;
mod cri;
mod dra_control_plane;
mod dra_slots;
mod enforce;
mod enforce_compute;
mod gpu_health;
mod hardening_lifecycle;
mod helm_chart;
mod kube_control_plane;
mod kube_node;
mod kubeflow;
mod kueue;
mod nerdctl;
mod node_faults;
mod observability;
mod podman;
mod runc_slice;
mod runc_two_gpus;
mod runtime_spec_input;
mod signals;
mod webhook;

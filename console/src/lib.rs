//! gpuslice's console: the data layer (ResourceSlices, ResourceClaims, pods and Prometheus
//! read into one model per node, per GPU and per pod container), its text, JSON and YAML
//! renderings for `kubectl gpuslice`, and the allocate / release operation on workloads.
//! The web console (`web`, served by `gpuslice console`) reuses the model and the operation
//! with its own HTML renderings.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod budgets;
pub mod client;
pub mod edit;
pub mod fetch;
pub mod idle;
pub mod model;
pub mod render;
pub mod usage;
pub mod web;
pub mod workload;

//! The integration tests of `gpuslice` in one test binary (one link instead of one per
//! file): each file beside this one is a module, the shared helpers too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

// The CDI JSON schema validator of gpuslice-cdi's tests, shared by specs_schema and
// kubelet_plugin (test code: a schema that does not load is a failed test).
#[path = "../../cdi/tests/schema/validator.rs"]
mod cdi_schema;
mod cli_config;
mod configure_cli;
// The engine registration tests' fixtures and helpers (configure/tests), for the CLI's.
#[path = "../../configure/tests/common/mod.rs"]
mod configure_common;
mod configure_manifests;
mod installer_image;
mod kubelet_plugin;
mod precreate_hook;
mod reserved_memory;
mod runtime_passthrough;
mod runtime_spec_input;
mod serve_process;
mod sim_node;
mod specs_schema;
mod status_gc;

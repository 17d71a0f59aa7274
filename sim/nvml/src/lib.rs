//! Simulated `libnvidia-ml.so.1`: the NVML entry points gpuslice's inventory (through
//! nvml-wrapper), exporter and shim use, with the real names and C ABI, reporting the
//! simulated node of `gpuslice-sim-core`: its GPUs, node-wide memory use, compute processes
//! and utilisation (per device and per process), temperature, power and clocks, and the
//! faults injected into it (XID events, lost GPUs, the recovery a GPU needs).
//!
//! Every export is an `unsafe extern "C" fn` whose safety contract is NVML's for its pointer
//! arguments; bodies run under a panic guard and touch caller memory only through `ffi`.

#![allow(non_snake_case, clippy::missing_safety_doc)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod device;
#[cfg(test)]
mod fault_tests;
mod ffi;
mod health;
mod monitor;
mod samples;
mod state;
mod system;
mod usage;

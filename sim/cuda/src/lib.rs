//! Simulated `libcuda.so.1`: the CUDA driver API entry points gpuslice's shim and probe use,
//! with the real names and C ABI, running on the simulated node of `gpuslice-sim-core`:
//! device memory charged node-wide across processes against each GPU's capacity, kernels that
//! occupy the device for a simulated time (one at a time, FIFO across processes), streams,
//! events and `cuGetProcAddress` resolving like the real driver.
//!
//! Every export is an `unsafe extern "C" fn` whose safety contract is the CUDA driver API's
//! for its pointer arguments; bodies run under a panic guard and touch caller memory only
//! through the checked helpers of `guard`.

#![allow(non_snake_case, clippy::missing_safety_doc)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod driver;
mod exports;
#[cfg(test)]
mod fault_tests;
mod guard;
mod symbols;

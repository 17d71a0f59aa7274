//! Hand-written declarations of the CUDA driver API and NVML subset gpuslice uses, shared by
//! the simulated driver (`sim/`), the enforcement shim (`shim/`) and the probe, so all three
//! agree on one ABI and on one `cuGetProcAddress` symbol table. No bindgen, no CUDA headers:
//! every layout here is checked against the real headers' sizes in this crate's tests.
//!
//! Naming follows the C headers (`CUresult`, `CUDA_ERROR_OUT_OF_MEMORY`,
//! `CU_DEVICE_ATTRIBUTE_CLOCK_RATE`), so code reads like the CUDA documentation. Function
//! pointer types are named `PFN_<exported symbol>` (for example `PFN_cuMemAlloc_v2`): the
//! signature of exactly the symbol the driver exports under that name.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod fns;
pub mod nvml;
pub mod procaddr;
pub mod result;
pub mod types;

pub use fns::*;
pub use procaddr::{base_name_of, resolve, ProcEntry, ResolveError, PROC_TABLE};
pub use result::*;
pub use types::*;

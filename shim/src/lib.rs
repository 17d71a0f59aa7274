//! `libgpuslice_shim.so`: the enforcement shim every process of a slice loads through
//! `/etc/ld.so.preload`. It enforces the slice's memory limit on every device allocation
//! path, reports the limit through CUDA and NVML memory queries, paces kernel launches to
//! the slice's compute share, and accounts all processes of a container in the shared usage
//! file. It does nothing at load: state is built on the first intercepted CUDA or NVML call.
//! See `docs/shim.md`.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod account;
mod dlsym;
mod figures;
mod forksafe;
mod glibc;
mod guard;
mod hooks;
mod intercept;
mod locate;
mod log;
mod overhead;
mod pacer;
mod real;
mod sizes;
mod state;

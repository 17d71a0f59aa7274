//! Simulated libcuda.so.1 (being built).

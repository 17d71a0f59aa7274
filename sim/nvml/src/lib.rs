//! Simulated libnvidia-ml.so.1 (being built).

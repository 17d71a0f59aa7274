//! gpuslice-registry (being built).

//! gpuslice-cdi (being built).

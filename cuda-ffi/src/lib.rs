//! Hand-written declarations of the CUDA driver API and NVML subset gpuslice uses (being built).

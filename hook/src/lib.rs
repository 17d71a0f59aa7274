//! gpuslice: the spec edit, hooks and CLI shared by the `gpuslice` and `gpuslice-runtime` binaries.

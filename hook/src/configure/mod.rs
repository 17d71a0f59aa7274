//! `gpuslice configure <engine>`: registering gpuslice with container engines.

pub mod podman;

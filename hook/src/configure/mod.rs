//! `gpuslice configure <engine>`: registering gpuslice with container engines.

pub mod containerd;
pub mod crio;
pub mod docker;
pub mod files;
pub mod podman;
pub mod registration;
pub mod tomldoc;

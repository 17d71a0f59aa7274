//! The slice directory contract (docs/annotations.md, "In the container"), shared by the host (which writes it), the
//! shim (which enforces it) and the exporter (which reads usage): `limits.json` and `usage`.

pub mod limits;
pub mod usage;

pub use limits::{DeviceLimit, Limits, LimitsError, LIMITS_FILE, LIMITS_VERSION};

/// Where the slice directory is mounted inside a container.
pub const CONTAINER_DIR: &str = "/run/gpuslice";
/// The limits file inside a container.
pub const CONTAINER_LIMITS: &str = "/run/gpuslice/limits.json";
/// The usage file inside a container.
pub const CONTAINER_USAGE: &str = "/run/gpuslice/usage";
/// Name of the usage file in a slice directory.
pub const USAGE_FILE: &str = "usage";

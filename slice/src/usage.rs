//! The shared `usage` accounting file of a slice (layout owned by the shim issue).

/// Size the host creates the usage file at (placeholder until the shim fixes the layout).
pub const USAGE_FILE_SIZE: u64 = 64 * 1024;

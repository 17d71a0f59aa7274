//! gpuslice's cluster-side DRA vocabulary, shared by the kubelet plugin, the admission webhook
//! and the console: the driver and DeviceClass names, the devices the plugin publishes (their
//! names, attributes and capacities, and the ResourceSlices that carry them), the claims the
//! front ends write for an ask and read back, the opaque parameters of the driver, and the API
//! server client. Nothing here touches a node.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod claim_shape;
pub mod jobs;
pub mod opaque;
pub mod quota;
pub mod slices;

/// The DRA driver name and the DeviceClass name.
pub const DRIVER: &str = "gpuslice.io";
/// The DeviceClass of slot mode.
pub const SLOTS_CLASS: &str = "slots.gpuslice.io";

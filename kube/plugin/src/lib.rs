//! gpuslice's Kubernetes side: the DRA kubelet plugin behind `gpuslice kubelet-plugin`. It
//! publishes each GPU of the node as a device with consumable `memory` and `cores`, books what
//! the scheduler allocated to a claim in the node registry when the kubelet prepares it, and
//! hands the claim's containers their slice through a CDI spec of the claim's own.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod booking;
pub mod claim;
pub mod claim_shape;
pub mod cleanup;
pub mod dra_service;
pub mod h2_relay;
pub mod mode;
pub mod node_slices;
pub mod proto;
pub mod publisher;
pub mod registration;
pub mod serve;
pub mod slices;
pub mod writer;

/// The DRA driver name and the DeviceClass name.
pub const DRIVER: &str = "gpuslice.io";
/// The DeviceClass of slot mode.
pub const SLOTS_CLASS: &str = "slots.gpuslice.io";

pub use booking::{BookingError, Plugin};
pub use claim::ClaimRef;
pub use serve::{run, run_until_signal, PluginOptions, ServeError};
pub use writer::{claim_device_id, SliceWriter, WriteError, CLAIM_KIND};

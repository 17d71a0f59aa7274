//! gpuslice's Kubernetes side: the DRA kubelet plugin behind `gpuslice kubelet-plugin`. It
//! publishes each GPU of the node as a device with consumable `memory` and `cores` (or as equal
//! slot devices where the cluster lacks consumable capacity), books what
//! the scheduler allocated to a claim in the node registry when the kubelet prepares it, and
//! hands the claim's containers their slice through a CDI spec of the claim's own.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod api_watch;
pub mod booking;
pub mod claim;
pub mod cleanup;
pub mod dra_service;
pub mod h2_relay;
pub mod health_events;
pub mod mode;
pub mod node_slices;
pub mod offer;
pub mod probe;
pub mod proto;
pub mod publisher;
pub mod registration;
pub mod serve;
pub mod slice_watch;
pub mod stalled_prepare;
pub mod writer;

pub use booking::{BookingError, Plugin};
pub use claim::ClaimRef;
pub use serve::{run, run_until_signal, PluginOptions, ServeError};
pub use writer::{claim_device_id, SliceWriter, WriteError, CLAIM_KIND};

//! gpuslice's node registry: the GPU inventory and the reservations that slice it, kept in
//! `state_dir/registry.json` under an exclusive `flock`, with placement, reaping of
//! reservations whose owner is gone, crash-safe persistence, rebuild from the per-slice
//! records. What `gpuslice status` and `gc` print is rendered by the CLI
//! (`gpuslice::commands::status`) from these types.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod annotations;
#[cfg(any(test, feature = "testing"))]
mod fake;
mod id;
mod load;
mod model;
mod placement;
mod printable;
mod reap;
mod registry;
mod request;
#[cfg(test)]
mod roundtrip;
mod store;
mod system;

/// A scripted system for tests (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub use fake::FakeSystem;
pub use id::{is_valid_id, new_id, IdError, ID_LEN};
pub use load::{gpu_loads, memory_capacity, missing_gpus, violations, GpuLoad, GpuLoads};
pub use model::{
    Booking, ClaimGone, Counters, Gpu, Inventory, KubernetesRef, Owner, ProcessRef, RegistryFile,
    Reservation, ReservationState, Unknown, REGISTRY_VERSION,
};
pub use placement::{place, Refusal, RefusalReason};
pub use printable::printable;
pub use reap::{ReapReason, Reaped};
pub use registry::{
    check_state_dir, claim_uid, no_cleanup, read_registry, ClaimLeft, ClaimReservation, ClaimShare,
    Cleanup, GcReport, InventoryChange, Options, RebuildReport, Registry, RegistryError, Released,
    UnreadableOutcome, UnreadableRecord, MAX_CLAIM_MEMBERS,
};
pub use request::{Request, Selector, SelectorError, UnhealthyGpu, MAX_GPUS};
pub use store::{StoreError, LOCK_FILE, RECORD_FILE, REGISTRY_FILE, SLICES_DIR};
pub use system::{cgroup_rel_path, parse_stat, RealSystem, System, SystemError};

//! The seam to the node's slice code: the plugin books, and a [`SliceWriter`] (the `gpuslice`
//! binary's, which reuses the create path's slice spec) writes what a container of the claim
//! gets: the slice directory and the claim's own CDI spec. Kept as a trait so this crate does
//! not depend on the binary's crate, which depends on it.

use gpuslice_registry::Reservation;

/// Kind of the per-claim CDI specs; each claim's device is named by its UID.
pub const CLAIM_KIND: &str = "gpuslice.io/claim";

/// The qualified CDI device id of the claim with UID `uid`.
pub fn claim_device_id(uid: &str) -> String {
    format!("{CLAIM_KIND}={uid}")
}

/// A slice's files could not be written or removed; the message names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Failed(String),
}

/// Writes and removes what a claim's containers are given.
pub trait SliceWriter: Send + Sync {
    /// Writes the slice directory (limits file, usage file kept when it exists) of
    /// `reservation` and the CDI spec of the claim with UID `claim_uid`; returns the qualified
    /// CDI device ids the kubelet hands the runtime. Idempotent.
    fn write(&self, claim_uid: &str, reservation: &Reservation) -> Result<Vec<String>, WriteError>;

    /// Removes the claim's CDI spec (the registry removes the slice directory on release).
    /// Idempotent: nothing to remove is success.
    fn remove(&self, claim_uid: &str) -> Result<(), WriteError>;
}

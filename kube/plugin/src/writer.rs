//! The seam to the node's slice code: the plugin books, and a [`SliceWriter`] writes what a
//! container of the claim gets: the slice directory and the claim's own CDI spec. On a node
//! that is `node_slices::ClaimSlices`, which calls the create path's one slice writer; the
//! booking tests and benchmarks put fakes here.

use gpuslice_registry::Reservation;

/// Kind of the per-claim CDI specs, and the qualified id of a claim's device (named by its
/// UID): the create path names every slice's spec.
pub use gpuslice_hook::specfiles::{claim_device_id, CLAIM_KIND};

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

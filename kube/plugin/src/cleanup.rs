//! Releasing claim bookings nobody will unprepare: a claim deleted, re-created under another
//! UID, or no longer allocated to this node (the kubelet may have missed the unprepare while
//! the plugin was down). Run at start and periodically; container exits never touch claims.

use crate::booking::{held_by, release, BookingError, Plugin};
use crate::claim::{node_allocation, ClaimError, SlotGeometry};

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    /// UIDs of the claims released, with why.
    pub released: Vec<(String, String)>,
    /// Claims kept because the API server could not say (one line each).
    pub unknown: Vec<String>,
}

/// One pass of the cleanup.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("cannot read the node registry: {0}")]
    Registry(String),
    #[error("{0}")]
    Release(#[from] BookingError),
}

/// Checks every claim booking in the registry against the API server and releases the
/// stale ones.
pub async fn release_stale(plugin: &Plugin) -> Result<CleanupReport, CleanupError> {
    let registry = plugin.registry().clone();
    let file = tokio::task::spawn_blocking(move || registry.snapshot())
        .await
        .map_err(|e| CleanupError::Registry(e.to_string()))?
        .map_err(|e| CleanupError::Registry(e.to_string()))?;
    let geometry = SlotGeometry::new(plugin.slots_per_gpu(), &file.inventory);
    let mut report = CleanupReport::default();
    for c in file.reservations.iter().filter_map(held_by) {
        let why = match plugin.read_claim(&c.namespace, &c.name).await {
            Ok(None) => "the claim no longer exists".to_string(),
            Ok(Some(claim)) => match node_allocation(&claim, &c, plugin.node(), &geometry) {
                Ok(a) => {
                    // What the claim holds, for the publisher (the only source after a restart).
                    plugin.set_held(&c.uid, Some(a.held));
                    continue;
                }
                Err(
                    e @ (ClaimError::Uid { .. }
                    | ClaimError::NotAllocated { .. }
                    | ClaimError::NotOurs { .. }),
                ) => e.to_string(),
                // Allocated here but unreadable: keep it; prepare reports the problem.
                Err(_) => continue,
            },
            Err(e) => {
                report.unknown.push(format!("{c}: {e}"));
                continue;
            }
        };
        let registry = plugin.registry().clone();
        let writer = plugin.writer().clone();
        let claim = c.clone();
        tokio::task::spawn_blocking(move || release(&registry, &*writer, &claim))
            .await
            .map_err(|e| CleanupError::Registry(e.to_string()))??;
        plugin.set_held(&c.uid, None);
        report.released.push((c.uid.clone(), why));
    }
    Ok(report)
}

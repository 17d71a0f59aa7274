//! Claim bookings nobody will unprepare: a claim deleted, re-created under another UID, or no
//! longer allocated to this node (the kubelet may have missed the unprepare while the plugin
//! was down). Such a booking is released, unless a container the claim was given to still
//! runs: then the memory is still in use, so the booking is kept (marked gone in the registry,
//! withdrawn from what the publisher offers, logged once) and the registry reaps it when the
//! last of those containers has exited. Run at start, periodically, and at once when a prepare
//! was refused for capacity someone holds; container exits never release a live claim.

use gpuslice_registry::{ClaimLeft, Registry, RegistryError};

use crate::booking::{held_by, BookingError, Plugin};
use crate::claim::{node_allocation, ClaimError, ClaimRef, SlotGeometry};

/// A booking kept after its claim left the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub claim: ClaimRef,
    pub reservation: String,
    /// What the API server said.
    pub why: String,
    /// Containers of the claim that may still run processes.
    pub running: usize,
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "keeping the booking of {} (reservation {}): {}, but {} container(s) it was given to still run; it is offered to no one and released when the last exits",
            self.claim, self.reservation, self.why, self.running
        )
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    /// UIDs of the claims released, with why.
    pub released: Vec<(String, String)>,
    /// Bookings this pass found gone from the API server but still in use (later passes that
    /// keep them again do not list them).
    pub kept: Vec<Kept>,
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

/// Runs `f` on the node registry off the async threads, for claim `c`'s booking.
async fn on_registry<T: Send + 'static>(
    plugin: &Plugin,
    c: &ClaimRef,
    f: impl FnOnce(&Registry) -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, CleanupError> {
    let registry = plugin.registry().clone();
    tokio::task::spawn_blocking(move || f(&registry))
        .await
        .map_err(|e| CleanupError::Registry(e.to_string()))?
        .map_err(|e| {
            CleanupError::Release(BookingError::Registry {
                claim: c.to_string(),
                source: Box::new(e),
            })
        })
}

/// Checks every claim booking in the registry against the API server; releases the stale
/// ones whose containers have all exited and keeps the others.
pub async fn release_stale(plugin: &Plugin) -> Result<CleanupReport, CleanupError> {
    let registry = plugin.registry().clone();
    let file = tokio::task::spawn_blocking(move || registry.snapshot())
        .await
        .map_err(|e| CleanupError::Registry(e.to_string()))?
        .map_err(|e| CleanupError::Registry(e.to_string()))?;
    let geometry = SlotGeometry::new(plugin.slots_per_gpu(), &file.inventory);
    let mut report = CleanupReport::default();
    for (seen, marked, c) in file.reservations.iter().filter_map(|r| {
        let marked = r.owner.claim_gone().is_some();
        Some((r.id.clone(), marked, held_by(r)?))
    }) {
        let why = match plugin.read_claim(&c.namespace, &c.name).await {
            Ok(None) => "the claim no longer exists".to_string(),
            Ok(Some(claim)) => match node_allocation(&claim, &c, plugin.node(), &geometry) {
                Ok(a) => {
                    if marked {
                        // Allocated here again while the kubelet kept it prepared (no new
                        // prepare comes): a live booking again, not reaped with its containers.
                        let uid = c.uid.clone();
                        on_registry(plugin, &c, move |r| r.claim_back(&uid, &seen)).await?;
                    }
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
        // Only the booking this pass read is released: a prepare may have booked the claim
        // again since the API server answered (the kubelet unprepared and prepared it anew).
        let (uid, reason) = (c.uid.clone(), why.clone());
        let left = on_registry(plugin, &c, move |r| r.claim_left(&uid, &seen, &reason)).await?;
        // Kept or released, the scheduler no longer counts it: the publisher withdraws what a
        // kept booking holds, as it does the node paths'.
        if !matches!(left, ClaimLeft::Rebooked { .. }) {
            plugin.set_held(&c.uid, None);
        }
        match left {
            // Booked again since: the next pass asks the API server about that booking.
            ClaimLeft::Rebooked { .. } => {}
            ClaimLeft::Kept {
                reservation,
                running,
                newly,
            } => {
                if newly {
                    report.kept.push(Kept {
                        claim: c,
                        reservation: reservation.id,
                        why,
                        running,
                    });
                }
            }
            // Released meanwhile by whoever released it (an unprepare removes its spec).
            ClaimLeft::Released(v) if v.is_empty() => {}
            ClaimLeft::Released(_) => {
                let writer = plugin.writer().clone();
                let uid = c.uid.clone();
                tokio::task::spawn_blocking(move || writer.remove(&uid))
                    .await
                    .map_err(|e| CleanupError::Registry(e.to_string()))?
                    .map_err(|source| BookingError::Write {
                        claim: c.to_string(),
                        source,
                    })?;
                report.released.push((c.uid.clone(), why));
            }
        }
    }
    Ok(report)
}

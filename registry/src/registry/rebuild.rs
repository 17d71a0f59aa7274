//! `gc --rebuild`: reconstructs `registry.json` from a fresh inventory and the slice records
//! of owners that are still alive, keeping an unusable file aside.

use std::fmt;
use std::path::PathBuf;

use crate::load::{missing_gpus, violations};
use crate::model::{Inventory, RegistryFile, Reservation};
use crate::reap::{Liveness, Probe, ReapReason, Reaped};
use crate::store::{self, Loaded, StoreError};

use super::{check_inventory, sync_indices, Registry, RegistryError};

/// What `rebuild` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Where the unusable registry file was moved.
    pub moved_aside: Option<PathBuf>,
    /// Live reservations restored from their records.
    pub restored: Vec<Reservation>,
    /// Records of owners that are gone, removed.
    pub dropped: Vec<Reaped>,
    /// Slice directories whose record could not be read, and what became of each.
    pub unreadable: Vec<UnreadableRecord>,
    /// Restored reservations on GPUs the inventory lacks: (reservation id, GPU UUID).
    pub missing: Vec<(String, String)>,
    /// Capacity rules the restored set breaks (after an inventory shrink), one line each.
    pub violations: Vec<String>,
}

/// A slice directory whose record `rebuild` could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableRecord {
    pub id: String,
    /// Why the record could not be read; names its path.
    pub error: String,
    pub outcome: UnreadableOutcome,
}

/// What `rebuild` did with a slice directory whose record it could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnreadableOutcome {
    /// The usable `registry.json` lists it and its owner is alive: restored from that entry
    /// (also in `restored`), its record written again from it unless `rewrite_failed` says
    /// why not.
    Restored { rewrite_failed: Option<String> },
    /// The usable `registry.json` lists it but its owner is gone: dropped with that entry
    /// (also in `dropped`), its directory removed.
    Dropped,
    /// No usable `registry.json` lists it: nothing is booked for it and its directory is
    /// left in place.
    LeftInPlace,
}

impl fmt::Display for UnreadableRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; ", self.error)?;
        match &self.outcome {
            UnreadableOutcome::Restored {
                rewrite_failed: None,
            } => write!(
                f,
                "reservation {} restored from the registry's entry and its record written again",
                self.id
            ),
            UnreadableOutcome::Restored {
                rewrite_failed: Some(e),
            } => write!(
                f,
                "reservation {} restored from the registry's entry, but its record was not written again ({e}): fix that and run `gpuslice gc --rebuild` again",
                self.id
            ),
            UnreadableOutcome::Dropped => write!(
                f,
                "reservation {} dropped with the registry's entry, as its owner is gone",
                self.id
            ),
            UnreadableOutcome::LeftInPlace => write!(
                f,
                "no usable registry lists reservation {}, so nothing is booked for it; its directory is left in place: if a container still uses it, fix the record and run `gpuslice gc --rebuild`, else remove the directory",
                self.id
            ),
        }
    }
}

impl Registry {
    /// Rebuilds `registry.json` from `inventory` and the records of live owners in
    /// `slices/*/reservation.json`. An unusable registry file is kept as
    /// `registry.json.corrupt-<unix ms>`; a usable one lends its counters and stands in for
    /// the records of the reservations it lists whose record is missing or unreadable (a
    /// live one is restored and its record written again). A record that cannot be read and
    /// that no usable file lists is reported and left in place, neither booked nor removed.
    pub fn rebuild(&self, inventory: Inventory) -> Result<RebuildReport, RegistryError> {
        check_inventory(&inventory)?;
        let _lock = store::lock(&self.paths.lock)?;
        let mut live = Liveness::new(&*self.system, 0, 0, Probe::Full)?;
        let now = live.now_ms();
        let mut report = RebuildReport::default();
        // A usable file also lends its reservations: a live one whose record is missing
        // (removed by hand, or a crash before it was written) is kept.
        let mut listed: Vec<Reservation> = Vec::new();
        let counters = match store::load(&self.paths.registry)? {
            Loaded::Missing => Default::default(),
            Loaded::Ok(f) => {
                listed = f.reservations;
                f.counters
            }
            Loaded::Corrupt(_) => {
                let aside = self
                    .paths
                    .state_dir
                    .join(format!("{}.corrupt-{now}", store::REGISTRY_FILE));
                // A hard link keeps the old file under its new name while the atomic write
                // below replaces `registry.json`, so no moment exists without a registry.
                std::fs::hard_link(&self.paths.registry, &aside).map_err(|source| {
                    StoreError::Io {
                        op: "keep a copy of",
                        path: self.paths.registry.clone(),
                        source,
                    }
                })?;
                report.moved_aside = Some(aside);
                Default::default()
            }
        };
        let mut seen: Vec<String> = Vec::new();
        // Unreadable records the usable file lists, with why: judged from that entry below.
        let mut broken: Vec<(String, String)> = Vec::new();
        for id in store::slice_ids(&self.paths)? {
            let is_listed = listed.iter().any(|r| r.id == id);
            match store::read_record(&self.paths, &id) {
                // The registry's entry vouches for it: decided below, never dropped unseen.
                Err(e) if is_listed => broken.push((id, e.to_string())),
                // Nothing vouches for it, and it may be a live slice of another build: it is
                // neither booked nor removed.
                Err(e) => {
                    seen.push(id.clone());
                    report.unreadable.push(UnreadableRecord {
                        id,
                        error: e.to_string(),
                        outcome: UnreadableOutcome::LeftInPlace,
                    });
                }
                // A directory without a record that the registry lists: decided below.
                Ok(None) if is_listed => {}
                Ok(None) => {
                    seen.push(id.clone());
                    report.dropped.push(Reaped {
                        id,
                        reservation: None,
                        reason: ReapReason::Orphan,
                    });
                }
                Ok(Some(mut r)) => {
                    seen.push(id.clone());
                    match live.verdict(&r)? {
                        Some(reason) => report.dropped.push(Reaped {
                            id,
                            reservation: Some(r),
                            reason,
                        }),
                        None => {
                            sync_indices(&mut r, &inventory);
                            report.restored.push(r);
                        }
                    }
                }
            }
        }
        for mut r in listed {
            if seen.contains(&r.id) {
                continue;
            }
            let unreadable = broken
                .iter()
                .position(|(id, _)| *id == r.id)
                .map(|i| broken.swap_remove(i).1);
            let outcome = match live.verdict(&r)? {
                Some(reason) => {
                    report.dropped.push(Reaped {
                        id: r.id.clone(),
                        reservation: Some(r.clone()),
                        reason,
                    });
                    UnreadableOutcome::Dropped
                }
                None => {
                    sync_indices(&mut r, &inventory);
                    // Without a record a later rebuild of a corrupt file loses it; best
                    // effort for a missing one, reported for an unreadable one.
                    let written = store::write_record(&self.paths, &r);
                    report.restored.push(r.clone());
                    UnreadableOutcome::Restored {
                        rewrite_failed: written.err().map(|e| e.to_string()),
                    }
                }
            };
            if let Some(error) = unreadable {
                report.unreadable.push(UnreadableRecord {
                    id: r.id,
                    error,
                    outcome,
                });
            }
        }
        report.unreadable.sort_by(|a, b| a.id.cmp(&b.id));
        report
            .restored
            .sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        let mut file = RegistryFile {
            inventory,
            reservations: report.restored.clone(),
            counters,
            processes_checked_ms: now,
            ..RegistryFile::default()
        };
        file.counters.reaped_total += report
            .dropped
            .iter()
            .filter(|d| d.reservation.is_some())
            .count() as u64;
        report.missing = missing_gpus(&file.inventory, &file.reservations)
            .into_iter()
            .map(|(id, uuid)| (id.to_string(), uuid.to_string()))
            .collect();
        report.violations = violations(&file, &self.options.placement);
        store::save(&self.paths.registry, &file)?;
        for d in &report.dropped {
            match &d.reservation {
                Some(r) => self.discard(r),
                None => {
                    let _ = store::remove_slice(&self.paths, &d.id);
                }
            }
        }
        Ok(report)
    }
}

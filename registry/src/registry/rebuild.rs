//! `gc --rebuild`: reconstructs `registry.json` from a fresh inventory and the slice records
//! of owners that are still alive, keeping an unusable file aside.

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
    /// Slice directories whose record could not be read; left in place.
    pub unreadable: Vec<String>,
    /// Restored reservations on GPUs the inventory lacks: (reservation id, GPU UUID).
    pub missing: Vec<(String, String)>,
    /// Capacity rules the restored set breaks (after an inventory shrink), one line each.
    pub violations: Vec<String>,
}

impl Registry {
    /// Rebuilds `registry.json` from `inventory` and the records of live owners in
    /// `slices/*/reservation.json`. An unusable registry file is kept as
    /// `registry.json.corrupt-<unix ms>`; a usable one only lends its counters.
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
        for id in store::slice_ids(&self.paths)? {
            seen.push(id.clone());
            match store::read_record(&self.paths, &id) {
                Err(e) => report.unreadable.push(e.to_string()),
                // A directory without a record that the registry lists: decided below.
                Ok(None) if listed.iter().any(|r| r.id == id) => {
                    seen.pop();
                }
                Ok(None) => {
                    report.dropped.push(Reaped {
                        id,
                        reservation: None,
                        reason: ReapReason::Orphan,
                    });
                }
                Ok(Some(mut r)) => match live.verdict(&r)? {
                    Some(reason) => report.dropped.push(Reaped {
                        id,
                        reservation: Some(r),
                        reason,
                    }),
                    None => {
                        sync_indices(&mut r, &inventory);
                        report.restored.push(r);
                    }
                },
            }
        }
        for mut r in listed {
            if seen.contains(&r.id) {
                continue;
            }
            match live.verdict(&r)? {
                Some(reason) => report.dropped.push(Reaped {
                    id: r.id.clone(),
                    reservation: Some(r),
                    reason,
                }),
                None => {
                    sync_indices(&mut r, &inventory);
                    // Best effort: without it a later rebuild of a corrupt file loses it.
                    let _ = store::write_record(&self.paths, &r);
                    report.restored.push(r);
                }
            }
        }
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

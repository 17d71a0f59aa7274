//! The registry handle. Every operation is one transaction: take the lock, read
//! `registry.json` once, reap reservations whose owner is gone, apply the change, write the
//! file once (atomically), release the lock, then drop the slice directories of what left
//! and tell the caller through the cleanup callback.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuslice_config::{Config, PlacementConfig};

use crate::id::{is_valid_id, new_id, IdError};
use crate::load::missing_gpus;
use crate::model::{Inventory, Owner, ProcessRef, RegistryFile, Reservation, ReservationState};
use crate::placement::{place, Refusal};
use crate::reap::{reap, Liveness, ReapReason, Reaped};
use crate::request::Request;
use crate::store::{self, Loaded, Paths, StoreError};
use crate::system::{RealSystem, System, SystemError};

/// Called for every reservation that leaves the registry (released or reaped), after the
/// registry no longer lists it; the CLI deletes the slice's CDI spec here. It must be
/// idempotent: a concurrent `gc` may find the leftover directory first and call it too.
pub type Cleanup = Box<dyn Fn(&Reservation) + Send + Sync>;

/// A cleanup callback that does nothing.
pub fn no_cleanup() -> Cleanup {
    Box::new(|_| {})
}

/// How the registry places and reaps.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub placement: PlacementConfig,
    /// A pending reservation not bound by then is reaped.
    pub pending_timeout: Duration,
    /// How long a process seen alive with its recorded start time is trusted before its
    /// start time is read again (exits are seen on every operation regardless).
    pub recheck_interval: Duration,
}

impl Options {
    /// Default [`Options::recheck_interval`].
    pub const DEFAULT_RECHECK: Duration = Duration::from_secs(1);

    /// The options a node config asks for.
    pub fn from_config(config: &Config) -> Options {
        Options {
            placement: config.placement.clone(),
            pending_timeout: config.registry.pending_timeout,
            recheck_interval: Options::DEFAULT_RECHECK,
        }
    }
}

/// A registry operation that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "registry {path} is unusable: {detail}; it is left untouched: run `gpuslice gc --rebuild`"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("`{id}` is not a reservation id; accepted: 16 lowercase hex characters")]
    InvalidId { id: String },
    #[error("reservation {id} is not in the registry {path} (released, or reaped because its owner went away)")]
    NotFound { id: String, path: PathBuf },
    #[error("reservation {id} is bound to container {bound}; it cannot be bound to container {requested}")]
    AlreadyBound {
        id: String,
        bound: String,
        requested: String,
    },
    #[error("reservation {id} is held by DRA claim {namespace}/{name}; claims are not bound to containers")]
    HeldByClaim {
        id: String,
        namespace: String,
        name: String,
    },
    #[error("cannot bind to container id ``: accepted: a non-empty container id")]
    EmptyContainerId,
    #[error(
        "process {pid} is not running (or is not the process named); nothing can be bound to it"
    )]
    NoProcess { pid: u32 },
    #[error("inventory refused: {detail}")]
    BadInventory { detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(transparent)]
    Id(#[from] IdError),
}

impl RegistryError {
    /// The refusal, when the request was refused by placement.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            RegistryError::Refused(r) => Some(r),
            _ => None,
        }
    }
}

/// What a release removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The reservations that left (empty when there was nothing to release).
    pub reservations: Vec<Reservation>,
    /// Set when `registry.json` is unusable: the slice directories were removed, the file
    /// was not changed; this is the one-line message to show.
    pub corrupt: Option<String>,
}

/// What an inventory update found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InventoryChange {
    /// Reservations that book a GPU the new inventory lacks: (reservation id, GPU UUID).
    /// They are kept.
    pub missing: Vec<(String, String)>,
}

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

/// One open transaction.
struct Txn {
    file: RegistryFile,
    dirty: bool,
    reaped: Vec<Reaped>,
    /// Reservations that left; their directories go and the cleanup runs after the write.
    removed: Vec<Reservation>,
    /// Slice directories to remove after the write that have no readable record.
    stray: Vec<String>,
    /// Slice directories created in this transaction, removed if the write fails.
    created: Vec<String>,
    now_ms: u64,
}

/// The node registry in one state directory.
pub struct Registry {
    paths: Paths,
    options: Options,
    system: Arc<dyn System>,
    cleanup: Cleanup,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("paths", &self.paths)
            .field("options", &self.options)
            .finish()
    }
}

impl Registry {
    /// Opens (creating the directories when missing) the registry in `state_dir`.
    pub fn open(
        state_dir: &Path,
        options: Options,
        system: Arc<dyn System>,
        cleanup: Cleanup,
    ) -> Result<Registry, RegistryError> {
        let paths = Paths::new(state_dir);
        paths.create()?;
        Ok(Registry {
            paths,
            options,
            system,
            cleanup,
        })
    }

    /// Opens the registry a node config names, on the real system (`/proc`).
    pub fn open_config(config: &Config, cleanup: Cleanup) -> Result<Registry, RegistryError> {
        Registry::open(
            &config.state_dir,
            Options::from_config(config),
            Arc::new(RealSystem::new("/proc")),
            cleanup,
        )
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.paths.state_dir
    }

    /// The registry file.
    pub fn registry_path(&self) -> &Path {
        &self.paths.registry
    }

    /// `state_dir/slices/<id>`: where the slice's files (limits, usage) live.
    pub fn slice_dir(&self, id: &str) -> PathBuf {
        self.paths.slice_dir(id)
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Identifies the live process `pid` (start time and boot id), for a bound owner.
    pub fn process_ref(&self, pid: u32) -> Result<ProcessRef, RegistryError> {
        let start_time = self
            .system
            .process_start_time(pid)?
            .ok_or(RegistryError::NoProcess { pid })?;
        Ok(ProcessRef {
            pid,
            start_time,
            boot_id: self.system.boot_id()?,
        })
    }

    fn corrupt(&self, detail: String) -> RegistryError {
        RegistryError::Corrupt {
            path: self.paths.registry.clone(),
            detail,
        }
    }

    /// Reads the registry without the lock (it is replaced atomically), as status does.
    pub fn snapshot(&self) -> Result<RegistryFile, RegistryError> {
        read_registry(&self.paths.state_dir)
    }

    fn reap_into(&self, txn: &mut Txn, force: bool) -> Result<(), RegistryError> {
        let recheck_ms =
            u64::try_from(self.options.recheck_interval.as_millis()).unwrap_or(u64::MAX);
        let before = txn.file.processes_checked_ms;
        let mut live = Liveness::new(&*self.system, before, recheck_ms, force)?;
        txn.now_ms = live.now_ms();
        let reaped = reap(&mut txn.file, &mut live)?;
        txn.dirty |= !reaped.is_empty() || txn.file.processes_checked_ms != before;
        txn.removed
            .extend(reaped.iter().filter_map(|r| r.reservation.clone()));
        txn.reaped.extend(reaped);
        Ok(())
    }

    /// Runs `op` as one locked transaction after reaping; writes the file when anything
    /// changed (also when `op` fails after counting a refusal).
    fn transact<T>(
        &self,
        force_recheck: bool,
        op: impl FnOnce(&mut Txn) -> Result<T, RegistryError>,
    ) -> Result<(T, Vec<Reaped>), RegistryError> {
        let lock = store::lock(&self.paths.lock)?;
        let file = match store::load(&self.paths.registry)? {
            Loaded::Missing => RegistryFile::default(),
            Loaded::Ok(f) => f,
            Loaded::Corrupt(detail) => return Err(self.corrupt(detail)),
        };
        let mut txn = Txn {
            file,
            dirty: false,
            reaped: Vec::new(),
            removed: Vec::new(),
            stray: Vec::new(),
            created: Vec::new(),
            now_ms: 0,
        };
        self.reap_into(&mut txn, force_recheck)?;
        let result = op(&mut txn);
        if txn.dirty {
            if let Err(e) = store::save(&self.paths.registry, &txn.file) {
                for id in &txn.created {
                    let _ = store::remove_slice(&self.paths, id);
                }
                return Err(e.into());
            }
        }
        // The registry no longer lists them, so their directories can go without the lock,
        // which keeps the serialised part of every operation short.
        drop(lock);
        for r in &txn.removed {
            self.discard(r);
        }
        for id in &txn.stray {
            // Best effort: a directory that resists is found again by `gc`.
            let _ = store::remove_slice(&self.paths, id);
        }
        result.map(|t| (t, txn.reaped))
    }

    /// Removes a departed reservation's directory and runs the cleanup callback. Failures to
    /// remove are left for `gc`, which reports leftover directories as orphans.
    fn discard(&self, r: &Reservation) {
        let _ = store::remove_slice(&self.paths, &r.id);
        (self.cleanup)(r);
    }

    /// Reserves a slice. The reservation is pending (reaped after the pending timeout unless
    /// bound), or bound at once when the owner names its process or is a DRA claim.
    pub fn reserve(&self, request: &Request) -> Result<Reservation, RegistryError> {
        if let Some(p) = request.owner.process() {
            // Verified now, so the next full check of start times may be up to the recheck
            // interval away.
            if self.process_ref(p.pid).ok().as_ref() != Some(p) {
                return Err(RegistryError::NoProcess { pid: p.pid });
            }
        }
        let timeout_ms =
            u64::try_from(self.options.pending_timeout.as_millis()).unwrap_or(u64::MAX);
        let (r, _) = self.transact(false, |txn| {
            let gpus = match place(
                &txn.file.inventory,
                &txn.file.reservations,
                &self.options.placement,
                request,
            ) {
                Ok(b) => b,
                Err(refusal) => {
                    *txn.file
                        .counters
                        .refused_total
                        .entry(refusal.reason.as_str().to_string())
                        .or_default() += 1;
                    txn.dirty = true;
                    return Err(refusal.into());
                }
            };
            let id = loop {
                let id = new_id()?;
                if txn.file.reservation(&id).is_none() {
                    break id;
                }
            };
            let now = txn.now_ms;
            let held = matches!(request.owner, Owner::DraClaim { .. })
                || request.owner.process().is_some();
            let r = Reservation {
                id: id.clone(),
                state: if held {
                    ReservationState::Bound
                } else {
                    ReservationState::Pending
                },
                owner: request.owner.clone(),
                whole_gpu: request.whole_gpu,
                gpus,
                created_ms: now,
                deadline_ms: (!held).then(|| now.saturating_add(timeout_ms)),
                bound_ms: held.then_some(now),
            };
            if let Err(e) = store::write_record(&self.paths, &r) {
                let _ = store::remove_slice(&self.paths, &id);
                return Err(e.into());
            }
            txn.created.push(id);
            txn.file.reservations.push(r.clone());
            txn.file.counters.reserved_total += 1;
            txn.dirty = true;
            Ok(r)
        })?;
        Ok(r)
    }

    /// Binds reservation `id` to container `container_id` and its init process `pid`.
    /// Idempotent for the same container; a second container is refused.
    pub fn bind(
        &self,
        id: &str,
        container_id: &str,
        pid: u32,
    ) -> Result<Reservation, RegistryError> {
        if !is_valid_id(id) {
            return Err(RegistryError::InvalidId { id: id.to_string() });
        }
        if container_id.is_empty() {
            return Err(RegistryError::EmptyContainerId);
        }
        // Read the process before taking the lock: it is the slow part.
        let process = self.process_ref(pid)?;
        let (r, _) = self.transact(false, |txn| {
            let now = txn.now_ms;
            let r = txn
                .file
                .reservations
                .iter_mut()
                .find(|r| r.id == id)
                .ok_or_else(|| RegistryError::NotFound {
                    id: id.to_string(),
                    path: self.paths.registry.clone(),
                })?;
            match &mut r.owner {
                Owner::DraClaim {
                    namespace, name, ..
                } => {
                    return Err(RegistryError::HeldByClaim {
                        id: id.to_string(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    })
                }
                Owner::Container {
                    container_id: cid,
                    process: p,
                    ..
                } => {
                    if let Some(bound) = cid.as_deref().filter(|b| *b != container_id) {
                        return Err(RegistryError::AlreadyBound {
                            id: id.to_string(),
                            bound: bound.to_string(),
                            requested: container_id.to_string(),
                        });
                    }
                    if r.state == ReservationState::Bound
                        && p.as_ref() == Some(&process)
                        && cid.as_deref() == Some(container_id)
                    {
                        return Ok(r.clone());
                    }
                    *cid = Some(container_id.to_string());
                    *p = Some(process.clone());
                }
            }
            r.state = ReservationState::Bound;
            r.deadline_ms = None;
            r.bound_ms = Some(now);
            let r = r.clone();
            // The record first: a rebuild after a crash between the two writes then keeps
            // the binding.
            store::write_record(&self.paths, &r)?;
            txn.dirty = true;
            Ok(r)
        })?;
        Ok(r)
    }

    /// Releases reservation `id`. Idempotent: releasing an unknown id removes nothing. On an
    /// unusable registry the slice directory is still removed (and the cleanup run).
    pub fn release(&self, id: &str) -> Result<Released, RegistryError> {
        if !is_valid_id(id) {
            return Err(RegistryError::InvalidId { id: id.to_string() });
        }
        let outcome = self.transact(false, |txn| {
            let mut out = Vec::new();
            if let Some(pos) = txn.file.reservations.iter().position(|r| r.id == id) {
                let r = txn.file.reservations.remove(pos);
                txn.file.counters.released_total += 1;
                txn.dirty = true;
                txn.removed.push(r.clone());
                out.push(r);
            } else if self.paths.slice_dir(id).exists() {
                // Left by a crash after the registry dropped it: finish the job.
                match store::read_record(&self.paths, id) {
                    Ok(Some(r)) => txn.removed.push(r),
                    _ => txn.stray.push(id.to_string()),
                }
            }
            Ok(out)
        });
        match outcome {
            Ok((reservations, _)) => Ok(Released {
                reservations,
                corrupt: None,
            }),
            Err(e @ RegistryError::Corrupt { .. }) => {
                self.release_unusable(e, |r| r.id == id, Some(id))
            }
            Err(e) => Err(e),
        }
    }

    /// Releases every reservation of container `container_id`. Idempotent.
    pub fn release_container(&self, container_id: &str) -> Result<Released, RegistryError> {
        let outcome = self.transact(false, |txn| {
            let (gone, kept): (Vec<Reservation>, Vec<Reservation>) =
                std::mem::take(&mut txn.file.reservations)
                    .into_iter()
                    .partition(|r| r.owner.container_id() == Some(container_id));
            txn.file.reservations = kept;
            if !gone.is_empty() {
                txn.file.counters.released_total += gone.len() as u64;
                txn.dirty = true;
                txn.removed.extend(gone.iter().cloned());
            }
            Ok(gone)
        });
        match outcome {
            Ok((reservations, _)) => Ok(Released {
                reservations,
                corrupt: None,
            }),
            Err(e @ RegistryError::Corrupt { .. }) => {
                self.release_unusable(e, |r| r.owner.container_id() == Some(container_id), None)
            }
            Err(e) => Err(e),
        }
    }

    /// Release on an unusable registry: remove the matching slice directories (found through
    /// their records) under the lock, leave `registry.json` alone.
    fn release_unusable(
        &self,
        corrupt: RegistryError,
        matches: impl Fn(&Reservation) -> bool,
        id: Option<&str>,
    ) -> Result<Released, RegistryError> {
        let _lock = store::lock(&self.paths.lock)?;
        let ids = match id {
            Some(id) => vec![id.to_string()],
            None => store::slice_ids(&self.paths)?,
        };
        let mut out = Vec::new();
        for sid in ids {
            if let Ok(Some(r)) = store::read_record(&self.paths, &sid) {
                if matches(&r) {
                    self.discard(&r);
                    out.push(r);
                }
            }
        }
        // A directory named by id goes even when its record is unreadable.
        if let Some(id) = id {
            store::remove_slice(&self.paths, id)?;
        }
        Ok(Released {
            reservations: out,
            corrupt: Some(corrupt.to_string()),
        })
    }

    /// Reaps everything whose owner is gone (reading every process's start time), removes
    /// slice directories the registry does not list and stale temp files. Returns what went.
    pub fn gc(&self) -> Result<Vec<Reaped>, RegistryError> {
        let (orphans, mut reaped) = self.transact(true, |txn| {
            let mut orphans = Vec::new();
            for id in store::slice_ids(&self.paths)? {
                // Listed, or just reaped (its directory goes after the write).
                if txn.file.reservation(&id).is_some() || txn.removed.iter().any(|r| r.id == id) {
                    continue;
                }
                let record = store::read_record(&self.paths, &id).ok().flatten();
                match &record {
                    Some(r) => txn.removed.push(r.clone()),
                    None => txn.stray.push(id.clone()),
                }
                orphans.push(Reaped {
                    id,
                    reservation: record,
                    reason: ReapReason::Orphan,
                });
            }
            store::remove_stale_temps(&self.paths)?;
            Ok(orphans)
        })?;
        reaped.extend(orphans);
        Ok(reaped)
    }

    /// Replaces the cached inventory. Reservations are kept, also those on GPUs that are
    /// gone (reported); bookings follow their GPU's new index.
    pub fn set_inventory(&self, inventory: Inventory) -> Result<InventoryChange, RegistryError> {
        check_inventory(&inventory)?;
        let (change, _) = self.transact(false, |txn| {
            if txn.file.inventory != inventory {
                txn.file.inventory = inventory;
                txn.dirty = true;
            }
            for r in &mut txn.file.reservations {
                txn.dirty |= sync_indices(r, &txn.file.inventory);
            }
            let missing = missing_gpus(&txn.file.inventory, &txn.file.reservations)
                .into_iter()
                .map(|(id, uuid)| (id.to_string(), uuid.to_string()))
                .collect();
            Ok(InventoryChange { missing })
        })?;
        Ok(change)
    }

    /// Rebuilds `registry.json` from `inventory` and the records of live owners in
    /// `slices/*/reservation.json`. An unusable registry file is kept as
    /// `registry.json.corrupt-<unix ms>`; a usable one only lends its counters.
    pub fn rebuild(&self, inventory: Inventory) -> Result<RebuildReport, RegistryError> {
        check_inventory(&inventory)?;
        let _lock = store::lock(&self.paths.lock)?;
        let mut live = Liveness::new(&*self.system, 0, 0, true)?;
        let now = live.now_ms();
        let mut report = RebuildReport::default();
        let counters = match store::load(&self.paths.registry)? {
            Loaded::Missing => Default::default(),
            Loaded::Ok(f) => f.counters,
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
        for id in store::slice_ids(&self.paths)? {
            match store::read_record(&self.paths, &id) {
                Err(e) => report.unreadable.push(e.to_string()),
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
        report.violations = crate::load::violations(&file, &self.options.placement);
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

/// Sets each booking's index to its GPU's index in `inventory`; true when any changed.
fn sync_indices(r: &mut Reservation, inventory: &Inventory) -> bool {
    let mut changed = false;
    for b in &mut r.gpus {
        if let Some(g) = inventory.gpu(&b.uuid) {
            if b.index != g.index {
                b.index = g.index;
                changed = true;
            }
        }
    }
    changed
}

/// Refuses inventories with duplicate indexes or UUIDs, empty UUIDs or zero memory.
fn check_inventory(inventory: &Inventory) -> Result<(), RegistryError> {
    let bad = |detail: String| Err(RegistryError::BadInventory { detail });
    let mut indexes = std::collections::HashSet::new();
    let mut uuids = std::collections::HashSet::new();
    for g in &inventory.gpus {
        if !indexes.insert(g.index) {
            return bad(format!(
                "GPU index {} appears twice; accepted: distinct indexes",
                g.index
            ));
        }
        if g.uuid.is_empty() || !uuids.insert(g.uuid.to_ascii_lowercase()) {
            return bad(format!(
                "GPU {} has UUID `{}`, empty or taken; accepted: distinct UUIDs",
                g.index, g.uuid
            ));
        }
        if g.memory_total == 0 {
            return bad(format!(
                "GPU {} has 0 bytes of memory; accepted: more than 0",
                g.index
            ));
        }
    }
    Ok(())
}

/// Reads `state_dir/registry.json` without the lock (the file is replaced atomically). A
/// missing file is an empty registry.
pub fn read_registry(state_dir: &Path) -> Result<RegistryFile, RegistryError> {
    let path = state_dir.join(store::REGISTRY_FILE);
    match store::load(&path)? {
        Loaded::Missing => Ok(RegistryFile::default()),
        Loaded::Ok(f) => Ok(f),
        Loaded::Corrupt(detail) => Err(RegistryError::Corrupt { path, detail }),
    }
}

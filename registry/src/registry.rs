//! The registry handle and its transaction. Every operation is one transaction: take the
//! lock, read `registry.json` once, reap reservations whose owner is gone, apply the change,
//! write the file once (atomically), release the lock, then drop the slice directories of
//! what left and tell the caller through the cleanup callback.
//!
//! Work that does not need the lock happens after it: the records of new reservations
//! (nobody knows their ids yet) and the existence probes of owning processes, whose finds
//! are reaped in a second short transaction before the operation returns. A reservation
//! that does not fit probes under the lock first, so capacity held by exited owners is
//! never refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuslice_config::{Config, PlacementConfig};

use crate::id::IdError;
use crate::model::{Inventory, ProcessRef, RegistryFile, Reservation};
use crate::placement::Refusal;
use crate::reap::{reap, Liveness, Probe, ReapReason, Reaped};
use crate::store::{self, Loaded, Paths, StoreError};

mod claims;
mod ops;
mod rebuild;

use crate::system::{RealSystem, System, SystemError};
pub use claims::{claim_uid, ClaimLeft, ClaimReservation, ClaimShare, MAX_CLAIM_MEMBERS};
pub use rebuild::{RebuildReport, UnreadableOutcome, UnreadableRecord};

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
    /// How often the start times of all bound owners are read again, to see reused pids and
    /// zombies (exits are seen on every operation regardless).
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
    #[error("reservation {id} is held by container {owner}, not by a DRA claim; only a claim's containers join it (its own createRuntime hook binds a container's slice)")]
    NotAClaim { id: String, owner: String },
    #[error("reservation {id} of claim {namespace}/{name} already records {max} running containers; accepted: at most {max} containers per claim on a node")]
    ClaimFull {
        id: String,
        namespace: String,
        name: String,
        max: usize,
    },
    #[error("reservation {id} was made by process {reserver}, which still runs, and container init {pid} is not one of its descendants: only the create that reserved a slice may bind it")]
    NotReserver { id: String, reserver: u32, pid: u32 },
    #[error("reservation {id} is held by {holder}; the poststop hook of container {container} leaves it: a container releases only the slice bound to it once none of its processes is left, or a pending one it could bind")]
    NotReleased {
        id: String,
        holder: String,
        container: String,
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

/// What `gc` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// What went: reservations whose owner is gone, slice directories the registry does not
    /// list.
    pub reaped: Vec<Reaped>,
    /// Slice directories the registry does not list whose record cannot be read: left in
    /// place ([`UnreadableOutcome::LeftInPlace`]), since gc cannot tell them from a live
    /// slice whose record only this build cannot read.
    pub unreadable: Vec<UnreadableRecord>,
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
    /// New reservations whose records are written after the lock is released.
    records: Vec<Reservation>,
    /// Whether owning processes were probed under the lock (else they are after it).
    probed: bool,
    now_ms: u64,
}

impl Txn {
    /// The reservation `id` of the file, for changing it; `registry` names the file in the
    /// error when there is none.
    fn reservation_mut(
        &mut self,
        id: &str,
        registry: &std::path::Path,
    ) -> Result<&mut Reservation, RegistryError> {
        self.file
            .reservations
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or_else(|| RegistryError::NotFound {
                id: id.to_string(),
                path: registry.to_path_buf(),
            })
    }

    /// Takes every reservation `matches` selects out of the file, counting them released;
    /// their directories go after the write. Returns them.
    fn release_matching(&mut self, matches: impl Fn(&Reservation) -> bool) -> Vec<Reservation> {
        let (gone, kept): (Vec<Reservation>, Vec<Reservation>) =
            std::mem::take(&mut self.file.reservations)
                .into_iter()
                .partition(|r| matches(r));
        self.file.reservations = kept;
        if !gone.is_empty() {
            self.file.counters.released_total += gone.len() as u64;
            self.dirty = true;
            self.removed.extend(gone.iter().cloned());
        }
        gone
    }
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
        let owner = rustix::process::geteuid().as_raw();
        // Checked before anything is created in it, and again once it exists.
        check_state_dir(state_dir, owner)?;
        paths.create()?;
        check_state_dir(state_dir, owner)?;
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

    /// `state_dir/slices/<id>`: where the slice's files (limits, usage) live; an `id` that
    /// is not a reservation id is refused, never joined.
    pub fn slice_dir(&self, id: &str) -> Result<PathBuf, RegistryError> {
        Ok(self.paths.slice_dir(id)?)
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Identifies the live process `pid` (start time and boot id) and the cgroup that holds
    /// its container's processes, for a bound owner.
    pub fn process_ref(&self, pid: u32) -> Result<ProcessRef, RegistryError> {
        let mut p = self.bare_process_ref(pid)?;
        p.cgroup = self.system.process_cgroup(pid)?;
        Ok(p)
    }

    /// Identifies the live process `pid` by start time and boot id alone.
    fn bare_process_ref(&self, pid: u32) -> Result<ProcessRef, RegistryError> {
        let start_time = self
            .system
            .process_start_time(pid)?
            .ok_or(RegistryError::NoProcess { pid })?;
        Ok(ProcessRef {
            pid,
            start_time,
            boot_id: self.system.boot_id()?,
            cgroup: None,
            unknown: Default::default(),
        })
    }

    /// Whether the owner process `p` is gone: it exited or its pid names another process,
    /// and the cgroup it was seen in holds no process either; or it ran before a reboot.
    fn owner_gone(&self, p: &ProcessRef) -> Result<bool, RegistryError> {
        if p.boot_id != self.system.boot_id()? {
            return Ok(true);
        }
        let alive = self.system.process_start_time(p.pid)? == Some(p.start_time);
        Ok(!alive
            && !p
                .cgroup
                .as_deref()
                .is_some_and(|c| self.system.cgroup_populated(c)))
    }

    /// Whether the live process `pid` is `ancestor` or descends from it (up to 32 levels).
    fn descends_from(&self, pid: u32, ancestor: &ProcessRef) -> Result<bool, RegistryError> {
        let mut cur = pid;
        for _ in 0..32 {
            if cur == ancestor.pid {
                return Ok(self.system.process_start_time(cur)? == Some(ancestor.start_time));
            }
            match self.system.process_parent(cur)? {
                Some(parent) if parent != 0 && parent != cur => cur = parent,
                _ => return Ok(false),
            }
        }
        Ok(false)
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

    /// Reaps what `probe` lets this pass see into the open transaction.
    fn reap_into(&self, txn: &mut Txn, probe: Probe) -> Result<(), RegistryError> {
        let recheck_ms =
            u64::try_from(self.options.recheck_interval.as_millis()).unwrap_or(u64::MAX);
        let before = txn.file.processes_checked_ms;
        let mut live = Liveness::new(&*self.system, before, recheck_ms, probe)?;
        txn.now_ms = live.now_ms();
        txn.probed |= live.probes();
        let reaped = reap(&mut txn.file, &mut live)?;
        txn.dirty |= !reaped.is_empty() || txn.file.processes_checked_ms != before;
        txn.removed
            .extend(reaped.iter().filter_map(|r| r.reservation.clone()));
        txn.reaped.extend(reaped);
        Ok(())
    }

    /// Runs `op` as one registry operation: a locked transaction after reaping (every owner
    /// probed when `force_recheck`), then the work that needs no lock. Returns what `op`
    /// returned and everything reaped on the way.
    fn transact<T>(
        &self,
        force_recheck: bool,
        op: impl FnOnce(&mut Txn) -> Result<T, RegistryError>,
    ) -> Result<(T, Vec<Reaped>), RegistryError> {
        let probe = if force_recheck {
            Probe::Full
        } else {
            Probe::Deferred
        };
        let done = self.locked(probe, op)?;
        let mut reaped = done.reaped;
        // A crash before a record is written leaves its reservation listed without one: a
        // pending one is reaped at its deadline, a claim's is written when the claim is
        // prepared again (`reserve_claim`).
        for r in &done.records {
            if let Err(e) = store::write_record(&self.paths, r) {
                // Nobody has the id yet: take the reservation back before saying so.
                let _ = self.release(&r.id);
                let _ = store::remove_slice(&self.paths, &r.id);
                return Err(e.into());
            }
        }
        if let Some(file) = done.unprobed {
            // Best effort: `op` has happened and must be reported as it went; what this pass
            // cannot reap (the lock or file failing now), the next operation finds again.
            if let Ok(more) = self.reap_exited(&file) {
                reaped.extend(more);
            }
        }
        done.result.map(|t| (t, reaped))
    }

    /// Probes the owners listed in `file` (as this operation left it) and reaps those that
    /// exited, in a second transaction; an owner re-bound meanwhile is kept.
    fn reap_exited(&self, file: &RegistryFile) -> Result<Vec<Reaped>, RegistryError> {
        let mut seen: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
        let mut exited: Vec<(&str, &ProcessRef)> = Vec::new();
        let mut populated: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        for r in &file.reservations {
            if let Some(p) = r.owner.process() {
                let system = &self.system;
                if *seen
                    .entry(p.pid)
                    .or_insert_with(|| system.process_exists(p.pid))
                {
                    continue;
                }
                // Init is gone; its container lives on while its cgroup holds processes.
                let left = p.cgroup.as_deref().is_some_and(|c| {
                    *populated
                        .entry(c)
                        .or_insert_with(|| system.cgroup_populated(c))
                });
                if !left {
                    exited.push((&r.id, p));
                }
            }
        }
        if exited.is_empty() {
            return Ok(Vec::new());
        }
        let done = self.locked(Probe::Deferred, |txn| {
            let mut gone = Vec::new();
            txn.file.reservations.retain(|r| {
                let exit = exited
                    .iter()
                    .any(|(id, p)| r.id == *id && r.owner.process() == Some(*p));
                if exit {
                    gone.push(r.clone());
                }
                !exit
            });
            if !gone.is_empty() {
                txn.file.counters.reaped_total += gone.len() as u64;
                txn.dirty = true;
                for r in gone {
                    let pid = r.owner.process().map_or(0, |p| p.pid);
                    txn.removed.push(r.clone());
                    txn.reaped.push(Reaped {
                        id: r.id.clone(),
                        reservation: Some(r),
                        reason: ReapReason::Exited { pid },
                    });
                }
            }
            Ok(())
        });
        done.and_then(|done| done.result.map(|()| done.reaped))
    }

    /// The locked part of an operation: lock, load, reap as `probe` allows, `op`, write
    /// when anything changed (also when `op` fails after counting a refusal), unlock, then
    /// remove the directories of what left.
    fn locked<T>(
        &self,
        probe: Probe,
        op: impl FnOnce(&mut Txn) -> Result<T, RegistryError>,
    ) -> Result<Locked<T>, RegistryError> {
        // Read (and cached) before the lock: owners are checked against it under the lock.
        let _ = self.system.boot_id();
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
            records: Vec::new(),
            probed: false,
            now_ms: 0,
        };
        self.reap_into(&mut txn, probe)?;
        let result = op(&mut txn);
        if txn.dirty {
            store::save(&self.paths.registry, &txn.file)?;
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
        Ok(Locked {
            result,
            reaped: txn.reaped,
            records: txn.records,
            unprobed: (!txn.probed).then_some(txn.file),
        })
    }

    /// Removes a departed reservation's directory and runs the cleanup callback. Failures to
    /// remove are left for `gc`, which reports leftover directories as orphans.
    fn discard(&self, r: &Reservation) {
        let _ = store::remove_slice(&self.paths, &r.id);
        (self.cleanup)(r);
    }
}

/// What the locked part of an operation left for the rest of it.
struct Locked<T> {
    result: Result<T, RegistryError>,
    reaped: Vec<Reaped>,
    /// Records of new reservations, to write now.
    records: Vec<Reservation>,
    /// The file as written, when its owners were not probed under the lock.
    unprobed: Option<RegistryFile>,
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

/// Refuses a state directory (or its `registry.json`) that is a symbolic link, is not owned
/// by uid `owner` or is writable by group or others; [`Registry::open`] checks with the
/// caller's effective uid (root on a node).
pub fn check_state_dir(state_dir: &Path, owner: u32) -> Result<(), RegistryError> {
    Ok(store::check_state_dir(state_dir, owner)?)
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

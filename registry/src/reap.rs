//! Reaping: which reservations have lost their owner. Pending ones past their deadline, and
//! bound ones whose process exited, whose pid now names another process (start time differs)
//! or that predate a reboot (boot id differs). DRA claims are released, not reaped, while the
//! claim exists; one kept after its claim left the API server ([`ClaimGone`]) is reaped once
//! every container it was given to has exited.
//!
//! Exits are seen on every call through a cheap existence probe (`getpgid`; a zombie still
//! exists). Reading start times costs a `/proc` read per process, so they are all read in
//! one pass at most every `recheck_ms` (and on `force`, as `gpuslice gc` does); processes
//! added in between were verified when they were added. A reused pid or a zombie owner is
//! therefore seen within `recheck_ms`, an ordinary exit at once.
//!
//! The existence probes are one syscall per owner, so the registry runs them after its
//! write, outside the lock ([`Probe::Deferred`] under it), and reaps what they find in a second
//! short transaction: the serialised part of an operation stays independent of how many
//! processes own reservations.
//!
//! A container's owner is its init process *and* the processes of its cgroup: a container
//! without its own pid namespace keeps its children when init exits, and they still hold
//! the slice's memory. So an owner whose init is gone is only reaped once the cgroup
//! recorded at bind ([`ProcessRef::cgroup`]) holds no process.

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::model::{ClaimGone, Owner, ProcessRef, RegistryFile, Reservation, ReservationState};
use crate::system::{System, SystemError};

/// Why a reservation was reaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReapReason {
    /// Pending and not bound by its deadline.
    Expired { deadline_ms: u64, now_ms: u64 },
    /// The owning process is gone.
    Exited { pid: u32 },
    /// The pid now belongs to another process.
    PidReused { pid: u32, recorded: u64, found: u64 },
    /// Bound before the last reboot.
    Rebooted { recorded: String },
    /// A slice directory that the registry does not list (left by a crash).
    Orphan,
    /// A claim kept after it left the API server, whose last container has exited.
    ClaimGone { why: String },
}

impl fmt::Display for ReapReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReapReason::Expired {
                deadline_ms,
                now_ms,
            } => write!(
                f,
                "pending and not bound to a container by its deadline ({} ms ago)",
                now_ms.saturating_sub(*deadline_ms)
            ),
            ReapReason::Exited { pid } => write!(f, "owning process {pid} exited"),
            ReapReason::PidReused {
                pid,
                recorded,
                found,
            } => write!(
                f,
                "pid {pid} now belongs to another process (start time {found}, bound at {recorded})"
            ),
            ReapReason::Rebooted { recorded } => {
                write!(f, "bound before a reboot (boot id {recorded})")
            }
            ReapReason::Orphan => f.write_str("slice directory not listed in the registry"),
            ReapReason::ClaimGone { why } => write!(
                f,
                "kept after its claim left the API server ({why}); its last container exited"
            ),
        }
    }
}

/// A reservation removed because its owner is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub id: String,
    /// The record, when one was readable (an orphan directory may have none).
    pub reservation: Option<Reservation>,
    pub reason: ReapReason,
}

impl fmt::Display for Reaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reservation {
            Some(r) => write!(f, "{} ({}): {}", self.id, r.owner, self.reason),
            None => write!(f, "{}: {}", self.id, self.reason),
        }
    }
}

/// How much a reaping pass asks of the system about owning processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The boot id; existence and start times only when the last full pass is `recheck_ms`
    /// old. Exits are otherwise left to a probe after the write.
    Deferred,
    /// Existence of every owner; start times too when the last full pass is `recheck_ms`
    /// old.
    Due,
    /// Existence and start times of every owner (`gpuslice gc`, rebuild).
    Full,
}

/// Process checks for one reaping pass, memoised per pid.
pub(crate) struct Liveness<'a> {
    system: &'a dyn System,
    now_ms: u64,
    /// Read on first need: a registry without bound processes never asks.
    boot_id: Option<String>,
    /// Probe that owners exist in this pass.
    probe: bool,
    /// Read start times in this pass.
    full: bool,
    exists: HashMap<u32, bool>,
    verdicts: HashMap<(u32, u64), Option<ReapReason>>,
    populated: HashMap<String, bool>,
}

impl<'a> Liveness<'a> {
    /// A pass that probes as `probe` says, `Due` reading start times when the last full
    /// pass (at `checked_ms`) is `recheck_ms` old.
    pub(crate) fn new(
        system: &'a dyn System,
        checked_ms: u64,
        recheck_ms: u64,
        probe: Probe,
    ) -> Result<Liveness<'a>, SystemError> {
        let now_ms = system.now_ms();
        let due = now_ms.saturating_sub(checked_ms) >= recheck_ms || now_ms < checked_ms;
        Ok(Liveness {
            system,
            now_ms,
            boot_id: None,
            probe: probe != Probe::Deferred || due,
            full: probe == Probe::Full || due,
            exists: HashMap::new(),
            verdicts: HashMap::new(),
            populated: HashMap::new(),
        })
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Whether this pass probes that owners exist.
    pub(crate) fn probes(&self) -> bool {
        self.probe
    }

    /// Why this process no longer owns anything, or `None` while it lives.
    pub(crate) fn process_gone(
        &mut self,
        p: &ProcessRef,
    ) -> Result<Option<ReapReason>, SystemError> {
        let boot_id = match &self.boot_id {
            Some(b) => b,
            None => self.boot_id.insert(self.system.boot_id()?),
        };
        if p.boot_id != *boot_id {
            return Ok(Some(ReapReason::Rebooted {
                recorded: p.boot_id.clone(),
            }));
        }
        if !self.probe {
            return Ok(None);
        }
        let key = (p.pid, p.start_time);
        if let Some(v) = self.verdicts.get(&key) {
            return Ok(v.clone());
        }
        let system = self.system;
        let exists = *self
            .exists
            .entry(p.pid)
            .or_insert_with(|| system.process_exists(p.pid));
        let verdict = if !exists {
            Some(ReapReason::Exited { pid: p.pid })
        } else if !self.full {
            None
        } else {
            match system.process_start_time(p.pid)? {
                None => Some(ReapReason::Exited { pid: p.pid }),
                Some(found) if found != p.start_time => Some(ReapReason::PidReused {
                    pid: p.pid,
                    recorded: p.start_time,
                    found,
                }),
                Some(_) => None,
            }
        };
        self.verdicts.insert(key, verdict.clone());
        Ok(verdict)
    }

    /// Whether the cgroup `p` was seen in still holds processes (false when none was seen).
    pub(crate) fn cgroup_holds_processes(&mut self, p: &ProcessRef) -> bool {
        let Some(cgroup) = &p.cgroup else {
            return false;
        };
        let system = self.system;
        *self
            .populated
            .entry(cgroup.clone())
            .or_insert_with(|| system.cgroup_populated(cgroup))
    }

    /// Whether the container recorded as `m` may still run processes: its init is the same
    /// process (as far as this pass probes), or the cgroup it was seen in still holds some.
    pub(crate) fn member_runs(&mut self, m: &ProcessRef) -> Result<bool, SystemError> {
        Ok(match self.process_gone(m)? {
            None => true,
            Some(ReapReason::Rebooted { .. }) => false,
            Some(_) => self.cgroup_holds_processes(m),
        })
    }

    /// Why `r` has lost its owner, or `None` while it is held.
    pub(crate) fn verdict(&mut self, r: &Reservation) -> Result<Option<ReapReason>, SystemError> {
        if let Owner::DraClaim { members, gone, .. } = &r.owner {
            let Some(ClaimGone { why, .. }) = gone else {
                return Ok(None);
            };
            for m in members {
                if self.member_runs(m)? {
                    return Ok(None);
                }
            }
            return Ok(Some(ReapReason::ClaimGone { why: why.clone() }));
        }
        if let Some(p) = r.owner.process() {
            return match self.process_gone(p)? {
                rebooted @ Some(ReapReason::Rebooted { .. }) => Ok(rebooted),
                // Init is gone, its container's processes are not.
                Some(_) if self.cgroup_holds_processes(p) => Ok(None),
                other => Ok(other),
            };
        }
        match (r.state, r.deadline_ms) {
            (ReservationState::Pending, Some(deadline_ms)) if self.now_ms > deadline_ms => {
                Ok(Some(ReapReason::Expired {
                    deadline_ms,
                    now_ms: self.now_ms,
                }))
            }
            _ => Ok(None),
        }
    }
}

/// Removes every reservation that lost its owner from `file` and returns them, counted in
/// `reaped_total`; after a full pass, records its time in `processes_checked_ms`.
pub(crate) fn reap(
    file: &mut RegistryFile,
    live: &mut Liveness,
) -> Result<Vec<Reaped>, SystemError> {
    let mut gone: HashSet<usize> = HashSet::new();
    let mut reaped = Vec::new();
    for (i, r) in file.reservations.iter().enumerate() {
        if let Some(reason) = live.verdict(r)? {
            gone.insert(i);
            reaped.push(Reaped {
                id: r.id.clone(),
                reservation: Some(r.clone()),
                reason,
            });
        }
    }
    if !gone.is_empty() {
        let mut i = 0;
        file.reservations.retain(|_| {
            let keep = !gone.contains(&i);
            i += 1;
            keep
        });
        file.counters.reaped_total += reaped.len() as u64;
    }
    if live.full && !live.exists.is_empty() {
        file.processes_checked_ms = live.now_ms;
    }
    Ok(reaped)
}

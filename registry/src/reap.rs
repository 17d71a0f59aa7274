//! Reaping: which reservations have lost their owner. Pending ones past their deadline, and
//! bound ones whose process exited, whose pid now names another process (start time differs)
//! or that predate a reboot (boot id differs). DRA claims are never reaped.
//!
//! Exits are seen on every call through a cheap existence probe. Reading a process's start
//! time costs a `/proc` read, so a (pid, start time) pair seen alive is trusted for
//! `recheck_ms` before it is read again; `force` reads every one (as `gpuslice gc` does).

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::model::{Owner, ProcessCheck, ProcessRef, RegistryFile, Reservation, ReservationState};
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

/// Memo of process checks within one reaping pass and across passes (the file's
/// `process_checks`).
pub(crate) struct Liveness<'a> {
    system: &'a dyn System,
    now_ms: u64,
    boot_id: String,
    recheck_ms: u64,
    force: bool,
    previous: HashMap<(u32, u64), u64>,
    exists: HashMap<u32, bool>,
    verdicts: HashMap<(u32, u64), Option<ReapReason>>,
    /// Pairs seen alive in this pass, with when they were last read.
    seen: HashMap<(u32, u64), u64>,
}

impl<'a> Liveness<'a> {
    pub(crate) fn new(
        system: &'a dyn System,
        checks: &[ProcessCheck],
        recheck_ms: u64,
        force: bool,
    ) -> Result<Liveness<'a>, SystemError> {
        Ok(Liveness {
            system,
            now_ms: system.now_ms(),
            boot_id: system.boot_id()?,
            recheck_ms,
            force,
            previous: checks
                .iter()
                .map(|c| ((c.pid, c.start_time), c.checked_ms))
                .collect(),
            exists: HashMap::new(),
            verdicts: HashMap::new(),
            seen: HashMap::new(),
        })
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Why this process no longer owns anything, or `None` while it lives.
    pub(crate) fn process_gone(
        &mut self,
        p: &ProcessRef,
    ) -> Result<Option<ReapReason>, SystemError> {
        if p.boot_id != self.boot_id {
            return Ok(Some(ReapReason::Rebooted {
                recorded: p.boot_id.clone(),
            }));
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
        } else {
            let fresh = self
                .previous
                .get(&key)
                .filter(|&&at| !self.force && self.now_ms.saturating_sub(at) < self.recheck_ms);
            match fresh {
                Some(&at) => {
                    self.seen.insert(key, at);
                    None
                }
                None => match self.system.process_start_time(p.pid)? {
                    None => Some(ReapReason::Exited { pid: p.pid }),
                    Some(found) if found != p.start_time => Some(ReapReason::PidReused {
                        pid: p.pid,
                        recorded: p.start_time,
                        found,
                    }),
                    Some(_) => {
                        self.seen.insert(key, self.now_ms);
                        None
                    }
                },
            }
        };
        self.verdicts.insert(key, verdict.clone());
        Ok(verdict)
    }

    /// Why `r` has lost its owner, or `None` while it is held.
    pub(crate) fn verdict(&mut self, r: &Reservation) -> Result<Option<ReapReason>, SystemError> {
        if let Owner::DraClaim { .. } = r.owner {
            return Ok(None);
        }
        if let Some(p) = r.owner.process() {
            return self.process_gone(p);
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

    /// The process checks to keep: pairs seen alive in this pass.
    pub(crate) fn checks(&self) -> Vec<ProcessCheck> {
        let mut v: Vec<ProcessCheck> = self
            .seen
            .iter()
            .map(|(&(pid, start_time), &checked_ms)| ProcessCheck {
                pid,
                start_time,
                checked_ms,
            })
            .collect();
        v.sort_by_key(|c| (c.pid, c.start_time));
        v
    }
}

/// Removes every reservation that lost its owner from `file` and returns them; refreshes
/// `process_checks`. Counts them in `reaped_total`.
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
    file.process_checks = live.checks();
    Ok(reaped)
}

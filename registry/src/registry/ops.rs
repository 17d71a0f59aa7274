//! The registry's everyday operations: reserve, bind, release, gc and inventory updates,
//! each one transaction of [`Registry::transact`].

use crate::id::{is_valid_id, new_id};
use crate::load::missing_gpus;
use crate::model::{Inventory, Owner, ProcessRef, Reservation, ReservationState};
use crate::placement::place;
use crate::reap::{Probe, ReapReason, Reaped};
use crate::request::Request;
use crate::store;

use super::{
    check_inventory, sync_indices, GcReport, InventoryChange, Registry, RegistryError, Released,
    UnreadableOutcome, UnreadableRecord,
};

impl Registry {
    /// Reserves a slice. The reservation is pending (reaped after the pending timeout unless
    /// bound), or bound at once when the owner names its process or is a DRA claim.
    pub fn reserve(&self, request: &Request) -> Result<Reservation, RegistryError> {
        if let Some(p) = request.owner.process() {
            // Verified now, so the next full check of start times may be up to the recheck
            // interval away.
            if !self
                .bare_process_ref(p.pid)
                .is_ok_and(|found| found.same_process(p))
            {
                return Err(RegistryError::NoProcess { pid: p.pid });
            }
        }
        // A container's pending reservation names the process that made it (the wrapper or
        // the precreate hook): see `bind` and `give_back_pending`.
        let reserved_by = match (&request.owner, request.owner.process()) {
            (Owner::Container { .. }, None) => self
                .system
                .current_pid()
                .and_then(|pid| self.bare_process_ref(pid).ok()),
            _ => None,
        };
        let timeout_ms =
            u64::try_from(self.options.pending_timeout.as_millis()).unwrap_or(u64::MAX);
        let (r, _) = self.transact(false, |txn| {
            let mut placed = place(
                &txn.file.inventory,
                &txn.file.reservations,
                &self.options.placement,
                request,
            );
            if placed.is_err() && !txn.probed {
                // Owners that exited hold capacity until probed: probe them now, under the
                // lock, rather than refuse for them.
                self.reap_into(txn, Probe::Due)?;
                placed = place(
                    &txn.file.inventory,
                    &txn.file.reservations,
                    &self.options.placement,
                    request,
                );
            }
            let gpus = match placed {
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
                reserved_by,
                unknown: Default::default(),
            };
            // Its record is written after the lock is released: until the call returns,
            // nobody else knows the id.
            txn.records.push(r.clone());
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
            let r = txn.reservation_mut(id, &self.paths.registry)?;
            // While the process that reserved it runs, only containers it creates may bind
            // it: a spec carrying someone else's reservation (copied hooks, a slice's CDI
            // device) does not descend from it. A few /proc reads, under the lock so the
            // reservation cannot change in between.
            if let (ReservationState::Pending, Some(reserver)) = (r.state, &r.reserved_by) {
                self.check_binder(id, pid, reserver)?;
            }
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

    /// Refuses to bind `id` for the container whose init is `pid` unless `reserver` (the
    /// process that reserved it) is gone, or the init or the calling process descends from
    /// it.
    fn check_binder(&self, id: &str, pid: u32, reserver: &ProcessRef) -> Result<(), RegistryError> {
        if self.reserver_allows(Some(pid), reserver)? {
            return Ok(());
        }
        Err(RegistryError::NotReserver {
            id: id.to_string(),
            reserver: reserver.pid,
            pid,
        })
    }

    /// Whether a container may take a pending reservation that `reserver` made: `reserver`
    /// is gone, or the container's init `pid` (when known) or the calling process descends
    /// from it.
    fn reserver_allows(
        &self,
        pid: Option<u32>,
        reserver: &ProcessRef,
    ) -> Result<bool, RegistryError> {
        if self.owner_gone(reserver)? {
            return Ok(true);
        }
        for p in [pid, self.system.current_pid()].into_iter().flatten() {
            if p > 0 && self.descends_from(p, reserver)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether reservation `r` is container `container_id`'s and its owner is gone (no
    /// process of it is left): what the poststop hook of a stopped container releases.
    /// Container ids are unique per runtime root or namespace, not per node, so a booking of
    /// the same id whose owner still runs is another container's.
    fn held_by_stopped_container(
        &self,
        r: &Reservation,
        container_id: &str,
    ) -> Result<bool, RegistryError> {
        if r.owner.container_id() != Some(container_id) {
            return Ok(false);
        }
        match r.owner.process() {
            Some(p) => self.owner_gone(p),
            None => Ok(true),
        }
    }

    /// Who holds `r` when the poststop hook of container `container_id` (init `pid`, when
    /// the runtime still names it) may not release it; `None` when it may: `r` is bound to
    /// that container and its owner is gone ([`Registry::held_by_stopped_container`]), or it is
    /// pending and that container could bind it (`bind`'s rule).
    fn holder_besides(
        &self,
        r: &Reservation,
        container_id: &str,
        pid: Option<u32>,
    ) -> Result<Option<String>, RegistryError> {
        let Owner::Container {
            container_id: cid,
            process,
            ..
        } = &r.owner
        else {
            return Ok(Some(r.owner.to_string()));
        };
        if let Some(other) = cid.as_deref().filter(|c| *c != container_id) {
            return Ok(Some(format!("container {other}")));
        }
        match r.state {
            ReservationState::Bound => {
                if self.held_by_stopped_container(r, container_id)? {
                    return Ok(None);
                }
                let pid = process.as_ref().map_or(0, |p| p.pid);
                Ok(Some(match cid {
                    Some(c) => format!("container {c} of another runtime root or namespace, or still running (init {pid}, or processes left in its cgroup)"),
                    None => format!("process {pid}"),
                }))
            }
            ReservationState::Pending => match &r.reserved_by {
                Some(b) if !self.reserver_allows(pid, b)? => Ok(Some(format!(
                    "the create of process {}, which still runs (pending; this hook does not descend from it)",
                    b.pid
                ))),
                _ => Ok(None),
            },
        }
    }

    /// Releases the pending reservations the calling process made, when no hook has bound
    /// them: the runtime wrapper calls it when the runtime failed (it refused the edited spec
    /// before any hook ran), so the slice does not wait for the pending timeout. Bound ones
    /// are left to their poststop hook and to reaping.
    pub fn give_back_pending(&self) -> Result<Vec<Reservation>, RegistryError> {
        let Some(me) = self
            .system
            .current_pid()
            .and_then(|pid| self.bare_process_ref(pid).ok())
        else {
            return Ok(Vec::new());
        };
        let mine = |r: &Reservation| {
            r.state == ReservationState::Pending
                && r.reserved_by.as_ref().is_some_and(|b| b.same_process(&me))
        };
        let (gone, _) = self.transact(false, |txn| Ok(txn.release_matching(mine)))?;
        Ok(gone)
    }

    /// Releases the reservations of container `container_id` bound to the process `process`
    /// (what one createRuntime hook booked), leaving those of any other container that has
    /// the same id under another runtime root or namespace.
    pub fn release_container_process(
        &self,
        container_id: &str,
        process: &ProcessRef,
    ) -> Result<Vec<Reservation>, RegistryError> {
        let (gone, _) = self.transact(false, |txn| {
            Ok(txn.release_matching(|r| {
                r.owner.container_id() == Some(container_id)
                    && r.owner.process().is_some_and(|p| p.same_process(process))
            }))
        })?;
        Ok(gone)
    }

    /// Releases the reservations of container `container_id` whose owner is gone: the
    /// poststop hook of a container that names no reservation (whole GPUs). Container ids
    /// are unique per runtime root or namespace, not per node, so a reservation of the same
    /// id whose owner still runs belongs to another container and is kept. Idempotent.
    pub fn release_stopped_container(&self, container_id: &str) -> Result<Released, RegistryError> {
        // Judged outside the lock (process and cgroup reads); an owner cannot come back.
        let snapshot = match self.snapshot() {
            Ok(f) => Some(f),
            Err(RegistryError::Corrupt { .. }) => None,
            Err(e) => return Err(e),
        };
        let mut stopped: Vec<String> = Vec::new();
        for r in snapshot.iter().flat_map(|f| &f.reservations) {
            if self.held_by_stopped_container(r, container_id)? {
                stopped.push(r.id.clone());
            }
        }
        let outcome = self.transact(false, |txn| {
            Ok(txn.release_matching(|r| stopped.contains(&r.id)))
        });
        match outcome {
            Ok((reservations, _)) => Ok(Released {
                reservations,
                corrupt: None,
            }),
            Err(e @ RegistryError::Corrupt { .. }) => self.release_unusable(
                e,
                |r| {
                    self.held_by_stopped_container(r, container_id)
                        .unwrap_or(true)
                },
                None,
                false,
            ),
            Err(e) => Err(e),
        }
    }

    /// Releases reservation `id`, whoever holds it. Idempotent: releasing an unknown id
    /// removes nothing. On an unusable registry the slice directory is still removed (and
    /// the cleanup run).
    pub fn release(&self, id: &str) -> Result<Released, RegistryError> {
        self.release_checked(id, |_| Ok(()), |r| r.id == id, true)
    }

    /// Releases reservation `id` for the poststop hook of container `container_id` (its
    /// init `pid`, when the runtime's state still names it), only when that container holds
    /// it: bound to that container id with no process of it left (the rule of
    /// [`Registry::release_stopped_container`]), or pending and bindable by it (`bind`'s
    /// rule: its reserving process is gone, or the container or this hook descends from
    /// it). Anything else is left in place and refused ([`RegistryError::NotReleased`],
    /// naming the holder): the annotation a hook checks is written by whoever hands runc the
    /// spec, so it cannot decide whose slice goes. Judged under the lock, so the reservation
    /// cannot change in between. Idempotent: an unknown id releases nothing. On an
    /// unusable registry only the slice directory whose record shows the same holding goes.
    pub fn release_for_container(
        &self,
        id: &str,
        container_id: &str,
        pid: Option<u32>,
    ) -> Result<Released, RegistryError> {
        let held = |r: &Reservation| -> Result<(), RegistryError> {
            match self.holder_besides(r, container_id, pid)? {
                None => Ok(()),
                Some(holder) => Err(RegistryError::NotReleased {
                    id: id.to_string(),
                    holder,
                    container: container_id.to_string(),
                }),
            }
        };
        self.release_checked(
            id,
            held,
            |r| r.id == id && matches!(self.holder_besides(r, container_id, pid), Ok(None)),
            false,
        )
    }

    /// Releases reservation `id` when `allowed` lets it go (its error is returned, nothing
    /// released, otherwise). A directory of `id` that the registry does not list (left by a
    /// crash after the registry dropped it) goes too. On an unusable registry, the slice
    /// directory of `id` goes when its record `unusable_matches`, or, with `unreadable_too`,
    /// when it has no readable record.
    fn release_checked(
        &self,
        id: &str,
        allowed: impl FnOnce(&Reservation) -> Result<(), RegistryError>,
        unusable_matches: impl Fn(&Reservation) -> bool,
        unreadable_too: bool,
    ) -> Result<Released, RegistryError> {
        if !is_valid_id(id) {
            return Err(RegistryError::InvalidId { id: id.to_string() });
        }
        let outcome = self.transact(false, |txn| {
            let mut out = Vec::new();
            if let Some(pos) = txn.file.reservations.iter().position(|r| r.id == id) {
                allowed(&txn.file.reservations[pos])?;
                let r = txn.file.reservations.remove(pos);
                txn.file.counters.released_total += 1;
                txn.dirty = true;
                txn.removed.push(r.clone());
                out.push(r);
            } else if self.paths.slice_dir(id)?.exists() {
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
                self.release_unusable(e, unusable_matches, Some(id), unreadable_too)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases every reservation of container `container_id`. Idempotent.
    pub fn release_container(&self, container_id: &str) -> Result<Released, RegistryError> {
        let outcome = self.transact(false, |txn| {
            Ok(txn.release_matching(|r| r.owner.container_id() == Some(container_id)))
        });
        match outcome {
            Ok((reservations, _)) => Ok(Released {
                reservations,
                corrupt: None,
            }),
            Err(e @ RegistryError::Corrupt { .. }) => self.release_unusable(
                e,
                |r| r.owner.container_id() == Some(container_id),
                None,
                false,
            ),
            Err(e) => Err(e),
        }
    }

    /// Release on an unusable registry: remove the matching slice directories (found through
    /// their records; only `id`'s when given) under the lock, leave `registry.json` alone.
    /// With `unreadable_too`, `id`'s directory goes even when its record is unreadable.
    fn release_unusable(
        &self,
        corrupt: RegistryError,
        matches: impl Fn(&Reservation) -> bool,
        id: Option<&str>,
        unreadable_too: bool,
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
        // `release`: a directory named by id goes even when its record is unreadable.
        if let Some(id) = id.filter(|_| unreadable_too) {
            store::remove_slice(&self.paths, id)?;
        }
        Ok(Released {
            reservations: out,
            corrupt: Some(corrupt.to_string()),
        })
    }

    /// Reaps everything whose owner is gone (reading every process's start time), removes
    /// slice directories the registry does not list and stale temp files. Returns what went,
    /// and the unlisted slice directories left in place because their record cannot be read.
    pub fn gc(&self) -> Result<GcReport, RegistryError> {
        let ((orphans, unreadable), mut reaped) = self.transact(true, |txn| {
            let mut orphans = Vec::new();
            let mut unreadable = Vec::new();
            for id in store::slice_ids(&self.paths)? {
                // Listed, or just reaped (its directory goes after the write).
                if txn.file.reservation(&id).is_some() || txn.removed.iter().any(|r| r.id == id) {
                    continue;
                }
                let record = match store::read_record(&self.paths, &id) {
                    Ok(record) => record,
                    // Maybe a live slice whose record only another build reads, or one whose
                    // entry the registry lost: removing it would take the slice's files from
                    // a container that may still use it, and nothing could restore it.
                    Err(e) => {
                        unreadable.push(UnreadableRecord {
                            id,
                            error: e.to_string(),
                            outcome: UnreadableOutcome::LeftInPlace,
                        });
                        continue;
                    }
                };
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
            Ok((orphans, unreadable))
        })?;
        reaped.extend(orphans);
        Ok(GcReport { reaped, unreadable })
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
}

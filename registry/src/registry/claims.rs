//! Reservations held by Kubernetes DRA claims: the scheduler has already chosen the GPUs and
//! the capacity, so a claim is not placed but checked: exactly what it consumes is booked,
//! one reservation per claim UID, only where nobody else (a node path or another claim)
//! holds the capacity. A booking whose claim left the API server while containers it was
//! given to still run is kept for them ([`ClaimGone`]) and reaped when the last has exited.

use gpuslice_config::format_bytes;

use crate::id::is_valid_id;
use crate::load::{gpu_loads, memory_capacity};
use crate::model::{Booking, ClaimGone, Gpu, Owner, Reservation, ReservationState};
use crate::placement::{Refusal, RefusalReason};
use crate::reap::{Liveness, Probe};
use crate::store;

use super::{Registry, RegistryError, Released, Txn};

/// What a claim consumes on one GPU, as the scheduler wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimShare {
    /// `GPU-<uuid>` of the GPU.
    pub uuid: String,
    /// Bytes.
    pub memory: u64,
    /// Compute share in percent (0: none).
    pub cores: u8,
}

/// Most containers one claim's reservation records on a node (a pod's containers, their
/// restarts, and the pods sharing the claim); bounds `registry.json`.
pub const MAX_CLAIM_MEMBERS: usize = 256;

/// The reservation a claim holds, and whether this call made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimReservation {
    pub reservation: Reservation,
    /// False when the claim already held exactly this (a repeated prepare).
    pub created: bool,
}

/// What became of a claim's booking when its claim left the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimLeft {
    /// Kept: `running` containers it was given to may still run processes. `newly`: this call
    /// marked it (earlier calls found the claim still there).
    Kept {
        reservation: Box<Reservation>,
        running: usize,
        newly: bool,
    },
    /// Released, as no container of the claim runs (empty when nothing was booked).
    Released(Vec<Reservation>),
    /// Left alone: the claim's booking is another reservation (`reservation`) than the one
    /// the caller saw, booked by a prepare since the caller read the API server.
    Rebooked { reservation: String },
}

/// Most holders a refusal names one by one.
const NAMED_HOLDERS: usize = 8;

/// Who holds what on GPU `uuid`, for a refusal: each reservation's owner and its booking there
/// (a claim kept for its running containers says so).
fn holders(reservations: &[Reservation], uuid: &str) -> String {
    let mut named: Vec<String> = reservations
        .iter()
        .filter_map(|r| {
            let b = r.gpus.iter().find(|b| b.uuid == uuid)?;
            let what = if r.whole_gpu {
                "the whole GPU".to_string()
            } else if b.cores > 0 {
                format!("{} and {}% cores", format_bytes(b.memory), b.cores)
            } else {
                format_bytes(b.memory)
            };
            Some(match r.owner.claim_gone() {
                Some(g) => format!(
                    "{} ({what}; {}, kept while its containers run)",
                    r.owner, g.why
                ),
                None => format!("{} ({what})", r.owner),
            })
        })
        .collect();
    if named.is_empty() {
        return "nobody".to_string();
    }
    let more = named.len().saturating_sub(NAMED_HOLDERS);
    named.truncate(NAMED_HOLDERS);
    let mut text = named.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// The claim UID of a reservation held by a claim.
pub fn claim_uid(r: &Reservation) -> Option<&str> {
    match &r.owner {
        Owner::DraClaim { claim_uid, .. } => Some(claim_uid),
        Owner::Container { .. } => None,
    }
}

fn refuse(txn: &mut Txn, reason: RefusalReason, message: String) -> RegistryError {
    *txn.file
        .counters
        .refused_total
        .entry(reason.as_str().to_string())
        .or_default() += 1;
    txn.dirty = true;
    RegistryError::Refused(Refusal { reason, message })
}

impl Registry {
    /// Books `shares` (one per GPU, distinct GPUs) for the DRA claim `owner`, bound at once.
    ///
    /// Keyed by the claim's UID: a claim that already holds exactly these shares gets its
    /// reservation back (`created: false`); one that holds different shares is refused (its
    /// allocation changed without an unprepare). A share that does not fit beside what others
    /// hold on its GPU (memory under the overcommit factor, cores up to 100, whole-GPU
    /// bookings, the slice cap) is refused and nothing is booked.
    pub fn reserve_claim(
        &self,
        owner: &Owner,
        shares: &[ClaimShare],
    ) -> Result<ClaimReservation, RegistryError> {
        let Owner::DraClaim {
            claim_uid: uid,
            namespace,
            name,
            ..
        } = owner
        else {
            return Err(RegistryError::Refused(Refusal {
                reason: RefusalReason::BadRequest,
                message: format!("reserve_claim needs a DRA claim owner, not {owner}"),
            }));
        };
        let who = format!("claim {namespace}/{name} (uid {uid})");
        let (out, _) = self.transact(false, |txn| {
            if let Some(held) = txn
                .file
                .reservations
                .iter()
                .find(|r| claim_uid(r) == Some(uid.as_str()))
            {
                let same = held.gpus.len() == shares.len()
                    && shares.iter().all(|s| {
                        held.gpus.iter().any(|b| {
                            b.uuid == s.uuid && b.memory == s.memory && b.cores == s.cores
                        })
                    });
                if same {
                    // Allocated here again: a mark from when it had left the API server
                    // would have the booking reaped under its new pod.
                    let held = held.clone();
                    let held = unmark_gone(&self.paths, txn, held)?;
                    // A crash after an earlier prepare listed it may have left it without its
                    // directory, where the caller writes the slice files. On failure the
                    // booking stays: it is the claim's, and the next prepare tries again.
                    store::ensure_record(&self.paths, &held)?;
                    return Ok(ClaimReservation {
                        reservation: held,
                        created: false,
                    });
                }
                let id = held.id.clone();
                return Err(refuse(
                    txn,
                    RefusalReason::BadRequest,
                    format!("{who} already holds reservation {id} with other GPUs or capacity; it must be unprepared before it is prepared again"),
                ));
            }
            if shares.is_empty() {
                return Err(refuse(
                    txn,
                    RefusalReason::BadRequest,
                    format!("{who} consumes no GPU of this node; accepted: at least one device"),
                ));
            }
            let mut gpus = Vec::with_capacity(shares.len());
            for (i, s) in shares.iter().enumerate() {
                if shares[..i].iter().any(|o| o.uuid == s.uuid) {
                    return Err(refuse(
                        txn,
                        RefusalReason::BadRequest,
                        format!("{who} lists GPU {} twice; accepted: one share per GPU", s.uuid),
                    ));
                }
                if s.cores > 100 {
                    return Err(refuse(
                        txn,
                        RefusalReason::BadRequest,
                        format!(
                            "{who} consumes {}% cores of GPU {}; accepted: 0 to 100",
                            s.cores, s.uuid
                        ),
                    ));
                }
                let Some(gpu) = txn.file.inventory.gpu(&s.uuid).cloned() else {
                    let here: Vec<String> = txn
                        .file
                        .inventory
                        .gpus
                        .iter()
                        .map(|g| format!("{} ({})", g.index, g.uuid))
                        .collect();
                    return Err(refuse(
                        txn,
                        RefusalReason::BadSelector,
                        format!(
                            "{who} is allocated GPU {}, which this node's inventory does not list; GPUs here: {}",
                            s.uuid,
                            if here.is_empty() { "none (run `gpuslice cdi generate`)".to_string() } else { here.join(", ") }
                        ),
                    ));
                };
                let mut problem = self.share_problem(&txn.file.reservations, &gpu, s);
                if problem.is_some() && !txn.probed {
                    // Owners that exited hold capacity until probed: probe them now, under
                    // the lock, rather than refuse for them (as `reserve` does).
                    self.reap_into(txn, Probe::Due)?;
                    problem = self.share_problem(&txn.file.reservations, &gpu, s);
                }
                if let Some(p) = problem {
                    let held = holders(&txn.file.reservations, &gpu.uuid);
                    return Err(refuse(
                        txn,
                        RefusalReason::NoFit,
                        format!(
                            "{who} cannot be prepared on GPU {} ({}): {p}; held there by {held}: one bookkeeper per GPU, a claim is never prepared onto capacity someone else holds",
                            gpu.index, gpu.uuid
                        ),
                    ));
                }
                gpus.push(Booking {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    memory: s.memory,
                    cores: s.cores,
                    unknown: Default::default(),
                });
            }
            let id = loop {
                let id = crate::id::new_id()?;
                if txn.file.reservation(&id).is_none() {
                    break id;
                }
            };
            let r = Reservation {
                id,
                state: ReservationState::Bound,
                owner: owner.clone(),
                whole_gpu: false,
                gpus,
                created_ms: txn.now_ms,
                deadline_ms: None,
                bound_ms: Some(txn.now_ms),
                reserved_by: None,
                unknown: Default::default(),
            };
            txn.records.push(r.clone());
            txn.file.reservations.push(r.clone());
            txn.file.counters.reserved_total += 1;
            txn.dirty = true;
            Ok(ClaimReservation {
                reservation: r,
                created: true,
            })
        })?;
        Ok(out)
    }

    /// Why share `s` does not fit on `gpu` beside `reservations` (memory under the
    /// overcommit factor, cores up to 100, whole-GPU bookings, the slice cap); `None` when
    /// it fits.
    fn share_problem(
        &self,
        reservations: &[Reservation],
        gpu: &Gpu,
        s: &ClaimShare,
    ) -> Option<String> {
        let loads = gpu_loads(reservations);
        let load = loads.get(&gpu.uuid).copied().unwrap_or_default();
        let cap = memory_capacity(gpu.memory_total, self.options.placement.memory_overcommit);
        let free = cap.saturating_sub(load.memory);
        if load.whole {
            Some("it is booked whole (CDI gpuslice.io/gpu)".to_string())
        } else if s.memory > free {
            Some(format!(
                "it needs {} of memory and {} of {} is free",
                format_bytes(s.memory),
                format_bytes(free),
                format_bytes(cap)
            ))
        } else if u32::from(s.cores) + load.cores > 100 {
            Some(format!(
                "it needs {}% cores and {}% are free",
                s.cores,
                100u32.saturating_sub(load.cores)
            ))
        } else if self
            .options
            .placement
            .max_slices_per_gpu
            .is_some_and(|max| load.slices >= max)
        {
            Some(format!(
                "the GPU already holds {} slices, the most allowed",
                load.slices
            ))
        } else {
            None
        }
    }

    /// Records the container whose init is `pid` as one of the containers of the claim
    /// holding reservation `id` (the claim's CDI `createRuntime` hook calls it, with the pid
    /// the runtime gave): its start time, boot id and cgroup are read here, from `/proc`, so
    /// what the node agent attributes to the claim rests on host facts only. Idempotent for
    /// the same process; containers whose init and cgroup are both gone are dropped first.
    pub fn join_claim(&self, id: &str, pid: u32) -> Result<Reservation, RegistryError> {
        if !is_valid_id(id) {
            return Err(RegistryError::InvalidId { id: id.to_string() });
        }
        // Read the process before taking the lock: it is the slow part.
        let process = self.process_ref(pid)?;
        let (r, _) = self.transact(false, |txn| {
            let r = txn.reservation_mut(id, &self.paths.registry)?;
            let Owner::DraClaim {
                namespace,
                name,
                members,
                ..
            } = &mut r.owner
            else {
                return Err(RegistryError::NotAClaim {
                    id: id.to_string(),
                    owner: r.owner.to_string(),
                });
            };
            if members.iter().any(|m| m.same_process(&process)) {
                return Ok(r.clone());
            }
            let mut live = Liveness::new(&*self.system, 0, 0, Probe::Full)?;
            // Unreadable is not proof of exit: such a member is kept.
            members.retain(|m| live.member_runs(m).unwrap_or(true));
            if members.len() >= MAX_CLAIM_MEMBERS {
                return Err(RegistryError::ClaimFull {
                    id: id.to_string(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    max: MAX_CLAIM_MEMBERS,
                });
            }
            members.push(process.clone());
            let r = r.clone();
            store::write_record(&self.paths, &r)?;
            txn.dirty = true;
            Ok(r)
        })?;
        Ok(r)
    }

    /// The claim with UID `uid` left the API server (`why`, one line): its booking is kept,
    /// marked [`ClaimGone`], while a container it was given to may still run processes (its
    /// init lives, or its cgroup still holds processes), so that nobody is prepared onto
    /// memory still in use; otherwise it is released. Members that no longer run are dropped.
    /// A kept booking is reaped once its last container has exited. Idempotent: the first
    /// `why` and time stay; an unknown claim releases nothing. Only reservation `seen` (the
    /// one the caller found when it asked the API server) is touched: a claim booked again
    /// since is [`ClaimLeft::Rebooked`].
    pub fn claim_left(&self, uid: &str, seen: &str, why: &str) -> Result<ClaimLeft, RegistryError> {
        let (out, _) = self.transact(false, |txn| {
            let Some(r) = txn
                .file
                .reservations
                .iter_mut()
                .find(|r| claim_uid(r) == Some(uid))
            else {
                return Ok(ClaimLeft::Released(Vec::new()));
            };
            if r.id != seen {
                return Ok(ClaimLeft::Rebooked {
                    reservation: r.id.clone(),
                });
            }
            let mut live = Liveness::new(&*self.system, 0, 0, Probe::Full)?;
            let now_ms = live.now_ms();
            let Owner::DraClaim { members, gone, .. } = &mut r.owner else {
                return Ok(ClaimLeft::Released(Vec::new()));
            };
            let mut running = Vec::with_capacity(members.len());
            for m in members.iter() {
                if live.member_runs(m)? {
                    running.push(m.clone());
                }
            }
            if running.is_empty() {
                return Ok(ClaimLeft::Released(
                    txn.release_matching(|r| r.id == seen && claim_uid(r) == Some(uid)),
                ));
            }
            let newly = gone.is_none();
            let changed = newly || running.len() != members.len();
            if newly {
                *gone = Some(ClaimGone {
                    since_ms: now_ms,
                    why: why.to_string(),
                });
            }
            *members = running;
            let count = members.len();
            let r = r.clone();
            if changed {
                // The record too: `gc --rebuild` keeps the mark and reaps by it.
                store::write_record(&self.paths, &r)?;
                txn.dirty = true;
            }
            Ok(ClaimLeft::Kept {
                reservation: Box::new(r),
                running: count,
                newly,
            })
        })?;
        Ok(out)
    }

    /// The claim with UID `uid` is allocated to this node again (the API server says so):
    /// reservation `seen`, if still its booking, loses the mark [`Registry::claim_left`] gave
    /// it, so it is not reaped when its containers exit between the new pod's. Whether a mark
    /// was cleared.
    pub fn claim_back(&self, uid: &str, seen: &str) -> Result<bool, RegistryError> {
        let (out, _) = self.transact(false, |txn| {
            let Some(r) = txn
                .file
                .reservations
                .iter()
                .find(|r| r.id == seen && claim_uid(r) == Some(uid))
            else {
                return Ok(false);
            };
            let marked = r.owner.claim_gone().is_some();
            let r = r.clone();
            unmark_gone(&self.paths, txn, r)?;
            Ok(marked)
        })?;
        Ok(out)
    }

    /// Releases the reservation of the claim with UID `uid`. Idempotent: an unknown claim
    /// releases nothing.
    pub fn release_claim(&self, uid: &str) -> Result<Released, RegistryError> {
        let (reservations, _) = self.transact(false, |txn| {
            Ok(txn.release_matching(|r| claim_uid(r) == Some(uid)))
        })?;
        Ok(Released {
            reservations,
            corrupt: None,
        })
    }
}

/// `r` (a claim's booking in `txn`) without its [`ClaimGone`] mark, stored and its record
/// written again when it had one.
fn unmark_gone(
    paths: &store::Paths,
    txn: &mut Txn,
    mut r: Reservation,
) -> Result<Reservation, RegistryError> {
    let Owner::DraClaim { gone, .. } = &mut r.owner else {
        return Ok(r);
    };
    if gone.take().is_none() {
        return Ok(r);
    }
    store::write_record(paths, &r)?;
    if let Some(stored) = txn.file.reservations.iter_mut().find(|s| s.id == r.id) {
        *stored = r.clone();
    }
    txn.dirty = true;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use gpuslice_config::{PlacementConfig, Quantity};

    use super::*;
    use crate::fake::FakeSystem;
    use crate::model::{Gpu, Inventory};
    use crate::request::Request;
    use crate::Options;

    const GIB: u64 = 1 << 30;

    fn registry(dir: &std::path::Path) -> Registry {
        registry_on(dir, Arc::new(FakeSystem::new(1_000)))
    }

    /// Two 16 GiB GPUs, on `sys`.
    fn registry_on(dir: &std::path::Path, sys: Arc<FakeSystem>) -> Registry {
        let r = Registry::open(
            dir,
            Options {
                placement: PlacementConfig {
                    policy: gpuslice_config::Policy::Binpack,
                    memory_overcommit: 1.0,
                    max_slices_per_gpu: None,
                },
                pending_timeout: Duration::from_secs(60),
                recheck_interval: Duration::from_secs(1),
            },
            sys,
            crate::no_cleanup(),
        )
        .unwrap();
        let gpus = (0..2)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                model: "NVIDIA H200".into(),
                memory_total: 16 * GIB,
                minor: i,
                pci_bus_id: None,
                numa_node: None,
                pcie_root: None,
            })
            .collect();
        r.set_inventory(Inventory { gpus }).unwrap();
        r
    }

    fn claim(uid: &str) -> Owner {
        Owner::DraClaim {
            claim_uid: uid.into(),
            namespace: "ns".into(),
            members: Vec::new(),
            name: format!("c-{uid}"),
            gone: None,
        }
    }

    fn share(uuid: &str, gib: u64, cores: u8) -> ClaimShare {
        ClaimShare {
            uuid: uuid.into(),
            memory: gib * GIB,
            cores,
        }
    }

    #[test]
    fn a_claim_books_exactly_its_shares_once() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let shares = [share("GPU-0", 4, 30), share("GPU-1", 2, 0)];
        let first = r.reserve_claim(&claim("u1"), &shares).unwrap();
        assert!(first.created);
        assert_eq!(first.reservation.state, ReservationState::Bound);
        assert_eq!(first.reservation.gpus.len(), 2);
        assert_eq!(first.reservation.gpus[0].memory, 4 * GIB);
        assert_eq!(first.reservation.gpus[0].cores, 30);
        // Repeated: the same reservation, nothing more booked.
        let again = r.reserve_claim(&claim("u1"), &shares).unwrap();
        assert!(!again.created);
        assert_eq!(again.reservation.id, first.reservation.id);
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
        // Other capacity under the same UID: refused, the first booking kept.
        let e = r
            .reserve_claim(&claim("u1"), &[share("GPU-0", 5, 30)])
            .unwrap_err();
        assert!(e.to_string().contains("unprepared"), "{e}");
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
        // Its record exists for `gc --rebuild`.
        assert!(r
            .slice_dir(&first.reservation.id)
            .unwrap()
            .join(crate::RECORD_FILE)
            .is_file());
        // Released by UID, idempotently.
        assert_eq!(r.release_claim("u1").unwrap().reservations.len(), 1);
        assert!(r.release_claim("u1").unwrap().reservations.is_empty());
        assert!(r.snapshot().unwrap().reservations.is_empty());
        assert!(!r.slice_dir(&first.reservation.id).unwrap().exists());
    }

    #[test]
    fn claims_share_a_gpu_but_never_capacity_someone_holds() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        r.reserve_claim(&claim("a"), &[share("GPU-0", 10, 60)])
            .unwrap();
        r.reserve_claim(&claim("b"), &[share("GPU-0", 6, 40)])
            .unwrap();
        // Full now: memory, then cores.
        let e = r
            .reserve_claim(&claim("c"), &[share("GPU-0", 1, 0)])
            .unwrap_err();
        assert_eq!(e.refusal().map(|f| f.reason), Some(RefusalReason::NoFit));
        assert!(e.to_string().contains("GPU 0 (GPU-0)"), "{e}");
        // A node-path booking (annotations) on GPU-1 shrinks what a claim may take.
        let mut req = Request::new(Owner::container());
        req.memory = Some(Quantity::Bytes(12 * GIB));
        req.selectors = vec![crate::Selector::Index(1)];
        r.reserve(&req).unwrap();
        let e = r
            .reserve_claim(&claim("d"), &[share("GPU-1", 5, 0)])
            .unwrap_err();
        assert!(e.to_string().contains("one bookkeeper"), "{e}");
        r.reserve_claim(&claim("d"), &[share("GPU-1", 4, 0)])
            .unwrap();
        // Two shares, the second refused: nothing of the first is booked.
        let before = r.snapshot().unwrap().reservations.len();
        let e = r
            .reserve_claim(&claim("e"), &[share("GPU-1", 0, 10), share("GPU-0", 1, 0)])
            .unwrap_err();
        assert!(e.to_string().contains("GPU 0"), "{e}");
        assert_eq!(r.snapshot().unwrap().reservations.len(), before);
        let cores = r
            .reserve_claim(&claim("f"), &[share("GPU-1", 0, 101)])
            .unwrap_err();
        assert!(cores.to_string().contains("0 to 100"), "{cores}");
    }

    #[test]
    fn unknown_gpus_and_empty_claims_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let e = r
            .reserve_claim(&claim("x"), &[share("GPU-9", 1, 0)])
            .unwrap_err();
        assert!(
            e.to_string().contains("GPU-9") && e.to_string().contains("GPUs here: 0 (GPU-0)"),
            "{e}"
        );
        let e = r.reserve_claim(&claim("x"), &[]).unwrap_err();
        assert!(e.to_string().contains("at least one"), "{e}");
        let e = r
            .reserve_claim(&claim("x"), &[share("GPU-0", 1, 0), share("GPU-0", 1, 0)])
            .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = r
            .reserve_claim(&Owner::container(), &[share("GPU-0", 1, 0)])
            .unwrap_err();
        assert!(e.to_string().contains("DRA claim owner"), "{e}");
        assert!(r.snapshot().unwrap().reservations.is_empty());
        // Claims are not reaped by container exits or deadlines.
        r.reserve_claim(&claim("y"), &[share("GPU-0", 1, 0)])
            .unwrap();
        r.gc().unwrap();
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
    }

    #[test]
    fn a_claims_containers_are_recorded_from_the_host_and_pruned_when_gone() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        let r = Registry::open(
            dir.path(),
            Options {
                placement: PlacementConfig {
                    policy: gpuslice_config::Policy::Binpack,
                    memory_overcommit: 1.0,
                    max_slices_per_gpu: None,
                },
                pending_timeout: Duration::from_secs(60),
                recheck_interval: Duration::from_secs(1),
            },
            sys.clone(),
            crate::no_cleanup(),
        )
        .unwrap();
        r.set_inventory(Inventory {
            gpus: vec![Gpu {
                index: 0,
                uuid: "GPU-0".into(),
                model: "NVIDIA H200".into(),
                memory_total: 16 * GIB,
                minor: 0,
                pci_bus_id: None,
                numa_node: None,
                pcie_root: None,
            }],
        })
        .unwrap();
        let id = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 1, 0)])
            .unwrap()
            .reservation
            .id;
        sys.spawn(100, 7);
        sys.set_cgroup(100, "kubepods/pod1/ctr-a");
        sys.spawn(200, 8);
        sys.set_cgroup(200, "kubepods/pod1/ctr-b");
        r.join_claim(&id, 100).unwrap();
        r.join_claim(&id, 100).unwrap();
        let held = r.join_claim(&id, 200).unwrap();
        let recorded: Vec<(u32, Option<&str>)> = held
            .owner
            .processes()
            .iter()
            .map(|p| (p.pid, p.cgroup.as_deref()))
            .collect();
        assert_eq!(
            recorded,
            vec![
                (100, Some("kubepods/pod1/ctr-a")),
                (200, Some("kubepods/pod1/ctr-b"))
            ],
            "each container once, with the cgroup read from the host"
        );
        // A container whose init and cgroup are gone is dropped when the next one joins; one
        // whose cgroup still holds processes is kept.
        sys.kill(100);
        sys.kill(200);
        sys.set_populated("kubepods/pod1/ctr-b", true);
        sys.spawn(300, 9);
        let held = r.join_claim(&id, 300).unwrap();
        let pids: Vec<u32> = held.owner.processes().iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![200, 300]);
        // Persisted in the registry the node agent reads.
        let file = crate::read_registry(dir.path()).unwrap();
        assert_eq!(file.reservations[0].owner.processes().len(), 2);
        // A process that is not running, a container's reservation and an unknown id are
        // refused, naming what was wrong.
        let e = r.join_claim(&id, 999).unwrap_err();
        assert!(e.to_string().contains("999"), "{e}");
        let mut req = Request::new(Owner::container());
        req.memory = Some(Quantity::Bytes(GIB));
        let ctr = r.reserve(&req).unwrap();
        let e = r.join_claim(&ctr.id, 300).unwrap_err();
        assert!(matches!(e, RegistryError::NotAClaim { .. }), "{e}");
        let e = r.join_claim("0123456789abcdef", 300).unwrap_err();
        assert!(matches!(e, RegistryError::NotFound { .. }), "{e}");
        let e = r.join_claim("../x", 300).unwrap_err();
        assert!(matches!(e, RegistryError::InvalidId { .. }), "{e}");
    }

    #[test]
    fn a_claim_booked_again_since_the_caller_looked_is_not_released() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let gone = "has no allocation yet";
        // The pass saw the first booking; the claim was unprepared, allocated again and
        // prepared (same uid, a new reservation) before the pass took the registry.
        let first = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 2, 0)])
            .unwrap()
            .reservation
            .id;
        r.release_claim("u").unwrap();
        let second = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 2, 0)])
            .unwrap()
            .reservation
            .id;
        assert_ne!(first, second);
        assert_eq!(
            r.claim_left("u", &first, gone).unwrap(),
            ClaimLeft::Rebooked {
                reservation: second.clone()
            }
        );
        let file = crate::read_registry(dir.path()).unwrap();
        assert_eq!(file.reservations.len(), 1);
        assert_eq!(file.reservations[0].id, second);
        assert!(file.reservations[0].owner.claim_gone().is_none());
        // The booking it saw is released.
        assert!(matches!(
            r.claim_left("u", &second, gone).unwrap(),
            ClaimLeft::Released(ref v) if v.len() == 1 && v[0].id == second
        ));
    }

    #[test]
    fn a_claim_that_left_is_kept_while_its_containers_run_and_reaped_after() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        let r = registry_on(dir.path(), sys.clone());
        let gone = "the claim no longer exists";
        // A claim no container was given to, and an unknown one: released at once.
        let idle = r
            .reserve_claim(&claim("idle"), &[share("GPU-1", 1, 0)])
            .unwrap()
            .reservation
            .id;
        assert!(matches!(
            r.claim_left("idle", &idle, gone).unwrap(),
            ClaimLeft::Released(ref v) if v.len() == 1
        ));
        assert_eq!(
            r.claim_left("unknown", &idle, gone).unwrap(),
            ClaimLeft::Released(Vec::new())
        );

        // 6 GiB of GPU-0, given to two containers: one exited, one runs.
        let id = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 6, 0)])
            .unwrap()
            .reservation
            .id;
        sys.spawn(100, 7);
        sys.set_cgroup(100, "kubepods/pod1/ctr-a");
        sys.spawn(200, 8);
        r.join_claim(&id, 100).unwrap();
        r.join_claim(&id, 200).unwrap();
        sys.kill(200);
        let ClaimLeft::Kept {
            reservation,
            running,
            newly,
        } = r.claim_left("u", &id, gone).unwrap()
        else {
            panic!("a claim whose container runs was released");
        };
        assert_eq!((running, newly), (1, true));
        let mark = reservation.owner.claim_gone().cloned().unwrap();
        assert_eq!(mark.why, gone);
        assert_eq!(reservation.owner.processes()[0].pid, 100);
        // Persisted in the registry and in the record `gc --rebuild` reads.
        let file = crate::read_registry(dir.path()).unwrap();
        assert_eq!(file.reservations[0].owner.claim_gone(), Some(&mark));
        let record =
            std::fs::read_to_string(r.slice_dir(&id).unwrap().join(crate::RECORD_FILE)).unwrap();
        assert!(record.contains(gone), "{record}");
        // Again: the first mark stays.
        sys.advance_ms(5_000);
        assert!(matches!(
            r.claim_left("u", &id, "other words").unwrap(),
            ClaimLeft::Kept { newly: false, running: 1, ref reservation }
                if reservation.owner.claim_gone() == Some(&mark)
        ));

        // Nobody is prepared onto it: the refusal names the holder and why it holds.
        let e = r
            .reserve_claim(&claim("v"), &[share("GPU-0", 12, 0)])
            .unwrap_err()
            .to_string();
        for part in [
            "claim ns/c-v (uid v) cannot be prepared on GPU 0 (GPU-0)",
            "it needs 12Gi of memory and 10Gi of 16Gi is free",
            "held there by claim ns/c-u (6Gi; the claim no longer exists, kept while its containers run)",
            "never prepared onto capacity someone else holds",
        ] {
            assert!(e.contains(part), "`{e}` lacks `{part}`");
        }
        // Its init exited, its cgroup still holds processes: kept through `gc`.
        sys.kill(100);
        sys.set_populated("kubepods/pod1/ctr-a", true);
        assert!(r.gc().unwrap().reaped.is_empty());
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
        // The last process gone: reaped by the next operation that checks processes.
        sys.set_populated("kubepods/pod1/ctr-a", false);
        let reaped = r.gc().unwrap().reaped;
        assert_eq!(reaped.len(), 1, "{reaped:?}");
        assert_eq!(
            reaped[0].reason,
            crate::ReapReason::ClaimGone { why: gone.into() }
        );
        assert!(reaped[0].to_string().contains("its last container exited"));
        assert!(!r.slice_dir(&id).unwrap().exists());
        r.reserve_claim(&claim("v"), &[share("GPU-0", 12, 0)])
            .unwrap();
    }

    /// A claim that left and was allocated here again (prepared anew, or seen allocated by
    /// the cleanup when the kubelet kept it prepared) is a live booking again: its mark goes,
    /// in the registry and in its record, so its containers exiting between pods do not reap it.
    #[test]
    fn a_claim_allocated_here_again_loses_its_gone_mark() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        let r = registry_on(dir.path(), sys.clone());
        let left = |uid: &str, id: &str| {
            let ClaimLeft::Kept { reservation, .. } = r.claim_left(uid, id, "gone").unwrap() else {
                panic!("a claim whose container runs was released");
            };
            assert!(reservation.owner.claim_gone().is_some());
        };
        let shares = [share("GPU-0", 6, 0)];
        let id = r
            .reserve_claim(&claim("u"), &shares)
            .unwrap()
            .reservation
            .id;
        sys.spawn(100, 7);
        r.join_claim(&id, 100).unwrap();
        left("u", &id);
        // Prepared again with the same devices: the same booking, unmarked.
        let again = r.reserve_claim(&claim("u"), &shares).unwrap();
        assert!(!again.created);
        assert_eq!(again.reservation.id, id);
        assert_eq!(again.reservation.owner.claim_gone(), None);
        let stored = |id: &str| {
            let file = crate::read_registry(dir.path()).unwrap();
            let record =
                std::fs::read_to_string(r.slice_dir(id).unwrap().join(crate::RECORD_FILE)).unwrap();
            (file.reservations[0].owner.claim_gone().is_some(), record)
        };
        let (marked, record) = stored(&id);
        assert!(!marked && !record.contains("\"gone\""), "{record}");
        // Its container exits between the new pod's: kept.
        sys.kill(100);
        assert!(r.gc().unwrap().reaped.is_empty());
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);

        // Marked again; the cleanup then finds it allocated here: unmarked, once.
        sys.spawn(101, 7);
        r.join_claim(&id, 101).unwrap();
        left("u", &id);
        assert!(!r.claim_back("u", "other-id").unwrap());
        assert!(r.claim_back("u", &id).unwrap());
        assert!(!r.claim_back("u", &id).unwrap());
        let (marked, record) = stored(&id);
        assert!(!marked && !record.contains("\"gone\""), "{record}");
        sys.kill(101);
        assert!(r.gc().unwrap().reaped.is_empty());
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
    }

    /// Capacity held by an owner that exited since processes were last checked is probed
    /// under the lock before a claim is refused, as `reserve` does.
    #[test]
    fn a_claim_is_not_refused_for_capacity_an_exited_owner_held() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        let r = registry_on(dir.path(), sys.clone());
        sys.spawn(100, 7);
        let mut req = Request::new(Owner::Container {
            container_id: Some("ctr".into()),
            process: Some(r.process_ref(100).unwrap()),
            kubernetes: None,
        });
        req.memory = Some(Quantity::Bytes(16 * GIB));
        req.selectors = vec![crate::Selector::Index(0)];
        r.reserve(&req).unwrap();
        // Every process checked just now; the owner exits within the recheck interval.
        r.gc().unwrap();
        sys.kill(100);
        let got = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 16, 0)])
            .expect("refused for an exited owner's capacity");
        assert!(got.created);
        let file = r.snapshot().unwrap();
        assert_eq!(file.reservations.len(), 1, "{:?}", file.reservations);
        assert!(claim_uid(&file.reservations[0]).is_some());
    }

    #[test]
    fn a_claim_still_in_the_api_server_is_never_reaped_by_its_containers() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        let r = registry_on(dir.path(), sys.clone());
        let id = r
            .reserve_claim(&claim("u"), &[share("GPU-0", 1, 0)])
            .unwrap()
            .reservation
            .id;
        sys.spawn(100, 7);
        r.join_claim(&id, 100).unwrap();
        sys.kill(100);
        sys.advance_ms(5_000);
        assert!(r.gc().unwrap().reaped.is_empty());
        assert_eq!(r.snapshot().unwrap().reservations.len(), 1);
    }
}

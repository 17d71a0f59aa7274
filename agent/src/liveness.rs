//! Whether a reservation listed in `registry.json` is still live, judged without the lock
//! the way the registry's own reaping judges it: a pending reservation within its deadline,
//! a bound one whose owner process still runs (same start time, same boot). Exits are seen
//! at once (the pid is probed every time); start times are re-read every
//! [`OWNER_RECHECK`], which catches reused pids and zombies. A container whose init exited
//! lives on while the cgroup recorded at bind still holds processes (no pid namespace of its
//! own: its children outlive init).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_registry::{Reservation, ReservationState, System};

/// How often a bound owner's start time is read again. In between, only the pid's existence
/// is probed (one syscall), which sees every exit at once.
pub const OWNER_RECHECK: Duration = Duration::from_secs(5);

/// What became of a listed reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// Owner gone (or pid reused), or the pending deadline passed; the next registry
    /// operation reaps it. `vanished` is the one-line reason when a container went away.
    Stale {
        vanished: Option<String>,
    },
}

/// Owner checks, remembering when each owner's start time last matched.
pub struct OwnerCheck {
    system: Arc<dyn System>,
    verified: HashMap<String, Instant>,
}

impl std::fmt::Debug for OwnerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerCheck")
            .field("verified", &self.verified.len())
            .finish_non_exhaustive()
    }
}

impl OwnerCheck {
    pub fn new(system: Arc<dyn System>) -> OwnerCheck {
        OwnerCheck {
            system,
            verified: HashMap::new(),
        }
    }

    pub fn system(&self) -> &dyn System {
        &*self.system
    }

    /// Whether `r` is live at `now` (`now_ms`: the system clock; `boot_id`: the current
    /// boot, when known).
    pub fn check(
        &mut self,
        r: &Reservation,
        now: Instant,
        now_ms: u64,
        boot_id: Option<&str>,
    ) -> Liveness {
        match (r.state, r.owner.process()) {
            (ReservationState::Pending, _) => match r.deadline_ms {
                Some(d) if d <= now_ms => Liveness::Stale { vanished: None },
                _ => Liveness::Live,
            },
            (ReservationState::Bound, Some(p)) => {
                let fresh = self
                    .verified
                    .get(&r.id)
                    .is_some_and(|t| now.saturating_duration_since(*t) < OWNER_RECHECK);
                if fresh && self.system.process_exists(p.pid) {
                    return Liveness::Live;
                }
                let same_boot = boot_id.is_none_or(|b| b == p.boot_id);
                match self.system.process_start_time(p.pid) {
                    Ok(Some(t)) if t == p.start_time && same_boot => {
                        self.verified.insert(r.id.clone(), now);
                        Liveness::Live
                    }
                    // Init is gone (or its pid reused) but its container's processes are not.
                    Ok(_)
                        if same_boot
                            && p.cgroup
                                .as_deref()
                                .is_some_and(|c| self.system.cgroup_populated(c)) =>
                    {
                        Liveness::Live
                    }
                    Ok(_) => {
                        self.verified.remove(&r.id);
                        Liveness::Stale {
                            vanished: Some(format!(
                                "reservation {}: container {} (pid {}) is gone; its series are left out until it is reaped",
                                r.id, r.owner, p.pid
                            )),
                        }
                    }
                    // Unreadable is not proof of death: keep the series.
                    Err(_) => Liveness::Live,
                }
            }
            // A DRA claim (or a bound owner without a process) lives until released.
            (ReservationState::Bound, None) => Liveness::Live,
        }
    }

    /// Forgets reservations `keep` rejects.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.verified.retain(|id, _| keep(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::{FakeSystem, Owner, ProcessRef};

    fn reservation(state: ReservationState, owner: Owner, deadline_ms: Option<u64>) -> Reservation {
        Reservation {
            id: "0123456789abcdef".into(),
            state,
            owner,
            whole_gpu: false,
            gpus: vec![],
            created_ms: 0,
            deadline_ms,
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        }
    }

    fn bound(pid: u32, start_time: u64) -> Reservation {
        reservation(
            ReservationState::Bound,
            Owner::Container {
                container_id: Some("c".into()),
                process: Some(ProcessRef {
                    pid,
                    start_time,
                    boot_id: "fake-boot-0".into(),
                    cgroup: None,
                    unknown: Default::default(),
                }),
                kubernetes: None,
            },
            None,
        )
    }

    #[test]
    fn pending_deadline_bound_owner_reuse_and_claims() {
        let sys = Arc::new(FakeSystem::new(1_000));
        let mut owners = OwnerCheck::new(sys.clone());
        let t0 = Instant::now();
        let pending = reservation(ReservationState::Pending, Owner::container(), Some(2_000));
        assert_eq!(owners.check(&pending, t0, 1_999, None), Liveness::Live);
        assert_eq!(
            owners.check(&pending, t0, 2_000, None),
            Liveness::Stale { vanished: None }
        );
        let claim = reservation(
            ReservationState::Bound,
            Owner::DraClaim {
                claim_uid: "u".into(),
                namespace: "ns".into(),
                members: Vec::new(),
                name: "n".into(),
                gone: None,
            },
            None,
        );
        assert_eq!(owners.check(&claim, t0, 9_999, None), Liveness::Live);

        sys.spawn(77, 500);
        let r = bound(77, 500);
        let boot = Some("fake-boot-0");
        assert_eq!(owners.check(&r, t0, 1_000, boot), Liveness::Live);
        assert_eq!(
            owners.check(&r, t0, 1_000, Some("another-boot")),
            Liveness::Live,
            "verified recently and the pid exists: not re-read"
        );
        // Reused pid: seen at the next recheck.
        sys.spawn(77, 900);
        assert_eq!(owners.check(&r, t0, 1_000, boot), Liveness::Live);
        let later = t0 + OWNER_RECHECK;
        assert!(matches!(
            owners.check(&r, later, 1_000, boot),
            Liveness::Stale { vanished: Some(m) } if m.contains("pid 77")
        ));
        // An exit is seen at once.
        sys.spawn(78, 5);
        let r = bound(78, 5);
        assert_eq!(owners.check(&r, later, 1_000, boot), Liveness::Live);
        sys.kill(78);
        assert!(matches!(
            owners.check(&r, later, 1_000, boot),
            Liveness::Stale { .. }
        ));
        owners.retain(|_| false);
        assert!(format!("{owners:?}").contains("verified: 0"));
    }

    /// A container without its own pid namespace keeps its children when init
    /// exits; its series stay until its cgroup holds no process.
    #[test]
    fn owner_lives_while_its_cgroup_holds_processes() {
        let sys = Arc::new(FakeSystem::new(1_000));
        let mut owners = OwnerCheck::new(sys.clone());
        let t0 = Instant::now();
        let boot = Some("fake-boot-0");
        sys.spawn(90, 7);
        let mut r = bound(90, 7);
        if let Owner::Container {
            process: Some(p), ..
        } = &mut r.owner
        {
            p.cgroup = Some("pids/ctr-90".into());
        }
        sys.set_populated("pids/ctr-90", true);
        assert_eq!(owners.check(&r, t0, 1_000, boot), Liveness::Live);
        sys.kill(90);
        assert_eq!(
            owners.check(&r, t0, 1_000, boot),
            Liveness::Live,
            "init exited, its child still runs in the container's cgroup"
        );
        sys.set_populated("pids/ctr-90", false);
        assert!(matches!(
            owners.check(&r, t0, 1_000, boot),
            Liveness::Stale { vanished: Some(_) }
        ));
    }
}

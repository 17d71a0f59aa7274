//! Which reservation owns each GPU process, decided from host facts only, for both the
//! exporter's per-slice figures and the enforcer's kills and throttles. A process belongs to
//! a reservation when it runs in the pid namespace of one of the reservation's container
//! inits (verified by start time, never the host's namespace), or, whatever its pid
//! namespace, in the cgroup recorded for one of those containers or below it (compared by
//! whole path components). The cgroup rule is what finds a process that made a pid namespace
//! of its own (`unshare -U -r -p -f`): it is in no recorded namespace, but still in its
//! container's cgroup.
//!
//! Why a recorded cgroup is the container's own, and stays so:
//! - it is recorded by the `createRuntime` hook on the host, before the container's process
//!   runs, and only when the container's init is then alone in it (the cgroup the runtime
//!   made for it from the spec's `cgroupsPath`); a cgroup that already held other processes
//!   (an engine without a cgroup per container, a shared pod cgroup) is never recorded;
//! - no container can move a process out of its cgroup subtree: a move is a write to the
//!   destination's `cgroup.procs`, in a cgroup tree mounted writable, and on cgroup v2 the
//!   writer's cgroup namespace must hold both ends. A container's cgroup tree is mounted
//!   read-only (a user and mount namespace of its own cannot lift a lock the host set), and a
//!   tree it mounts itself shows only its cgroup namespace, rooted at or below its own cgroup.
//!   So a nested pid, user or mount namespace changes no process's cgroup, and no tenant can
//!   put a process into another tenant's or the host's cgroup to have it charged there;
//! - a reservation's container whose own cgroup was not recorded but that runs inside
//!   another's recorded cgroup (an engine that started a second container in the first's
//!   cgroup after its bind) makes that cgroup say nothing: which of the two a process there
//!   belongs to cannot be told, so the cgroup charges neither (their namespaces still do).
//!
//! Each process's start time is read before these facts (the same look at its `/proc`
//! entry), and the enforcer's kill is checked against it: a pid reused after the look is not
//! hit (docs/security.md, "What only the enforcer guarantees").
//!
//! Nothing a container writes (its usage file's slots, its own pid as it sees it) decides
//! where a process is charged, so a container cannot steer a kill or a freeze onto another
//! tenant's or the host's processes. See docs/security.md, "What only the enforcer
//! guarantees".

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use gpuslice_registry::{Reservation, System};

use crate::liveness::{Liveness, OwnerCheck};
use crate::procmap::{ProcError, ProcFs};

/// The owners of the live reservations, as a cycle or a scrape sees them.
///
/// Built once per cycle (or scrape) from the reservations in order; each GPU process is then
/// looked at once: its pid namespace first, its cgroup only when the namespace names no
/// single owner.
pub struct Attribution<'a> {
    proc: &'a ProcFs,
    system: &'a dyn System,
    own_ns: Option<u64>,
    /// A container init's pid namespace → its reservation; `None` when several
    /// reservations' containers share it (a pod sharing its process namespace), which then
    /// leaves the decision to the cgroups.
    namespaces: HashMap<u64, Option<usize>>,
    /// (recorded cgroup, reservation), deepest cgroup first; none that another
    /// reservation's container without a recorded cgroup runs in.
    cgroups: Vec<(String, usize)>,
    /// The GPU UUIDs each reservation books, by position.
    booked: Vec<Vec<String>>,
    seen: HashMap<u32, Looked>,
}

/// What one look at a process found: its candidates, and its start time read before them.
#[derive(Debug, Clone, Default)]
struct Looked {
    candidates: Vec<usize>,
    start: Option<u64>,
}

impl std::fmt::Debug for Attribution<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attribution")
            .field("own_ns", &self.own_ns)
            .field("namespaces", &self.namespaces)
            .field("cgroups", &self.cgroups)
            .finish_non_exhaustive()
    }
}

/// True when `cgroup` is `recorded` or a cgroup below it (whole path components).
pub fn within_cgroup(cgroup: &str, recorded: &str) -> bool {
    cgroup
        .strip_prefix(recorded)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl<'a> Attribution<'a> {
    /// The owners of `live` (by position). `proc` gives pid namespaces, `system` start times
    /// and cgroups (the registry's own reading of them, so a cgroup compares equal to the
    /// one recorded at bind).
    pub fn new(proc: &'a ProcFs, system: &'a dyn System, live: &[&Reservation]) -> Attribution<'a> {
        let own_ns = proc.pid_ns("self").ok();
        let boot_id = system.boot_id().ok();
        let mut namespaces: HashMap<u64, Option<usize>> = HashMap::new();
        let mut cgroups: Vec<(String, usize)> = Vec::new();
        // (cgroup it runs in, reservation, pid) of each live recorded init with no recorded
        // cgroup of its own.
        let mut unrecorded: Vec<(String, usize, u32)> = Vec::new();
        for (n, r) in live.iter().enumerate() {
            for p in r.owner.processes() {
                let recorded = p.cgroup.as_deref().filter(|c| !c.is_empty());
                if let Some(c) = recorded {
                    cgroups.push((c.to_string(), n));
                }
                // The init's namespace only while the recorded process still holds that pid:
                // a reused pid names someone else's namespace.
                let same = boot_id.as_deref() == Some(p.boot_id.as_str())
                    && matches!(system.process_start_time(p.pid), Ok(Some(t)) if t == p.start_time);
                if same && recorded.is_none() {
                    if let Ok(Some(c)) = system.cgroup_of(p.pid) {
                        unrecorded.push((c, n, p.pid));
                    }
                }
                let ns = same
                    .then(|| proc.pid_ns(&p.pid.to_string()).ok())
                    .flatten()
                    .filter(|ns| Some(*ns) != own_ns);
                if let Some(ns) = ns {
                    namespaces
                        .entry(ns)
                        .and_modify(|o| {
                            if *o != Some(n) {
                                *o = None;
                            }
                        })
                        .or_insert(Some(n));
                }
            }
        }
        // A recorded cgroup that another reservation's container runs in as well (not one
        // of its own containers) cannot tell their processes apart.
        cgroups.retain(|(c, n)| {
            !unrecorded.iter().any(|(u, m, pid)| {
                m != n
                    && within_cgroup(u, c)
                    && !live[*n].owner.processes().iter().any(|q| q.pid == *pid)
            })
        });
        cgroups.sort_by_key(|c| std::cmp::Reverse(c.0.len()));
        let booked = live
            .iter()
            .map(|r| r.gpus.iter().map(|b| b.uuid.clone()).collect())
            .collect();
        Attribution {
            proc,
            system,
            own_ns,
            namespaces,
            cgroups,
            booked,
            seen: HashMap::new(),
        }
    }

    /// The reservations host process `pid` may belong to, most specific first: the owner of
    /// its pid namespace, else those whose recorded cgroup holds it (whichever other
    /// processes share that cgroup), deepest first. Empty for a process of the host or of a
    /// container without a reservation. A `/proc` entry that cannot be read (the process is
    /// gone) is an error.
    pub fn candidates(&mut self, pid: u32) -> Result<&[usize], AttributionError> {
        if !self.seen.contains_key(&pid) {
            let found = self.look_up(pid)?;
            self.seen.insert(pid, found);
        }
        Ok(self
            .seen
            .get(&pid)
            .map(|l| l.candidates.as_slice())
            .unwrap_or_default())
    }

    /// The start time of `pid` as read when it was attributed, before the facts that
    /// attributed it: a kill checked against it hits only the process that was judged,
    /// never one that took the pid over afterwards. `None` when `pid` was not attributed or
    /// its start time could not be read (then it must not be killed).
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        self.seen.get(&pid).and_then(|l| l.start)
    }

    /// The reservation that owns `pid` on GPU `uuid`: the first candidate that books that
    /// GPU.
    pub fn owner_on(&mut self, pid: u32, uuid: &str) -> Result<Owned, AttributionError> {
        self.candidates(pid)?;
        let candidates = self
            .seen
            .get(&pid)
            .map(|l| l.candidates.as_slice())
            .unwrap_or_default();
        let booked = candidates.iter().copied().find(|n| {
            self.booked
                .get(*n)
                .is_some_and(|gpus| gpus.iter().any(|g| g == uuid))
        });
        Ok(match (booked, candidates.first()) {
            (Some(n), _) => Owned::By(n),
            (None, Some(n)) => Owned::ElsewhereBy(*n),
            (None, None) => Owned::Nobody,
        })
    }

    /// The cgroup `pid` runs in when it is at or under a cgroup recorded for reservation `n`
    /// that speaks for it (as in [`Attribution::candidates`]: not one another reservation's
    /// container runs in too): the only cgroups of a slice that may be acted on as a whole.
    /// Else `Err` with the cgroup it runs in (`None`: none could be read): a process
    /// attributed by its pid namespace alone may run in a cgroup shared with processes that
    /// are not the slice's (its container's init shared its cgroup at bind, or it is a host
    /// process that entered the container's pid namespace).
    pub fn recorded_cgroup(&self, pid: u32, n: usize) -> Result<String, Option<String>> {
        match self.system.cgroup_of(pid).ok().flatten() {
            Some(c)
                if self
                    .cgroups
                    .iter()
                    .any(|(recorded, m)| *m == n && within_cgroup(&c, recorded)) =>
            {
                Ok(c)
            }
            other => Err(other),
        }
    }

    fn look_up(&self, pid: u32) -> Result<Looked, AttributionError> {
        // Read first: a pid reused after this read carries another start time, so the facts
        // read next can only be charged to the process that had it.
        let start = self.system.process_start_time(pid).ok().flatten();
        let candidates = self.candidates_of(pid)?;
        Ok(Looked { candidates, start })
    }

    fn candidates_of(&self, pid: u32) -> Result<Vec<usize>, AttributionError> {
        let ns = self.proc.pid_ns(&pid.to_string())?;
        if Some(ns) != self.own_ns {
            if let Some(Some(n)) = self.namespaces.get(&ns) {
                return Ok(vec![*n]);
            }
        }
        if self.cgroups.is_empty() {
            return Ok(Vec::new());
        }
        // The cgroup it runs in, not the bind-time record (`process_cgroup`, which names
        // only a cgroup the process is alone in): a container's processes share its cgroup.
        let cgroup = self
            .system
            .cgroup_of(pid)
            .map_err(|e| AttributionError::Cgroup(e.to_string()))?;
        let Some(cgroup) = cgroup else {
            return Ok(Vec::new());
        };
        let mut found: Vec<usize> = Vec::new();
        for (recorded, n) in &self.cgroups {
            if within_cgroup(&cgroup, recorded) && !found.contains(n) {
                found.push(*n);
            }
        }
        Ok(found)
    }
}

/// Whose a GPU process is, on the GPU it was listed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// Reservation `n` (by position), which books this GPU.
    By(usize),
    /// Reservation `n`'s container, which has no booking on this GPU.
    ElsewhereBy(usize),
    /// The host's, or a container's without a reservation.
    Nobody,
}

/// A process whose owner cannot be told.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error("{0}")]
    Cgroup(String),
}

/// The listed reservations split into those processes are attributed to and those left out.
#[derive(Debug, Default)]
pub struct Attributed<'r> {
    /// Attributed, in registry order (positions as [`Attribution::new`] takes them).
    pub live: Vec<&'r Reservation>,
    /// Left out, each with the one-line reason when a container went away.
    pub stale: Vec<(&'r Reservation, Option<String>)>,
}

/// Which of the `listed` reservations (registry order) a scrape or an enforcement cycle
/// attributes processes to: the live ones as `owners` judges them ([`OwnerCheck`], the
/// registry's reaping rule), so the exporter shows a slice holding exactly what the enforcer
/// judges it by.
/// - A pending reservation (booked at create time, its container not bound yet) records no
///   process, so no process is ever charged to it; within its deadline it is attributed
///   (its booking is judged empty), past it left out.
/// - A bound one is attributed while its owner lives: a claim until it is released, a
///   container while its init runs or, once init exited, while the cgroup recorded at bind
///   still holds processes.
/// - A bound container whose init exited and whose recorded cgroup emptied (or one from an
///   earlier boot) is left out until reaping removes it: its processes are gone, and its
///   recorded pid and cgroup path may already name a stranger's (a reused pid, a later
///   container's re-created cgroup), who would be charged, and killed, against a limit
///   nobody holds.
/// - A released reservation is no longer listed: its leftover processes belong to no one
///   and are reported as unowned.
pub fn attributed<'r>(
    owners: &mut OwnerCheck,
    listed: &'r [Reservation],
    now: Instant,
) -> Attributed<'r> {
    let now_ms = owners.system().now_ms();
    let boot_id = owners.system().boot_id().ok();
    let mut out = Attributed::default();
    for r in listed {
        match owners.check(r, now, now_ms, boot_id.as_deref()) {
            Liveness::Live => out.live.push(r),
            Liveness::Stale { vanished } => out.stale.push((r, vanished)),
        }
    }
    let ids: HashSet<&str> = listed.iter().map(|r| r.id.as_str()).collect();
    owners.retain(|id| ids.contains(id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::FakeSystem;
    use std::path::Path;

    const HOST_NS: u64 = 4026531836;

    fn fake_process(root: &Path, pid: u32, ns: u64) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).unwrap();
    }

    /// A bound reservation of `kind` ("container" or "dra_claim") whose containers' inits are
    /// `inits` (pid, start time, cgroup), booked on `uuids`.
    fn reservation(kind: &str, inits: &[(u32, u64, &str)], uuids: &[&str]) -> Reservation {
        let procs: Vec<serde_json::Value> = inits
            .iter()
            .map(|(pid, start, cgroup)| {
                serde_json::json!({"pid": pid, "start_time": start, "boot_id": "fake-boot-0", "cgroup": cgroup})
            })
            .collect();
        let owner = if kind == "container" {
            serde_json::json!({"kind": "container", "container_id": "c", "process": procs[0]})
        } else {
            serde_json::json!({"kind": "dra_claim", "claim_uid": "u", "namespace": "ns", "name": "n", "members": procs})
        };
        serde_json::from_value(serde_json::json!({
            "id": "0000000000000001",
            "state": "bound",
            "owner": owner,
            "gpus": uuids.iter().enumerate().map(|(i, u)| serde_json::json!({
                "index": i, "uuid": u, "memory": 1, "cores": 0})).collect::<Vec<_>>(),
            "created_ms": 0,
        }))
        .unwrap()
    }

    #[test]
    fn cgroup_containment_is_by_whole_components() {
        assert!(within_cgroup(
            "system.slice/runc-a.scope",
            "system.slice/runc-a.scope"
        ));
        assert!(within_cgroup("kubepods/pod1/ctr/sub", "kubepods/pod1/ctr"));
        assert!(!within_cgroup("kubepods/pod1/ctr2", "kubepods/pod1/ctr"));
        // A container named `system` is not `system.slice`.
        assert!(!within_cgroup("system.slice/cron.service", "system"));
        assert!(!within_cgroup("x", "x/y"));
    }

    #[test]
    fn processes_are_attributed_by_namespace_or_cgroup_never_to_the_host() {
        let root = tempfile::tempdir().unwrap();
        let proc = ProcFs::new(root.path());
        let sys = FakeSystem::new(0);
        fake_process(root.path(), 1, HOST_NS);
        std::os::unix::fs::symlink("1", root.path().join("self")).unwrap();
        // Container A: own pid namespace 11; init 100, a GPU process 101.
        for pid in [100, 101] {
            fake_process(root.path(), pid, 11);
            sys.spawn(pid, pid as u64);
            sys.set_cgroup(pid, "ctr-a");
        }
        // Container B runs in the host's pid namespace (`--pid=host`): its cgroup decides.
        for pid in [200, 201] {
            fake_process(root.path(), pid, HOST_NS);
            sys.spawn(pid, pid as u64);
            sys.set_cgroup(pid, "system.slice/runc-b.scope");
        }
        // A process of B in a nested cgroup of its own.
        fake_process(root.path(), 202, 12);
        sys.spawn(202, 202);
        sys.set_cgroup(202, "system.slice/runc-b.scope/inner");
        // Host processes, one in a cgroup whose name starts like a container's.
        fake_process(root.path(), 300, HOST_NS);
        sys.spawn(300, 300);
        sys.set_cgroup(300, "system.slice/runc-b.scope2");
        fake_process(root.path(), 301, HOST_NS);
        sys.spawn(301, 301);
        let a = reservation("container", &[(100, 100, "ctr-a")], &["GPU-0"]);
        let b = reservation(
            "container",
            &[(200, 200, "system.slice/runc-b.scope")],
            &["GPU-0"],
        );
        let live = [&a, &b];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(201, "GPU-0").unwrap(), Owned::By(1));
        assert_eq!(who.owner_on(202, "GPU-0").unwrap(), Owned::By(1));
        assert_eq!(who.owner_on(300, "GPU-0").unwrap(), Owned::Nobody);
        assert_eq!(who.owner_on(301, "GPU-0").unwrap(), Owned::Nobody);
        assert_eq!(who.owner_on(101, "GPU-1").unwrap(), Owned::ElsewhereBy(0));
        assert!(who.owner_on(999, "GPU-0").is_err(), "no /proc entry");
    }

    /// A process of the host's `/proc` as the kernel shows it: its pid namespace link, its
    /// `stat` (start time `start`) and its `/proc/<pid>/cgroup` (cgroup v2 `cgroup`).
    fn real_process(root: &Path, pid: u32, ns: u64, start: u64, cgroup: &str) {
        fake_process(root, pid, ns);
        let dir = root.join(pid.to_string());
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (burn) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 200\n"),
        )
        .unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::/{cgroup}\n")).unwrap();
    }

    /// A cgroup v2 tree whose cgroups list `procs`.
    fn cgroup_tree(root: &Path, cgroups: &[(&str, &[u32])]) {
        std::fs::write(root.join("cgroup.controllers"), "memory pids\n").unwrap();
        for (c, procs) in cgroups {
            std::fs::create_dir_all(root.join(c)).unwrap();
            let list: String = procs.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(root.join(c).join("cgroup.procs"), list).unwrap();
        }
    }

    /// `unshare -U -r -p -f` in a container (and in a claim's container) puts the holder in
    /// a pid namespace no recorded init runs in, in the container's cgroup with the init and
    /// its other processes: read from `/proc` and the cgroup tree as the kernel has them, it
    /// is the container's, as is one in a cgroup below; a host process whose cgroup name
    /// starts like the container's, or one of its own pid namespace in the host's cgroups,
    /// is nobody's.
    #[test]
    fn a_process_in_a_pid_namespace_of_its_own_is_its_containers() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_root, cg_root) = (dir.path().join("proc"), dir.path().join("cgroup"));
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::create_dir_all(&cg_root).unwrap();
        std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "fake-boot-0\n").unwrap();
        real_process(&proc_root, 1, HOST_NS, 1, "system.slice/gpuslice.service");
        std::os::unix::fs::symlink("1", proc_root.join("self")).unwrap();
        // Container A (init 100, namespace 11): 101 in its namespace; 102 and 103 each made
        // a pid namespace of their own, 103 in a cgroup below A's.
        real_process(&proc_root, 100, 11, 5, "ctr-a");
        real_process(&proc_root, 101, 11, 6, "ctr-a");
        real_process(&proc_root, 102, 13, 7, "ctr-a");
        real_process(&proc_root, 103, 14, 8, "ctr-a/inner");
        // A claim's container (init 200, namespace 21) and its holder in namespace 23.
        real_process(&proc_root, 200, 21, 5, "kubepods/pod1/ctr-c");
        real_process(&proc_root, 202, 23, 7, "kubepods/pod1/ctr-c");
        // Host processes: one in `ctr-ab`, one in a pid namespace of its own.
        real_process(&proc_root, 300, HOST_NS, 9, "ctr-ab");
        real_process(&proc_root, 301, 31, 9, "user.slice/user-0.slice");
        cgroup_tree(
            &cg_root,
            &[
                ("system.slice/gpuslice.service", &[1]),
                ("ctr-a", &[100, 101, 102]),
                ("ctr-a/inner", &[103]),
                ("kubepods/pod1/ctr-c", &[200, 202]),
                ("ctr-ab", &[300]),
                ("user.slice/user-0.slice", &[301]),
            ],
        );
        let sys = gpuslice_registry::RealSystem::with_cgroup_root(&proc_root, &cg_root);
        let proc = ProcFs::new(&proc_root);
        // Recorded at bind, when each init was alone in its cgroup.
        let a = reservation("container", &[(100, 5, "ctr-a")], &["GPU-0"]);
        let c = reservation("dra_claim", &[(200, 5, "kubepods/pod1/ctr-c")], &["GPU-0"]);
        let live = [&a, &c];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(102, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(103, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(202, "GPU-0").unwrap(), Owned::By(1));
        assert_eq!(who.owner_on(300, "GPU-0").unwrap(), Owned::Nobody);
        assert_eq!(who.owner_on(301, "GPU-0").unwrap(), Owned::Nobody);
    }

    /// An engine that starts a second reservation's container in the first's recorded cgroup
    /// (after the first's bind, so the second records none): a process there in a pid
    /// namespace of its own could be either's and is charged to neither; each container's
    /// own namespace still decides for its processes.
    #[test]
    fn a_recorded_cgroup_another_reservations_container_runs_in_decides_nothing() {
        let root = tempfile::tempdir().unwrap();
        let proc = ProcFs::new(root.path());
        let sys = FakeSystem::new(0);
        fake_process(root.path(), 1, HOST_NS);
        std::os::unix::fs::symlink("1", root.path().join("self")).unwrap();
        for (pid, ns) in [(100, 11), (101, 11), (102, 13), (200, 21), (201, 21)] {
            fake_process(root.path(), pid, ns);
            sys.spawn(pid, pid as u64);
            sys.set_cgroup(pid, "shared.scope");
        }
        let a = reservation("container", &[(100, 100, "shared.scope")], &["GPU-0"]);
        let mut b = reservation("container", &[(200, 200, "")], &["GPU-0"]);
        b.id = "0000000000000002".into();
        let live = [&a];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(102, "GPU-0").unwrap(), Owned::By(0));
        let live = [&a, &b];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(102, "GPU-0").unwrap(), Owned::Nobody);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(201, "GPU-0").unwrap(), Owned::By(1));
    }

    #[test]
    fn a_reused_init_pid_names_no_namespace() {
        let root = tempfile::tempdir().unwrap();
        let proc = ProcFs::new(root.path());
        let sys = FakeSystem::new(0);
        fake_process(root.path(), 1, HOST_NS);
        std::os::unix::fs::symlink("1", root.path().join("self")).unwrap();
        // The recorded init (start time 5) is gone; pid 100 now is another container's
        // init (start time 9), namespace 21, cgroup other.
        fake_process(root.path(), 100, 21);
        fake_process(root.path(), 101, 21);
        for pid in [100, 101] {
            sys.spawn(pid, 9);
            sys.set_cgroup(pid, "other");
        }
        let gone = reservation("container", &[(100, 5, "ctr-gone")], &["GPU-0"]);
        let live = [&gone];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::Nobody);
    }

    #[test]
    fn a_claim_owns_the_processes_of_every_container_recorded_for_it() {
        let root = tempfile::tempdir().unwrap();
        let proc = ProcFs::new(root.path());
        let sys = FakeSystem::new(0);
        fake_process(root.path(), 1, HOST_NS);
        std::os::unix::fs::symlink("1", root.path().join("self")).unwrap();
        // Two containers of one pod share its pid namespace 31; each has its own cgroup.
        for (pid, cgroup) in [
            (100, "pod/c1"),
            (101, "pod/c1"),
            (200, "pod/c2"),
            (201, "pod/c2"),
        ] {
            fake_process(root.path(), pid, 31);
            sys.spawn(pid, pid as u64);
            sys.set_cgroup(pid, cgroup);
        }
        // c1 holds claim X (GPU-0), c2 holds claim Y (GPU-1): the shared namespace decides
        // nothing, the cgroups do.
        let x = reservation("dra_claim", &[(100, 100, "pod/c1")], &["GPU-0"]);
        let y = reservation("dra_claim", &[(200, 200, "pod/c2")], &["GPU-1"]);
        let live = [&x, &y];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(201, "GPU-1").unwrap(), Owned::By(1));
        assert_eq!(who.owner_on(201, "GPU-0").unwrap(), Owned::ElsewhereBy(1));
        // One container given both claims: its processes count for the claim of the GPU.
        let both_x = reservation("dra_claim", &[(100, 100, "pod/c1")], &["GPU-0"]);
        let both_y = reservation("dra_claim", &[(100, 100, "pod/c1")], &["GPU-1"]);
        let live = [&both_x, &both_y];
        let mut who = Attribution::new(&proc, &sys, &live);
        assert_eq!(who.owner_on(101, "GPU-0").unwrap(), Owned::By(0));
        assert_eq!(who.owner_on(101, "GPU-1").unwrap(), Owned::By(1));
    }
}

/// The exporter's per-slice figures and the enforcer's decisions come from this one
/// attribution: what `/metrics` shows a slice holding is what the enforcer judges it by.
#[cfg(test)]
mod agreement {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use gpuslice_config::EnforceConfig;
    use gpuslice_registry::{FakeSystem, RegistryFile, System};
    use gpuslice_slice::usage::{create_usage_file, ProcessIdentity, UsageFile};

    use crate::collect::{Collector, Sources};
    use crate::enforce::cycle::{Enforcer, Roots, Throttles};
    use crate::enforce::events::EventKind;
    use crate::enforce::signal::Recorder;
    use crate::errors::ErrorLog;
    use crate::gpu::{DeviceReading, GpuMeter, GpuProcess, Reading};

    const GIB: u64 = 1 << 30;
    const HOST_NS: u64 = 4026531836;
    const UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";

    struct Meter(Arc<Mutex<Vec<(u32, u64)>>>);
    impl GpuMeter for Meter {
        fn read(&mut self) -> Reading {
            let procs = self.0.lock().unwrap().clone();
            Reading {
                devices: vec![DeviceReading {
                    index: 0,
                    uuid: UUID.into(),
                    processes: Some(
                        procs
                            .iter()
                            .map(|(pid, used)| GpuProcess {
                                pid: *pid,
                                used: Some(*used),
                                sm: None,
                            })
                            .collect(),
                    ),
                    ..DeviceReading::default()
                }],
                errors: Vec::new(),
            }
        }
    }

    fn fake_process(root: &std::path::Path, pid: u32, ns: u64) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).unwrap();
    }

    /// A container slice (2 GiB) whose usage file also lists a host process: the exporter
    /// used to charge the slice with it (every slice's slots attributed), the enforcer did
    /// not (only claims' slots) — `/metrics` showed the slice over while nothing acted. Now
    /// both charge the container's own process only, and when that alone takes the slice
    /// over, the enforcer's figure is the exporter's.
    #[test]
    fn metrics_and_the_enforcer_charge_the_same_processes() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let state_dir = dir.path().join("state");
        fake_process(&proc_root, 1, HOST_NS);
        std::os::unix::fs::symlink("1", proc_root.join("self")).unwrap();
        let sys = Arc::new(FakeSystem::new(1_000));
        for (pid, ns, cgroup) in [
            (100, 11, "ctr-a"),
            (101, 11, "ctr-a"),
            (500, HOST_NS, "user.slice"),
        ] {
            fake_process(&proc_root, pid, ns);
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, cgroup);
        }
        let id = "00000000000000a1";
        let file: RegistryFile = serde_json::from_value(serde_json::json!({
            "version": gpuslice_registry::REGISTRY_VERSION,
            "inventory": {"gpus": [{"index": 0, "uuid": UUID, "model": "NVIDIA H200",
                "memory_total": 16 * GIB, "minor": 0}]},
            "reservations": [{
                "id": id, "state": "bound",
                "owner": {"kind": "container", "container_id": "a",
                    "process": {"pid": 100, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": "ctr-a"}},
                "gpus": [{"index": 0, "uuid": UUID, "memory": 2 * GIB, "cores": 0}],
                "created_ms": 0, "bound_ms": 0,
            }],
        }))
        .unwrap();
        let slice = state_dir.join("slices").join(id);
        std::fs::create_dir_all(&slice).unwrap();
        create_usage_file(&slice.join("usage")).unwrap();
        let _forged = UsageFile::open(
            &slice.join("usage"),
            ProcessIdentity {
                pid: 500,
                pid_ns: HOST_NS,
            },
        )
        .unwrap();

        let figures = Arc::new(Mutex::new(vec![(101, GIB), (500, 3 * GIB)]));
        let mut collector = Collector::new(
            Sources {
                state_dir: state_dir.clone(),
                proc_root: proc_root.clone(),
                node: "n".into(),
            },
            sys.clone() as Arc<dyn System>,
            Some(Box::new(Meter(figures.clone()))),
            ErrorLog::default(),
        );
        let kills = Arc::new(Mutex::new(Vec::new()));
        let mut enforcer = Enforcer::new(
            EnforceConfig::default(),
            Roots {
                state_dir,
                proc_root,
                cgroup_root: dir.path().join("cgroup"),
            },
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let t0 = Instant::now();
        let mut round = |at: u64| -> (Option<u64>, Option<u64>) {
            let now = t0 + Duration::from_secs(at);
            let shown = collector.collect_from(Some(&file), now).slices[0].nvml_memory_used;
            // The enforcer reads the same meter.
            let reading = Meter(figures.clone()).read();
            let out = enforcer.cycle(&file, &reading.devices, now);
            let judged = out
                .events
                .iter()
                .find(|e| e.kind == EventKind::MemoryKill)
                .and_then(|e| e.slice_bytes);
            (shown, judged)
        };
        for at in 0..4 {
            let (shown, judged) = round(at);
            assert_eq!(
                shown,
                Some(GIB),
                "the exporter charges the container's process only"
            );
            assert_eq!(judged, None, "under its limit: nothing to act on");
        }
        // The container's own process grows to 3 GiB: both see 3 GiB, and the enforcer acts.
        figures.lock().unwrap()[0].1 = 3 * GIB;
        let mut acted = None;
        for at in 4..8 {
            let (shown, judged) = round(at);
            assert_eq!(shown, Some(3 * GIB));
            acted = judged;
            if acted.is_some() {
                break;
            }
        }
        assert_eq!(
            acted,
            Some(3 * GIB),
            "the enforcer judged the figure the exporter shows"
        );
        assert_eq!(*kills.lock().unwrap(), vec![101]);
    }
}

//! One enforcement cycle: the registry read without its lock, the driver's per-process
//! figures, each process mapped to its reservation (container: its init process's pid
//! namespace, then its cgroup; DRA claim: the processes its slice's usage file lists), then
//! the memory and compute decisions per slice and GPU, acted on through the seams.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpuslice_config::{ComputeAction, EnforceConfig, MemoryAction};
use gpuslice_registry::{Owner, RegistryFile, Reservation, ReservationState, SLICES_DIR};
use gpuslice_slice::usage::read_snapshot;
use gpuslice_slice::USAGE_FILE;

use crate::serve::enforce::compute::ComputeTrack;
use crate::serve::enforce::events::{Event, EventKind};
use crate::serve::enforce::freezer::{freezer_of_pid, FreezerFile};
use crate::serve::enforce::memory::{MemoryTrack, MemoryVerdict, ProcMemory};
use crate::serve::enforce::meter::{GpuProcs, ProcFigures};
use crate::serve::enforce::signal::Signaller;
use crate::serve::procmap::{Attributor, ProcFs};

/// The run fraction of each cgroup under a duty cycle, read by the freezer thread.
pub type Throttles = Arc<Mutex<BTreeMap<FreezerFile, f64>>>;

/// Where a cycle reads from.
#[derive(Debug, Clone)]
pub struct Roots {
    pub state_dir: PathBuf,
    /// Normally `/proc`.
    pub proc_root: PathBuf,
    /// Normally `/sys/fs/cgroup`.
    pub cgroup_root: PathBuf,
}

/// What one cycle found and did.
#[derive(Debug, Default)]
pub struct CycleOutcome {
    pub events: Vec<Event>,
    /// Lines about what could not be read or done (not events).
    pub errors: Vec<String>,
    /// (reservation, GPU UUID, run fraction) of the slices under a duty cycle now.
    pub throttled: Vec<(String, String, f64)>,
    /// Unowned processes per GPU UUID now.
    pub unowned: Vec<(String, u64)>,
}

/// The enforcer's state across cycles.
pub struct Enforcer {
    cfg: EnforceConfig,
    roots: Roots,
    proc: ProcFs,
    signaller: Box<dyn Signaller>,
    memory: HashMap<(String, String), MemoryTrack>,
    compute: HashMap<(String, String), ComputeTrack>,
    /// Reservation → (init pid, its pid namespace).
    init_ns: HashMap<String, (u32, u64)>,
    /// (GPU, pid, start time) of unowned processes already reported.
    unowned_seen: HashSet<(String, u32, u64)>,
    throttles: Throttles,
    now_ms: Box<dyn Fn() -> u64 + Send>,
}

impl std::fmt::Debug for Enforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enforcer")
            .field("cfg", &self.cfg)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A live reservation as the cycle sees it.
struct Slice<'a> {
    r: &'a Reservation,
}

impl Enforcer {
    pub fn new(
        cfg: EnforceConfig,
        roots: Roots,
        signaller: Box<dyn Signaller>,
        throttles: Throttles,
    ) -> Enforcer {
        Enforcer {
            cfg,
            proc: ProcFs::new(roots.proc_root.clone()),
            roots,
            signaller,
            memory: HashMap::new(),
            compute: HashMap::new(),
            init_ns: HashMap::new(),
            unowned_seen: HashSet::new(),
            throttles,
            now_ms: Box::new(wall_ms),
        }
    }

    /// The pid namespace of a bound container's init process, read once per reservation.
    fn init_pid_ns(&mut self, r: &Reservation) -> Option<u64> {
        let pid = r.owner.process()?.pid;
        if let Some((p, ns)) = self.init_ns.get(&r.id) {
            if *p == pid {
                return Some(*ns);
            }
        }
        let ns = self.proc.pid_ns(&pid.to_string()).ok()?;
        self.init_ns.insert(r.id.clone(), (pid, ns));
        Some(ns)
    }

    /// The usage-file processes of a DRA claim's slice (a claim has no container of its
    /// own to map by; see docs/security.md for what this trusts).
    fn claim_slots(&self, r: &Reservation) -> Vec<(u64, u32)> {
        let path = self
            .roots
            .state_dir
            .join(SLICES_DIR)
            .join(&r.id)
            .join(USAGE_FILE);
        read_snapshot(&path)
            .map(|u| u.processes.iter().map(|p| (p.pid_ns, p.pid)).collect())
            .unwrap_or_default()
    }

    /// Runs one cycle on `file`'s reservations and the `gpus` the meter read.
    pub fn cycle(&mut self, file: &RegistryFile, gpus: &[GpuProcs], now: Instant) -> CycleOutcome {
        let mut out = CycleOutcome::default();
        let live: Vec<Slice<'_>> = file
            .reservations
            .iter()
            .filter(|r| matches!(r.state, ReservationState::Bound | ReservationState::Pending))
            .map(|r| Slice { r })
            .collect();

        // Who owns each process.
        let own_ns = self.proc.pid_ns("self").ok();
        let namespaces: Vec<Option<u64>> = live.iter().map(|s| self.init_pid_ns(s.r)).collect();
        let claim_slots: Vec<Vec<(u64, u32)>> = live
            .iter()
            .map(|s| match s.r.owner {
                Owner::DraClaim { .. } => self.claim_slots(s.r),
                Owner::Container { .. } => Vec::new(),
            })
            .collect();
        let proc = self.proc.clone();
        let mut who = Attributor::new(&proc, own_ns);
        for (n, s) in live.iter().enumerate() {
            who.add(
                n,
                claim_slots[n].iter().copied(),
                namespaces[n],
                s.r.owner.container_id(),
            );
        }
        // (slice, GPU UUID) → its processes there.
        let mut groups: BTreeMap<(usize, String), Vec<ProcFigures>> = BTreeMap::new();
        for g in gpus {
            let mut unowned = 0u64;
            for p in &g.processes {
                let owner = match who.owner_of(p.pid) {
                    Ok(o) => o,
                    Err(e) => {
                        // Gone between the driver's list and now: nothing to enforce.
                        out.errors.push(e.to_string());
                        continue;
                    }
                };
                let booked = owner.filter(|n| live[*n].r.gpus.iter().any(|b| b.uuid == g.uuid));
                match booked {
                    Some(n) => groups.entry((n, g.uuid.clone())).or_default().push(*p),
                    None => {
                        unowned += 1;
                        let start = self.signaller.start_time(p.pid).unwrap_or(0);
                        if self.unowned_seen.insert((g.uuid.clone(), p.pid, start)) {
                            let mut e = self.event(EventKind::Unowned, None, &g.uuid, p.pid);
                            e.process_bytes = p.used;
                            if let Some(n) = owner {
                                e.error = Some(format!(
                                    "it belongs to reservation {}, which has no booking on this GPU",
                                    live[n].r.id
                                ));
                            }
                            out.events.push(e);
                        }
                    }
                }
            }
            out.unowned.push((g.uuid.clone(), unowned));
        }
        let present: HashSet<(String, u32)> = gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(move |p| (g.uuid.clone(), p.pid)))
            .collect();
        self.unowned_seen
            .retain(|(u, pid, _)| present.contains(&(u.clone(), *pid)));

        // Decisions per slice and booked GPU (a GPU with no process is judged empty).
        let mut wanted: BTreeMap<FreezerFile, f64> = BTreeMap::new();
        let mut keep: HashSet<(String, String)> = HashSet::new();
        for (n, s) in live.iter().enumerate() {
            if s.r.whole_gpu {
                continue;
            }
            for b in &s.r.gpus {
                if !gpus.iter().any(|g| g.uuid == b.uuid) {
                    continue;
                }
                let key = (s.r.id.clone(), b.uuid.clone());
                keep.insert(key.clone());
                let procs = groups
                    .get(&(n, b.uuid.clone()))
                    .cloned()
                    .unwrap_or_default();
                self.judge_memory(s.r, &b.uuid, b.memory, &procs, now, &mut out);
                if b.cores > 0 {
                    self.judge_compute(s.r, &b.uuid, b.cores, &procs, now, &mut out, &mut wanted);
                }
            }
        }
        self.memory.retain(|k, _| keep.contains(k));
        self.compute.retain(|k, _| keep.contains(k));
        let ids: HashSet<&str> = live.iter().map(|s| s.r.id.as_str()).collect();
        self.init_ns.retain(|id, _| ids.contains(id.as_str()));
        *self.throttles.lock().unwrap_or_else(|p| p.into_inner()) = wanted;
        out
    }

    fn event(&self, kind: EventKind, r: Option<&Reservation>, uuid: &str, pid: u32) -> Event {
        Event {
            kind,
            at_ms: (self.now_ms)(),
            reservation: r.map(|r| r.id.clone()).unwrap_or_default(),
            container_id: r.and_then(|r| r.owner.container_id().map(str::to_string)),
            uuid: uuid.to_string(),
            pid,
            slice_bytes: None,
            limit_bytes: None,
            process_bytes: None,
            share: None,
            share_limit: None,
            error: None,
        }
    }

    fn judge_memory(
        &mut self,
        r: &Reservation,
        uuid: &str,
        limit: u64,
        procs: &[ProcFigures],
        now: Instant,
        out: &mut CycleOutcome,
    ) {
        let mem: Vec<ProcMemory> = procs
            .iter()
            .filter_map(|p| p.used.map(|used| ProcMemory { pid: p.pid, used }))
            .collect();
        let track = self
            .memory
            .entry((r.id.clone(), uuid.to_string()))
            .or_default();
        let MemoryVerdict::Act {
            pid, used, total, ..
        } = track.judge(&mem, limit, now, self.cfg.grace)
        else {
            return;
        };
        let mut e = self.event(EventKind::MemoryReport, Some(r), uuid, pid);
        e.slice_bytes = Some(total);
        e.limit_bytes = Some(limit);
        e.process_bytes = Some(used);
        if self.cfg.memory == MemoryAction::Kill {
            let result = match self.signaller.start_time(pid) {
                Some(start) => self.signaller.kill(pid, start).map_err(|e| e.to_string()),
                None => Err(format!("process {pid} is gone")),
            };
            match result {
                Ok(()) => e.kind = EventKind::MemoryKill,
                Err(err) => e.error = Some(format!("not killed: {err}")),
            }
        }
        out.events.push(e);
    }

    #[allow(clippy::too_many_arguments)]
    fn judge_compute(
        &mut self,
        r: &Reservation,
        uuid: &str,
        cores: u8,
        procs: &[ProcFigures],
        now: Instant,
        out: &mut CycleOutcome,
        wanted: &mut BTreeMap<FreezerFile, f64>,
    ) {
        if procs.iter().all(|p| p.sm.is_none()) && !procs.is_empty() {
            return; // The driver gives no per-process utilisation.
        }
        let used = procs.iter().filter_map(|p| p.sm).sum::<u32>() as f64 / 100.0;
        let share = f64::from(cores.min(100)) / 100.0;
        let throttle = self.cfg.compute == ComputeAction::Throttle;
        let track = self
            .compute
            .entry((r.id.clone(), uuid.to_string()))
            .or_default();
        let v = track.judge(used, share, now, self.cfg.window, throttle);
        if v.newly_over {
            let mut e = self.event(
                EventKind::ComputeReport,
                Some(r),
                uuid,
                procs.first().map_or(0, |p| p.pid),
            );
            e.share = Some(v.average);
            e.share_limit = Some(share);
            out.events.push(e);
        }
        if !throttle || v.run_fraction >= 1.0 {
            return;
        }
        let mut newly = false;
        for p in procs {
            match freezer_of_pid(&self.roots.proc_root, &self.roots.cgroup_root, p.pid) {
                Ok(f) => {
                    let before = self
                        .throttles
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains_key(&f);
                    newly |= !before && !wanted.contains_key(&f);
                    wanted.insert(f, v.run_fraction);
                }
                Err(err) => out.errors.push(err.to_string()),
            }
        }
        if newly {
            let mut e = self.event(
                EventKind::ComputeThrottle,
                Some(r),
                uuid,
                procs.first().map_or(0, |p| p.pid),
            );
            e.share = Some(used);
            e.share_limit = Some(share);
            out.events.push(e);
        }
        out.throttled
            .push((r.id.clone(), uuid.to_string(), v.run_fraction));
    }
}

#[cfg(test)]
mod tests {
    //! The enforcer's cycle against a fixture `/proc` (pid namespace links, status and
    //! cgroup files, as the kernel has them) and a recording signaller: the property that
    //! matters, over random per-process figures, is that no process of a slice under its
    //! limit is ever killed, whatever its neighbours on the GPU (other slices, unowned
    //! processes) hold.

    use super::*;
    use crate::serve::enforce::signal::SignalError;
    use gpuslice_registry::{Gpu, Inventory};
    use proptest::prelude::*;
    use std::path::Path;
    use std::time::Duration;

    const SLICES: usize = 3;
    /// GPU processes per slice (each in its container's pid namespace).
    const PROCS: usize = 3;
    const GPUS: usize = 2;
    /// Host processes on the GPUs that belong to no reservation.
    const UNOWNED: [u32; 2] = [500, 501];

    type Kills = Arc<Mutex<Vec<u32>>>;

    struct Recorder(Kills);

    impl Signaller for Recorder {
        fn start_time(&self, _pid: u32) -> Option<u64> {
            Some(1)
        }
        fn kill(&mut self, pid: u32, _start: u64) -> Result<(), SignalError> {
            self.0.lock().unwrap().push(pid);
            Ok(())
        }
    }

    fn fake_process(root: &Path, pid: u32, ns: u64, nspid: u32, cgroup: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), dir.join("ns/pid")).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\tburn\nPid:\t{pid}\nNSpid:\t{pid}\t{nspid}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn uuid(g: usize) -> String {
        format!("GPU-00000000-0000-0000-0000-{g:012}")
    }

    fn init_pid(s: usize) -> u32 {
        10_000 + s as u32 * 10
    }

    fn pid_of(s: usize, k: usize) -> u32 {
        init_pid(s) + 1 + k as u32
    }

    /// A node with [`SLICES`] bound container slices, each booked on every GPU with the
    /// memory of `limits[s][g]`, their processes and the unowned ones in a fixture `/proc`.
    fn node(dir: &Path, limits: &[[u64; GPUS]; SLICES]) -> (Roots, RegistryFile) {
        let proc_root = dir.join("proc");
        fake_process(&proc_root, 1, 4026531836, 1, "0::/\n");
        std::os::unix::fs::symlink("1", proc_root.join("self")).unwrap();
        for pid in UNOWNED {
            fake_process(&proc_root, pid, 4026531836, pid, "0::/user.slice\n");
        }
        let mut file = RegistryFile {
            inventory: Inventory {
                gpus: (0..GPUS)
                    .map(|g| Gpu {
                        index: g as u32,
                        uuid: uuid(g),
                        model: "NVIDIA H200".into(),
                        memory_total: 1 << 40,
                        minor: g as u32,
                        pci_bus_id: None,
                        numa_node: None,
                    })
                    .collect(),
            },
            ..RegistryFile::default()
        };
        for (s, limit) in limits.iter().enumerate() {
            let ns = 4026540000 + s as u64;
            let id = format!("ctr{s}");
            fake_process(&proc_root, init_pid(s), ns, 1, &format!("0::/{id}\n"));
            for k in 0..PROCS {
                fake_process(
                    &proc_root,
                    pid_of(s, k),
                    ns,
                    2 + k as u32,
                    &format!("0::/{id}\n"),
                );
            }
            // Through the registry's JSON: the form every version of the record reads.
            let r = serde_json::json!({
                "id": format!("{s:016x}"),
                "state": "bound",
                "owner": {
                    "kind": "container",
                    "container_id": id,
                    "process": {"pid": init_pid(s), "start_time": 1, "boot_id": "b"},
                },
                "gpus": (0..GPUS).map(|g| serde_json::json!({
                    "index": g, "uuid": uuid(g), "memory": limit[g], "cores": 0,
                })).collect::<Vec<_>>(),
                "created_ms": 0,
                "bound_ms": 0,
            });
            file.reservations.push(serde_json::from_value(r).unwrap());
        }
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let roots = Roots {
            state_dir,
            proc_root,
            cgroup_root: dir.join("cgroup"),
        };
        (roots, file)
    }

    /// Every GPU process of the node: (slice or `None` for unowned, pid).
    fn all_pids() -> Vec<(Option<usize>, u32)> {
        let mut v: Vec<(Option<usize>, u32)> = (0..SLICES)
            .flat_map(|s| (0..PROCS).map(move |k| (Some(s), pid_of(s, k))))
            .collect();
        v.extend(UNOWNED.iter().map(|p| (None, *p)));
        v
    }

    #[test]
    fn the_process_that_took_its_slice_over_is_killed_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let limits = [[4, 100], [4, 100], [4, 100]];
        let (roots, file) = node(dir.path(), &limits);
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        );
        let reading = |a: u64, b: u64| {
            vec![GpuProcs {
                uuid: uuid(0),
                processes: vec![
                    ProcFigures {
                        pid: pid_of(0, 0),
                        used: Some(a),
                        sm: Some(10),
                    },
                    ProcFigures {
                        pid: pid_of(0, 1),
                        used: Some(b),
                        sm: Some(10),
                    },
                    // Slice 1 is at its limit, and an unowned process holds a lot.
                    ProcFigures {
                        pid: pid_of(1, 0),
                        used: Some(4),
                        sm: Some(10),
                    },
                    ProcFigures {
                        pid: UNOWNED[0],
                        used: Some(1000),
                        sm: Some(90),
                    },
                ],
            }]
        };
        let t0 = Instant::now();
        let out = e.cycle(&file, &reading(3, 0), t0);
        assert!(
            out.events.iter().all(|e| e.kind == EventKind::Unowned),
            "{:?}",
            out.events
        );
        e.cycle(&file, &reading(3, 3), t0 + Duration::from_millis(500));
        assert!(kills.lock().unwrap().is_empty(), "within grace");
        let out = e.cycle(&file, &reading(3, 3), t0 + Duration::from_millis(2500));
        assert_eq!(*kills.lock().unwrap(), vec![pid_of(0, 1)]);
        let kill = out
            .events
            .iter()
            .find(|e| e.kind == EventKind::MemoryKill)
            .unwrap();
        assert_eq!(
            (kill.slice_bytes, kill.limit_bytes, kill.process_bytes),
            (Some(6), Some(4), Some(3))
        );
        assert_eq!(kill.reservation, format!("{:016x}", 0));
        assert_eq!(out.unowned, vec![(uuid(0), 1)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Over random per-process figures on two GPUs shared by three slices and two
        /// unowned processes: every kill hits a process of a slice that, on a GPU where the
        /// process holds memory, was over its limit at that reading and had been over
        /// since at least `grace` before; unowned processes are never killed; a killed
        /// process is gone from later readings, as it is from the driver's.
        #[test]
        fn never_kills_a_process_of_a_slice_under_its_limit(
            limits in prop::array::uniform3(prop::array::uniform2(1u64..60)),
            grace_ms in 0u64..2000,
            steps in proptest::collection::vec(
                (
                    1u64..1200,
                    proptest::collection::vec(
                        proptest::option::of(0u64..40),
                        (SLICES * PROCS + UNOWNED.len()) * GPUS,
                    ),
                ),
                1..30,
            ),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (roots, file) = node(dir.path(), &limits);
            let kills = Kills::default();
            let cfg = EnforceConfig {
                grace: Duration::from_millis(grace_ms),
                ..EnforceConfig::default()
            };
            let mut e = Enforcer::new(cfg, roots, Box::new(Recorder(kills.clone())), Throttles::default());
            let pids = all_pids();
            let mut dead: HashSet<u32> = HashSet::new();
            let mut over_since: HashMap<(usize, usize), Instant> = HashMap::new();
            let mut now = Instant::now();
            for (dt, figures) in steps {
                now += Duration::from_millis(dt);
                let mut gpus: Vec<GpuProcs> = (0..GPUS)
                    .map(|g| GpuProcs { uuid: uuid(g), processes: Vec::new() })
                    .collect();
                // (slice, GPU) → bytes its live processes hold this reading.
                let mut totals: HashMap<(usize, usize), u64> = HashMap::new();
                for (i, used) in figures.iter().enumerate() {
                    let (g, (owner, pid)) = (i % GPUS, pids[i / GPUS]);
                    let Some(used) = *used else { continue };
                    if dead.contains(&pid) {
                        continue;
                    }
                    gpus[g].processes.push(ProcFigures { pid, used: Some(used), sm: Some(1) });
                    if let Some(s) = owner {
                        *totals.entry((s, g)).or_default() += used;
                    }
                }
                for (s, limit) in limits.iter().enumerate() {
                    for (g, limit) in limit.iter().enumerate() {
                        if totals.get(&(s, g)).copied().unwrap_or(0) > *limit {
                            over_since.entry((s, g)).or_insert(now);
                        } else {
                            over_since.remove(&(s, g));
                        }
                    }
                }
                let before = kills.lock().unwrap().len();
                let out = e.cycle(&file, &gpus, now);
                let new: Vec<u32> = kills.lock().unwrap()[before..].to_vec();
                for pid in &new {
                    let owner = pids.iter().find(|(_, p)| p == pid).and_then(|(o, _)| *o);
                    prop_assert!(owner.is_some(), "killed unowned process {pid}");
                    let s = owner.unwrap_or_default();
                    let justified = (0..GPUS).any(|g| {
                        let holds = gpus[g].processes.iter().any(|p| p.pid == *pid && p.used > Some(0));
                        let over = totals.get(&(s, g)).copied().unwrap_or(0) > limits[s][g];
                        let long = over_since
                            .get(&(s, g))
                            .is_some_and(|t| now.duration_since(*t) >= Duration::from_millis(grace_ms));
                        holds && over && long
                    });
                    prop_assert!(
                        justified,
                        "killed {pid} of slice {s}: totals {totals:?}, limits {:?}, over since {over_since:?}",
                        limits[s]
                    );
                    dead.insert(*pid);
                }
                let killed_events = out.events.iter().filter(|e| e.kind == EventKind::MemoryKill).count();
                prop_assert_eq!(killed_events, new.len());
            }
        }
    }
}

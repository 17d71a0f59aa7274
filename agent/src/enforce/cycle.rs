//! One enforcement cycle: the registry read without its lock, the driver's per-process
//! figures, each process mapped to its reservation by `attribution` (host facts only: the
//! pid namespaces and recorded cgroups of the reservation's containers), then the memory and
//! compute decisions per slice and GPU, acted on through the seams.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpuslice_config::{ComputeAction, EnforceConfig, MemoryAction};
use gpuslice_registry::{RealSystem, RegistryFile, Reservation, System};

use crate::attribution::{attributed, Attribution, Owned};
use crate::enforce::compute::{ComputeTrack, ComputeVerdict};
use crate::enforce::events::{Event, EventKind};
use crate::enforce::freezer::{freezer_of_pid, FreezerFile};
use crate::enforce::memory::{MemoryTrack, MemoryVerdict, ProcMemory};
use crate::enforce::signal::Signaller;
use crate::enforce::stop::stop_containers;
use crate::gpu::{DeviceReading, GpuProcess};
use crate::liveness::OwnerCheck;
use crate::procmap::ProcFs;

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
    /// Start times and cgroups of processes, as the registry reads them.
    system: Arc<dyn System>,
    /// Which listed reservations are live (the exporter's rule, [`attributed`]).
    owners: OwnerCheck,
    signaller: Box<dyn Signaller>,
    memory: HashMap<(String, String), MemoryTrack>,
    compute: HashMap<(String, String), ComputeTrack>,
    /// (GPU, pid, start time) of unowned processes already reported.
    unowned_seen: HashSet<(String, u32, u64)>,
    /// The cgroup last reported per (reservation, pid) of a process not frozen because its
    /// cgroup is not one recorded for its slice's containers: one entry per listed process,
    /// however often it moves, and a move is reported again.
    unfrozen_seen: HashMap<(String, u32), String>,
    /// The freezer files of each (reservation, GPU UUID) under a duty cycle, as the last
    /// cycle that judged it planned them: what stays frozen, at its controller's run
    /// fraction, while the driver reads that GPU without listing its processes (for
    /// `enforce.window` at most, `unlisted_since`).
    frozen: HashMap<(String, String), Vec<FreezerFile>>,
    /// When each (reservation, GPU UUID) held because its GPU was read without a process
    /// list was first held, for the cycles in a row it has been: the hold lasts at most
    /// `enforce.window`.
    unlisted_since: HashMap<(String, String), Instant>,
    throttles: Throttles,
    now_ms: Box<dyn Fn() -> u64 + Send>,
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
        let system: Arc<dyn System> = Arc::new(RealSystem::with_cgroup_root(
            roots.proc_root.clone(),
            roots.cgroup_root.clone(),
        ));
        Enforcer {
            cfg,
            proc: ProcFs::new(roots.proc_root.clone()),
            owners: OwnerCheck::new(system.clone()),
            system,
            roots,
            signaller,
            memory: HashMap::new(),
            compute: HashMap::new(),
            unowned_seen: HashSet::new(),
            unfrozen_seen: HashMap::new(),
            frozen: HashMap::new(),
            unlisted_since: HashMap::new(),
            throttles,
            now_ms: Box::new(wall_ms),
        }
    }

    /// Reads start times and cgroups from `system` instead of the roots' `/proc` and cgroup
    /// tree (tests play processes out on a fake).
    pub fn with_system(mut self, system: Arc<dyn System>) -> Enforcer {
        self.owners = OwnerCheck::new(system.clone());
        self.system = system;
        self
    }

    /// Runs one cycle on `file`'s reservations and the `devices` the meter read. A GPU read
    /// without a process list (the listing failed) is left alone for at most
    /// `enforce.window` of cycles in a row: its slices are not judged, and keep what they
    /// had — grace clocks, repeat windows, kills in flight, controllers and the duty cycle
    /// they were under; past it their cgroups are thawed, their state kept. For a GPU
    /// missing from `devices` (it could not be read at all) their state is forgotten and
    /// their cgroups thawed at once.
    pub fn cycle(
        &mut self,
        file: &RegistryFile,
        devices: &[DeviceReading],
        now: Instant,
    ) -> CycleOutcome {
        let mut out = CycleOutcome::default();
        let live: Vec<Slice<'_>> = attributed(&mut self.owners, &file.reservations, now)
            .live
            .into_iter()
            .map(|r| Slice { r })
            .collect();
        // The GPUs whose processes the driver listed, with them.
        let gpus: Vec<(&String, &[GpuProcess])> = devices
            .iter()
            .filter_map(|d| Some((&d.uuid, d.processes.as_deref()?)))
            .collect();

        // Who owns each process.
        let reservations: Vec<&Reservation> = live.iter().map(|s| s.r).collect();
        let mut who = Attribution::new(&self.proc, &*self.system, &reservations);
        // (slice, GPU UUID) → its processes there.
        let mut groups: BTreeMap<(usize, String), Vec<GpuProcess>> = BTreeMap::new();
        // The start time of each attributed process, read when it was attributed: what a kill
        // is checked against.
        let mut judged: HashMap<u32, u64> = HashMap::new();
        // With `compute = "throttle"`: where each attributed process runs, and whether that
        // cgroup is one recorded for its slice (`Attribution::recorded_cgroup`), the only kind
        // a throttle may freeze.
        let throttle = self.cfg.compute == ComputeAction::Throttle;
        let mut cgroups: HashMap<u32, Result<String, Option<String>>> = HashMap::new();
        for &(uuid, procs) in &gpus {
            let mut unowned = 0u64;
            for p in procs {
                let owned = match who.owner_on(p.pid, uuid) {
                    Ok(o) => o,
                    Err(e) => {
                        // Gone between the driver's list and now: nothing to enforce.
                        out.errors.push(e.to_string());
                        continue;
                    }
                };
                if let Some(start) = who.start_time(p.pid) {
                    judged.insert(p.pid, start);
                }
                match owned {
                    Owned::By(n) => {
                        if throttle {
                            cgroups.insert(p.pid, who.recorded_cgroup(p.pid, n));
                        }
                        groups.entry((n, uuid.clone())).or_default().push(*p)
                    }
                    Owned::ElsewhereBy(_) | Owned::Nobody => {
                        unowned += 1;
                        let start = who.start_time(p.pid).unwrap_or(0);
                        if self.unowned_seen.insert((uuid.clone(), p.pid, start)) {
                            let mut e = self.event(EventKind::Unowned, None, uuid, p.pid);
                            e.process_bytes = p.used;
                            if let Owned::ElsewhereBy(n) = owned {
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
            out.unowned.push((uuid.clone(), unowned));
        }
        let listed = |uuid: &str| gpus.iter().any(|(u, _)| u.as_str() == uuid);
        // Read, but without a process list.
        let unlisted = |uuid: &str| !listed(uuid) && devices.iter().any(|d| d.uuid == uuid);

        // Decisions per slice and booked GPU (a GPU with no process is judged empty).
        let mut wanted: BTreeMap<FreezerFile, f64> = BTreeMap::new();
        let mut keep: HashSet<(String, String)> = HashSet::new();
        // The reservations with a booked GPU held because its processes were not listed.
        let mut held: HashSet<&str> = HashSet::new();
        // The (reservation, GPU UUID) whose GPU was read without a process list.
        let mut unlisted_now: HashSet<(String, String)> = HashSet::new();
        // GPU UUID → the reservations whose held state there is let go this cycle.
        let mut released: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (n, s) in live.iter().enumerate() {
            if s.r.whole_gpu {
                continue;
            }
            for b in &s.r.gpus {
                let key = (s.r.id.clone(), b.uuid.clone());
                if unlisted(&b.uuid) {
                    // Nothing is known of its processes this cycle, which is no sign that
                    // the slice came under (a tenant can make the listing fail by opening
                    // contexts faster than the driver's list is sized): nothing is decided
                    // or forgotten, and its cgroups stay under the duty cycle they had —
                    // dropped from the plan, they would thaw and run free. The freeze lasts
                    // a window at most (a listing that keeps failing would freeze them for
                    // good); the state stays, so that failing the listing now and then
                    // restarts no grace clock and no controller.
                    unlisted_now.insert(key.clone());
                    keep.insert(key.clone());
                    held.insert(&s.r.id);
                    let since = *self.unlisted_since.entry(key.clone()).or_insert(now);
                    if now.saturating_duration_since(since) < self.cfg.window {
                        self.hold_throttle(&key, &mut out, &mut wanted);
                    } else if self.frozen.remove(&key).is_some() {
                        released.entry(&b.uuid).or_default().push(&s.r.id);
                    }
                    continue;
                }
                if !listed(&b.uuid) {
                    // Missing from the reading (the GPU could not be read): nothing is held.
                    continue;
                }
                keep.insert(key.clone());
                // Planned again from this reading (`freeze`), or not frozen any more.
                self.frozen.remove(&key);
                let procs = groups
                    .get(&(n, b.uuid.clone()))
                    .cloned()
                    .unwrap_or_default();
                self.judge_memory(s.r, &b.uuid, b.memory, &procs, &judged, now, &mut out);
                if b.cores > 0 {
                    let slice = (s.r, b.uuid.as_str(), b.cores);
                    self.judge_compute(slice, &procs, &cgroups, now, &mut out, &mut wanted);
                }
            }
        }
        for (uuid, ids) in released {
            out.errors.push(format!(
                "the driver has not listed the processes of GPU {uuid} for {}: the cgroups \
                 of its slices {} there are thawed until it lists them again",
                humantime::format_duration(self.cfg.window),
                ids.join(", ")
            ));
        }
        self.memory.retain(|k, _| keep.contains(k));
        self.compute.retain(|k, _| keep.contains(k));
        self.frozen.retain(|k, _| keep.contains(k));
        self.unlisted_since.retain(|k, _| unlisted_now.contains(k));
        // What was reported of processes no longer listed is forgotten, but not for a GPU
        // read without a process list (or a reservation held) this cycle.
        let present: HashSet<(String, u32)> = gpus
            .iter()
            .flat_map(|&(uuid, procs)| procs.iter().map(move |p| (uuid.clone(), p.pid)))
            .collect();
        self.unowned_seen
            .retain(|(u, pid, _)| unlisted(u) || present.contains(&(u.clone(), *pid)));
        self.unfrozen_seen.retain(|(r, pid), _| {
            held.contains(r.as_str()) || present.iter().any(|(_, p)| p == pid)
        });
        *self.throttles.lock().unwrap_or_else(|p| p.into_inner()) = wanted;
        out
    }

    /// Keeps `key`'s (reservation, GPU UUID) cgroups in the duty-cycle plan `wanted` as the
    /// last cycle that judged it planned them, at its controller's run fraction, when they
    /// were under a duty cycle.
    fn hold_throttle(
        &self,
        key: &(String, String),
        out: &mut CycleOutcome,
        wanted: &mut BTreeMap<FreezerFile, f64>,
    ) {
        let (Some(files), Some(track)) = (self.frozen.get(key), self.compute.get(key)) else {
            return;
        };
        let run = track.run_fraction();
        for f in files {
            wanted.insert(f.clone(), run);
        }
        out.throttled.push((key.0.clone(), key.1.clone(), run));
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

    #[allow(clippy::too_many_arguments)]
    fn judge_memory(
        &mut self,
        r: &Reservation,
        uuid: &str,
        limit: u64,
        procs: &[GpuProcess],
        judged: &HashMap<u32, u64>,
        now: Instant,
        out: &mut CycleOutcome,
    ) {
        let mem: Vec<ProcMemory> = procs
            .iter()
            .filter_map(|p| {
                p.used.map(|used| ProcMemory {
                    pid: p.pid,
                    used,
                    start: judged.get(&p.pid).copied(),
                })
            })
            .collect();
        let action = self.cfg.memory;
        let track = self
            .memory
            .entry((r.id.clone(), uuid.to_string()))
            .or_insert_with(|| MemoryTrack::new(action));
        let MemoryVerdict::Act {
            procs: ended,
            total,
            repeat,
            ..
        } = track.judge(&mem, limit, now, self.cfg.grace)
        else {
            return;
        };
        let kill = action == MemoryAction::Kill;
        // (pid, start time) of each process killed: left out of the slice while the driver
        // still lists it (`MemoryTrack::killed`).
        let mut killed: Vec<(u32, u64)> = Vec::new();
        for p in &ended {
            let mut e = self.event(EventKind::MemoryReport, Some(r), uuid, p.pid);
            e.slice_bytes = Some(total);
            e.limit_bytes = Some(limit);
            e.process_bytes = Some(p.used);
            if kill {
                // Checked against the start time read when it was attributed, so a pid
                // reused since then is not hit; unknown, it is reported and left alone.
                let result = match p.start {
                    Some(start) => self
                        .signaller
                        .kill(p.pid, start)
                        .map(|()| start)
                        .map_err(|e| e.to_string()),
                    None => Err(format!(
                        "the start time of process {} was not readable when it was attributed",
                        p.pid
                    )),
                };
                match result {
                    Ok(start) => {
                        e.kind = EventKind::MemoryKill;
                        killed.push((p.pid, start));
                    }
                    Err(err) => e.error = Some(format!("not killed: {err}")),
                }
            }
            out.events.push(e);
        }
        if repeat {
            // Over again within the repeat window of a kill (with `report` there is none): a
            // process keeps coming back past the shim. Its containers are stopped, so the
            // slice stays under.
            let first = ended.first().map_or(0, |p| p.pid);
            let mut e = self.event(EventKind::MemoryEscalation, Some(r), uuid, first);
            e.slice_bytes = Some(total);
            e.limit_bytes = Some(limit);
            if kill {
                let (stopped, errors) =
                    stop_containers(r, &self.roots.cgroup_root, &mut *self.signaller);
                killed.extend(stopped);
                if !errors.is_empty() {
                    e.error = Some(format!("not every process stopped: {}", errors.join("; ")));
                }
            }
            out.events.push(e);
        }
        if let Some(track) = self.memory.get_mut(&(r.id.clone(), uuid.to_string())) {
            for (pid, start) in killed {
                track.killed(pid, start, now);
            }
        }
    }

    /// Judges the compute share of `(reservation, GPU UUID, cores)`, whose `procs` run in
    /// `cgroups` (each attributed process's, see `cycle`).
    fn judge_compute(
        &mut self,
        (r, uuid, cores): (&Reservation, &str, u8),
        procs: &[GpuProcess],
        cgroups: &HashMap<u32, Result<String, Option<String>>>,
        now: Instant,
        out: &mut CycleOutcome,
        wanted: &mut BTreeMap<FreezerFile, f64>,
    ) {
        let share = f64::from(cores.min(100)) / 100.0;
        let throttle = self.cfg.compute == ComputeAction::Throttle;
        let key = (r.id.clone(), uuid.to_string());
        if procs.iter().all(|p| p.sm.is_none()) && !procs.is_empty() {
            // No per-process figure this reading (the driver does not give one, or its read
            // failed; an idle process reads 0, `gpu::SampleCursor`): nothing is judged, and a
            // slice under a duty cycle stays under the one it has — dropping it from the plan
            // would thaw it to run free until the driver answers again.
            let Some(track) = self.compute.get(&key) else {
                return;
            };
            let held = ComputeVerdict {
                average: track.average(),
                newly_over: false,
                run_fraction: track.run_fraction(),
            };
            if throttle && held.run_fraction < 1.0 {
                self.freeze(r, uuid, procs, cgroups, (held, None, share), out, wanted);
            }
            return;
        }
        let used = procs.iter().filter_map(|p| p.sm).sum::<u32>() as f64 / 100.0;
        let track = self.compute.entry(key).or_default();
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
        self.freeze(r, uuid, procs, cgroups, (v, Some(used), share), out, wanted);
    }

    /// Puts the cgroups of `procs` (a slice's on GPU `uuid`) into the duty-cycle plan
    /// `wanted` at the verdict's run fraction; `used` is this reading's share (`None` when
    /// the plan is held without a figure), `share` the slice's.
    #[allow(clippy::too_many_arguments)]
    fn freeze(
        &mut self,
        r: &Reservation,
        uuid: &str,
        procs: &[GpuProcess],
        cgroups: &HashMap<u32, Result<String, Option<String>>>,
        (v, used, share): (ComputeVerdict, Option<f64>, f64),
        out: &mut CycleOutcome,
        wanted: &mut BTreeMap<FreezerFile, f64>,
    ) {
        let mut newly = false;
        let mut frozen: Vec<FreezerFile> = Vec::new();
        for p in procs {
            // Only a cgroup recorded for the slice's containers (or one below it) is frozen:
            // a process attributed by its pid namespace alone may run in a cgroup shared with
            // the host or other tenants (a container whose init shared its cgroup at bind,
            // a host process that entered its pid namespace), and freezing it would freeze
            // them. Such a process is reported, once, naming its cgroup.
            let cgroup = match cgroups.get(&p.pid) {
                Some(Ok(_)) => None,
                Some(Err(c)) => Some(c.clone()),
                None => Some(None),
            };
            if let Some(cgroup) = cgroup {
                let shown = cgroup.clone().unwrap_or_else(|| "(unreadable)".into());
                if self
                    .unfrozen_seen
                    .insert((r.id.clone(), p.pid), shown.clone())
                    .as_ref()
                    != Some(&shown)
                {
                    let mut e = self.event(EventKind::ComputeReport, Some(r), uuid, p.pid);
                    e.share = Some(v.average);
                    e.share_limit = Some(share);
                    e.error = Some(format!(
                        "not throttled: process {} runs in cgroup {shown}, which is not a cgroup recorded for this reservation's containers (nor below one); freezing it could freeze processes that are not the slice's",
                        p.pid
                    ));
                    out.events.push(e);
                }
                continue;
            }
            match freezer_of_pid(&self.roots.proc_root, &self.roots.cgroup_root, p.pid) {
                Ok(f) => {
                    let before = self
                        .throttles
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains_key(&f);
                    newly |= !before && !wanted.contains_key(&f);
                    wanted.insert(f.clone(), v.run_fraction);
                    frozen.push(f);
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
            e.share = used;
            e.share_limit = Some(share);
            out.events.push(e);
        }
        if !frozen.is_empty() {
            out.throttled
                .push((r.id.clone(), uuid.to_string(), v.run_fraction));
            self.frozen.insert((r.id.clone(), uuid.to_string()), frozen);
        }
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
    use crate::enforce::memory::REPEAT_WINDOW;
    use crate::enforce::signal::Recorder;
    use gpuslice_registry::{FakeSystem, Gpu, Inventory};
    use proptest::prelude::*;
    use std::path::Path;
    use std::time::Duration;

    const SLICES: usize = 3;
    /// GPU processes per slice: in its container's pid namespace, but the last, which made a
    /// pid namespace of its own (`unshare -p -f`) in the container's cgroup.
    const PROCS: usize = 3;
    const GPUS: usize = 2;
    /// Host processes on the GPUs that belong to no reservation.
    const UNOWNED: [u32; 2] = [500, 501];

    type Kills = Arc<Mutex<Vec<u32>>>;

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

    /// GPU `uuid` as the meter reads it, with the driver's list of its processes.
    fn listed(uuid: String, processes: Vec<GpuProcess>) -> DeviceReading {
        DeviceReading {
            uuid,
            processes: Some(processes),
            ..DeviceReading::default()
        }
    }

    fn init_pid(s: usize) -> u32 {
        10_000 + s as u32 * 10
    }

    fn pid_of(s: usize, k: usize) -> u32 {
        init_pid(s) + 1 + k as u32
    }

    /// A node with [`SLICES`] bound container slices, each booked on every GPU with the
    /// memory of `limits[s][g]`, their processes and the unowned ones in a fixture `/proc`
    /// (pid namespaces), a fixture cgroup tree (`cgroup.procs`) and a fake system (start
    /// times, cgroups), as the kernel has them: each container's processes share its cgroup,
    /// which was recorded at bind while its init was alone in it.
    fn node(dir: &Path, limits: &[[u64; GPUS]; SLICES]) -> (Roots, RegistryFile, Arc<FakeSystem>) {
        let sys = Arc::new(FakeSystem::new(0));
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
                        pcie_root: None,
                    })
                    .collect(),
            },
            ..RegistryFile::default()
        };
        let cgroup_root = dir.join("cgroup");
        for (s, limit) in limits.iter().enumerate() {
            let ns = 4026540000 + s as u64;
            let id = format!("ctr{s}");
            fake_process(&proc_root, init_pid(s), ns, 1, &format!("0::/{id}\n"));
            sys.spawn(init_pid(s), 1);
            sys.set_cgroup(init_pid(s), &id);
            // What the createRuntime hook records, before the container's process runs.
            let recorded = sys.process_cgroup(init_pid(s)).unwrap();
            assert_eq!(recorded.as_deref(), Some(id.as_str()));
            let mut procs = vec![init_pid(s)];
            for k in 0..PROCS {
                sys.spawn(pid_of(s, k), 1);
                sys.set_cgroup(pid_of(s, k), &id);
                let (ns, nspid) = if k + 1 == PROCS {
                    (4026550000 + s as u64, 1)
                } else {
                    (ns, 2 + k as u32)
                };
                fake_process(&proc_root, pid_of(s, k), ns, nspid, &format!("0::/{id}\n"));
                procs.push(pid_of(s, k));
            }
            std::fs::create_dir_all(cgroup_root.join(&id)).unwrap();
            let list: String = procs.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(cgroup_root.join(&id).join("cgroup.procs"), list).unwrap();
            // Through the registry's JSON: the form every version of the record reads.
            let r = serde_json::json!({
                "id": format!("{s:016x}"),
                "state": "bound",
                "owner": {
                    "kind": "container",
                    "container_id": id,
                    "process": {"pid": init_pid(s), "start_time": 1, "boot_id": "fake-boot-0",
                        "cgroup": recorded},
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
            cgroup_root,
        };
        (roots, file, sys)
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
        let (roots, file, sys) = node(dir.path(), &limits);
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let reading = |a: u64, b: u64| {
            vec![listed(
                uuid(0),
                vec![
                    GpuProcess {
                        pid: pid_of(0, 0),
                        used: Some(a),
                        sm: Some(10),
                    },
                    GpuProcess {
                        pid: pid_of(0, 1),
                        used: Some(b),
                        sm: Some(10),
                    },
                    // Slice 1 is at its limit, and an unowned process holds a lot.
                    GpuProcess {
                        pid: pid_of(1, 0),
                        used: Some(4),
                        sm: Some(10),
                    },
                    GpuProcess {
                        pid: UNOWNED[0],
                        used: Some(1000),
                        sm: Some(90),
                    },
                ],
            )]
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

    const GIB: u64 = 1 << 30;
    const HOST_NS: u64 = 4026531836;

    /// One GPU's processes with their bytes.
    fn on_gpu0(procs: &[(u32, u64)]) -> Vec<DeviceReading> {
        vec![listed(
            uuid(0),
            procs
                .iter()
                .map(|(pid, used)| GpuProcess {
                    pid: *pid,
                    used: Some(*used),
                    sm: Some(1),
                })
                .collect(),
        )]
    }

    /// Runs cycles over `readings` spaced `step` apart; returns the kills.
    fn run(
        e: &mut Enforcer,
        kills: &Kills,
        file: &RegistryFile,
        readings: &[Vec<DeviceReading>],
        step: Duration,
    ) -> Vec<u32> {
        let t0 = Instant::now();
        for (i, r) in readings.iter().enumerate() {
            e.cycle(file, r, t0 + step * i as u32);
        }
        kills.lock().unwrap().clone()
    }

    /// A bound DRA claim reservation booking `limit` bytes of GPU 0, whose recorded
    /// container is `member` (pid, cgroup).
    fn claim(id: &str, limit: u64, member: Option<(u32, &str)>) -> Reservation {
        let members: Vec<serde_json::Value> = member
            .iter()
            .map(|(pid, cgroup)| {
                serde_json::json!({"pid": pid, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": cgroup})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "id": id, "state": "bound",
            "owner": {"kind": "dra_claim", "claim_uid": "uid-x", "namespace": "tenant-x",
                "name": "x", "members": members},
            "gpus": [{"index": 0, "uuid": uuid(0), "memory": limit, "cores": 0}],
            "created_ms": 0, "bound_ms": 0,
        }))
        .unwrap()
    }

    /// A container (or claim) that writes other processes' (pid namespace, pid) pairs into
    /// its usage file — a victim container's process and a host process, all it needs being
    /// pid 1 of namespaces made before its own — gets neither charged to its slice, so
    /// neither is killed however far over its 1 GiB slice they would take it; its own
    /// process over the limit still is.
    #[test]
    fn forged_usage_file_pairs_get_no_other_process_killed() {
        use gpuslice_slice::usage::{create_usage_file, ProcessIdentity, UsageFile};
        let dir = tempfile::tempdir().unwrap();
        let limits = [[4 * GIB, GIB]; SLICES];
        let (roots, mut file, sys) = node(dir.path(), &limits);
        // The attacker: a claim whose container runs in namespace 4026549999, cgroup `atk`.
        let atk_ns = 4026549999;
        fake_process(&roots.proc_root, 900, atk_ns, 1, "0::/atk\n");
        fake_process(&roots.proc_root, 901, atk_ns, 2, "0::/atk\n");
        for pid in [900, 901] {
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, "atk");
        }
        let id = "00000000000000aa";
        file.reservations.push(claim(id, GIB, Some((900, "atk"))));
        let slice = roots.state_dir.join("slices").join(id);
        std::fs::create_dir_all(&slice).unwrap();
        let usage = slice.join("usage");
        create_usage_file(&usage).unwrap();
        // Forged slots: slice 0's process (pid 2 of its namespace) and host process 500.
        let victim = pid_of(0, 0);
        let _forged = [
            UsageFile::open(
                &usage,
                ProcessIdentity {
                    pid: 2,
                    pid_ns: 4026540000,
                },
            )
            .unwrap(),
            UsageFile::open(
                &usage,
                ProcessIdentity {
                    pid: UNOWNED[0],
                    pid_ns: HOST_NS,
                },
            )
            .unwrap(),
        ];
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let reading = on_gpu0(&[(victim, 3 * GIB), (UNOWNED[0], 3 * GIB), (901, GIB / 2)]);
        let killed = run(
            &mut e,
            &kills,
            &file,
            &vec![reading; 4],
            Duration::from_secs(1),
        );
        assert!(killed.is_empty(), "killed {killed:?}");
        // The attacker's own process over its slice is still caught.
        let over = on_gpu0(&[(victim, 3 * GIB), (UNOWNED[0], 3 * GIB), (901, 2 * GIB)]);
        let killed = run(
            &mut e,
            &kills,
            &file,
            &vec![over; 4],
            Duration::from_secs(1),
        );
        assert_eq!(killed.first(), Some(&901), "{killed:?}");
        assert!(killed.iter().all(|p| [900, 901].contains(p)), "{killed:?}");
    }

    /// A container named `system` (raw runc ids are the user's to pick) is charged with
    /// nothing outside its own cgroup: not a host GPU job in `system.slice/…`.
    #[test]
    fn a_container_named_system_is_charged_only_with_its_own_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, mut file, sys) = node(dir.path(), &[[GIB, GIB]; SLICES]);
        fake_process(&roots.proc_root, 700, 4026548888, 1, "0::/system\n");
        fake_process(
            &roots.proc_root,
            701,
            HOST_NS,
            701,
            "0::/system.slice/train.service\n",
        );
        sys.spawn(700, 1);
        sys.set_cgroup(700, "system");
        sys.spawn(701, 1);
        sys.set_cgroup(701, "system.slice/train.service");
        let r = serde_json::json!({
            "id": "00000000000000bb", "state": "bound",
            "owner": {"kind": "container", "container_id": "system",
                "process": {"pid": 700, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": "system"}},
            "gpus": [{"index": 0, "uuid": uuid(0), "memory": GIB, "cores": 0}],
            "created_ms": 0, "bound_ms": 0,
        });
        file.reservations.push(serde_json::from_value(r).unwrap());
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let reading = on_gpu0(&[(701, 8 * GIB)]);
        let t0 = Instant::now();
        let mut unowned = 0;
        for i in 0..4 {
            let out = e.cycle(&file, &reading, t0 + Duration::from_secs(i));
            unowned += out
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Unowned && e.pid == 701)
                .count();
        }
        assert!(
            kills.lock().unwrap().is_empty(),
            "{:?}",
            kills.lock().unwrap()
        );
        assert_eq!(
            unowned, 1,
            "the host job is reported as no reservation's, once"
        );
    }

    /// A reservation left from an earlier boot (reaping has not run yet) whose recorded
    /// cgroup path a container of this boot re-created: the earlier one is stale, so the
    /// process in that cgroup is judged against the live container's 4 GiB, never against the
    /// 1 GiB nobody holds any more (listed first, it used to win the cgroup tie).
    #[test]
    fn a_stale_reservation_charges_nothing_to_whoever_reuses_its_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, mut file, sys) = node(dir.path(), &[[GIB, GIB]; SLICES]);
        // This boot's container runs in the host's pid namespace: its cgroup decides.
        for pid in [610, 611] {
            fake_process(&roots.proc_root, pid, HOST_NS, pid, "0::/ctr-x\n");
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, "ctr-x");
        }
        for (id, pid, boot, memory) in [
            ("00000000000000d0", 600, "earlier-boot", GIB),
            ("00000000000000d1", 610, "fake-boot-0", 4 * GIB),
        ] {
            let r = serde_json::json!({
                "id": id, "state": "bound",
                "owner": {"kind": "container", "container_id": id,
                    "process": {"pid": pid, "start_time": 1, "boot_id": boot, "cgroup": "ctr-x"}},
                "gpus": [{"index": 0, "uuid": uuid(0), "memory": memory, "cores": 0}],
                "created_ms": 0, "bound_ms": 0,
            });
            file.reservations.push(serde_json::from_value(r).unwrap());
        }
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let killed = run(
            &mut e,
            &kills,
            &file,
            &vec![on_gpu0(&[(611, 3 * GIB)]); 4],
            Duration::from_secs(1),
        );
        assert!(killed.is_empty(), "killed {killed:?}");
        // Over the live container's own limit it is acted on.
        let killed = run(
            &mut e,
            &kills,
            &file,
            &vec![on_gpu0(&[(611, 5 * GIB)]); 4],
            Duration::from_secs(1),
        );
        assert_eq!(killed.first(), Some(&611), "{killed:?}");
        assert!(killed.iter().all(|p| [610, 611].contains(p)), "{killed:?}");
    }

    /// A container that keeps starting holders past the shim (one more 1 GiB holder every
    /// second on a 2 GiB slice): one action brings the slice back under within grace plus
    /// an interval, and when it goes over again within the repeat window its container is
    /// stopped, so from then on the slice holds at most its limit at every reading.
    #[test]
    fn a_slice_that_keeps_respawning_holders_is_brought_under_and_kept_there() {
        let dir = tempfile::tempdir().unwrap();
        let (mut roots, mut file, sys) = node(dir.path(), &[[100 * GIB, 100 * GIB]; SLICES]);
        // The respawning container: init 800 in cgroup `spawner`, whose cgroup.procs the
        // fixture cgroup tree lists; killing the init ends the container (and its spawner).
        roots.cgroup_root = dir.path().join("cgroup");
        std::fs::create_dir_all(roots.cgroup_root.join("spawner")).unwrap();
        std::fs::write(roots.cgroup_root.join("spawner/cgroup.procs"), "800\n").unwrap();
        fake_process(&roots.proc_root, 800, 4026547777, 1, "0::/spawner\n");
        sys.spawn(800, 1);
        sys.set_cgroup(800, "spawner");
        let r = serde_json::json!({
            "id": "00000000000000cc", "state": "bound",
            "owner": {"kind": "container", "container_id": "spawner",
                "process": {"pid": 800, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": "spawner"}},
            "gpus": [{"index": 0, "uuid": uuid(0), "memory": 2 * GIB, "cores": 0}],
            "created_ms": 0, "bound_ms": 0,
        });
        file.reservations.push(serde_json::from_value(r).unwrap());
        let kills = Kills::default();
        let grace = Duration::from_secs(2);
        let interval = Duration::from_millis(500);
        let mut e = Enforcer::new(
            EnforceConfig {
                grace,
                interval,
                ..EnforceConfig::default()
            },
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let t0 = Instant::now();
        let mut holders: Vec<u32> = Vec::new();
        let mut stopped = false;
        let mut first_over: Option<Instant> = None;
        let mut back_under: Option<Instant> = None;
        for tick in 0..40u32 {
            let now = t0 + interval * tick;
            // A new holder every second while the container runs.
            if !stopped && tick % 2 == 0 {
                let pid = 1000 + tick;
                fake_process(
                    e.roots.proc_root.as_path(),
                    pid,
                    4026547777,
                    2 + tick,
                    "0::/spawner\n",
                );
                holders.push(pid);
            }
            let reading = on_gpu0(&holders.iter().map(|p| (*p, GIB)).collect::<Vec<_>>());
            let out = e.cycle(&file, &reading, now);
            let gone: HashSet<u32> = kills.lock().unwrap().iter().copied().collect();
            holders.retain(|p| !gone.contains(p));
            stopped |= gone.contains(&800);
            if stopped {
                // Its container stopped: no holder outlives it.
                holders.clear();
            }
            let held = holders.len() as u64 * GIB;
            let over_before =
                reading[0].processes.as_ref().map_or(0, Vec::len) as u64 * GIB > 2 * GIB;
            if over_before && first_over.is_none() {
                first_over = Some(now);
            }
            if let Some(t) = first_over {
                if back_under.is_none() && held <= 2 * GIB {
                    back_under = Some(now);
                    assert!(
                        now - t <= grace + interval,
                        "back under {:?} after going over",
                        now - t
                    );
                }
            }
            if back_under.is_some() {
                assert!(
                    held <= 2 * GIB,
                    "tick {tick}: {held} bytes held after the first action; events {:?}",
                    out.events
                );
            }
        }
        assert!(back_under.is_some(), "never brought under");
        assert!(stopped, "the repeat offender's container was stopped");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Over random per-process figures on two GPUs shared by three slices and two
        /// unowned processes: every kill hits a process of a slice that, on a GPU where the
        /// process holds memory, was over its limit at that reading and had been over
        /// since at least `grace` before (or its container stopped by an escalation);
        /// unowned processes are never killed; a killed process is gone from later
        /// readings, as it is from the driver's. And every slice over its limit for the
        /// whole grace is acted on at that reading, also when the processes taking it over
        /// run in a pid namespace of their own.
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
            let (roots, file, sys) = node(dir.path(), &limits);
            let kills = Kills::default();
            let cfg = EnforceConfig {
                grace: Duration::from_millis(grace_ms),
                ..EnforceConfig::default()
            };
            let mut e = Enforcer::new(cfg, roots, Box::new(Recorder(kills.clone())), Throttles::default())
                .with_system(sys);
            let pids = all_pids();
            let mut dead: HashSet<u32> = HashSet::new();
            let mut over_since: HashMap<(usize, usize), Instant> = HashMap::new();
            let mut acted: HashMap<(usize, usize), Instant> = HashMap::new();
            let mut now = Instant::now();
            for (dt, figures) in steps {
                now += Duration::from_millis(dt);
                let mut gpus: Vec<Vec<GpuProcess>> = vec![Vec::new(); GPUS];
                // (slice, GPU) → bytes its live processes hold this reading.
                let mut totals: HashMap<(usize, usize), u64> = HashMap::new();
                for (i, used) in figures.iter().enumerate() {
                    let (g, (owner, pid)) = (i % GPUS, pids[i / GPUS]);
                    let Some(used) = *used else { continue };
                    if dead.contains(&pid) {
                        continue;
                    }
                    gpus[g].push(GpuProcess { pid, used: Some(used), sm: Some(1) });
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
                let reading: Vec<DeviceReading> =
                    gpus.iter().enumerate().map(|(g, p)| listed(uuid(g), p.clone())).collect();
                let out = e.cycle(&file, &reading, now);
                let new: Vec<u32> = kills.lock().unwrap()[before..].to_vec();
                let escalated: HashSet<String> = out
                    .events
                    .iter()
                    .filter(|e| e.kind == EventKind::MemoryEscalation)
                    .map(|e| e.reservation.clone())
                    .collect();
                // The processes the judge killed: each a MemoryKill event's.
                let judged: HashSet<u32> = out
                    .events
                    .iter()
                    .filter(|e| e.kind == EventKind::MemoryKill)
                    .map(|e| e.pid)
                    .collect();
                for pid in &judged {
                    prop_assert!(new.contains(pid), "event for {pid} without its kill");
                }
                for pid in &new {
                    let owner = pids.iter().find(|(_, p)| p == pid).and_then(|(o, _)| *o)
                        .or_else(|| (0..SLICES).find(|s| init_pid(*s) == *pid));
                    prop_assert!(owner.is_some(), "killed unowned process {pid}");
                    let s = owner.unwrap_or_default();
                    if !judged.contains(pid) {
                        // An escalation stops the slice's container: every process in its
                        // recorded cgroup, its init included.
                        prop_assert!(escalated.contains(&format!("{s:016x}")), "{pid} of {s} killed");
                        dead.insert(*pid);
                        continue;
                    }
                    let justified = (0..GPUS).any(|g| {
                        let holds = gpus[g].iter().any(|p| p.pid == *pid && p.used > Some(0));
                        let over = totals.get(&(s, g)).copied().unwrap_or(0) > limits[s][g];
                        let long = over_since
                            .get(&(s, g))
                            .is_some_and(|t| now.duration_since(*t) >= Duration::from_millis(grace_ms));
                        let again = acted
                            .get(&(s, g))
                            .is_some_and(|t| now.duration_since(*t) <= REPEAT_WINDOW);
                        holds && over && (long || again)
                    });
                    prop_assert!(
                        justified,
                        "killed {pid} of slice {s}: totals {totals:?}, limits {:?}, over since {over_since:?}",
                        limits[s]
                    );
                    dead.insert(*pid);
                }
                // And no slice escapes: one over its limit for the whole grace (or again
                // within the repeat window of an action) is acted on at this reading, whatever
                // pid namespace its processes run in.
                for (s, limit) in limits.iter().enumerate() {
                    for (g, limit) in limit.iter().enumerate() {
                        let over = totals.get(&(s, g)).copied().unwrap_or(0) > *limit;
                        let long = over_since
                            .get(&(s, g))
                            .is_some_and(|t| now.duration_since(*t) >= Duration::from_millis(grace_ms));
                        let again = acted
                            .get(&(s, g))
                            .is_some_and(|t| now.duration_since(*t) <= REPEAT_WINDOW);
                        let hit = out.events.iter().any(|e| {
                            e.kind == EventKind::MemoryKill
                                && e.reservation == format!("{s:016x}")
                                && e.uuid == uuid(g)
                        });
                        prop_assert!(
                            !(over && (long || again)) || hit,
                            "slice {s} over {limit} on GPU {g} since {:?} not acted on: totals {totals:?}; events {:?}",
                            over_since.get(&(s, g)),
                            out.events
                        );
                    }
                }
                // One action leaves each slice it hit at or under its limit on that GPU.
                let mut freed: HashMap<(String, String), (u64, u64, u64)> = HashMap::new();
                for ev in out.events.iter().filter(|e| e.kind == EventKind::MemoryKill) {
                    let f = freed
                        .entry((ev.reservation.clone(), ev.uuid.clone()))
                        .or_insert((ev.slice_bytes.unwrap_or(0), ev.limit_bytes.unwrap_or(0), 0));
                    f.2 += ev.process_bytes.unwrap_or(0);
                }
                for ((r, u), (total, limit, gone)) in &freed {
                    prop_assert!(total - gone <= *limit, "{r} on {u}: {total} - {gone} > {limit}");
                    let s = usize::from_str_radix(r, 16).unwrap_or(0);
                    let g = (0..GPUS).find(|g| uuid(*g) == *u).unwrap_or(0);
                    acted.insert((s, g), now);
                    over_since.remove(&(s, g));
                }
            }
        }
    }

    /// Signals as [`crate::enforce::signal::ProcSignaller`] does on a fixture `/proc`,
    /// except that a kill is recorded instead of sent; and pid `reused` is taken over by a
    /// new process (start time 99) just before the first signal is asked for, i.e. after
    /// the cycle attributed it.
    struct ReusingProc {
        proc: crate::enforce::signal::ProcSignaller,
        root: PathBuf,
        reused: u32,
        done: std::sync::atomic::AtomicBool,
        kills: Kills,
    }

    impl ReusingProc {
        fn reuse(&self) {
            if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                write_stat(&self.root, self.reused, 99);
            }
        }
    }

    impl Signaller for ReusingProc {
        fn start_time(&self, pid: u32) -> Option<u64> {
            self.reuse();
            self.proc.start_time(pid)
        }
        fn kill(
            &mut self,
            pid: u32,
            start: u64,
        ) -> Result<(), crate::enforce::signal::SignalError> {
            self.reuse();
            let found = self.proc.start_time(pid).unwrap_or(0);
            if found != start {
                return Err(crate::enforce::signal::SignalError::Reused {
                    pid,
                    expected: start,
                    found,
                });
            }
            self.kills.lock().unwrap().push(pid);
            Ok(())
        }
    }

    /// `<root>/<pid>/stat` with start time `start`.
    fn write_stat(root: &Path, pid: u32, start: u64) {
        std::fs::write(
            root.join(pid.to_string()).join("stat"),
            format!("{pid} (burn) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 10"),
        )
        .unwrap();
    }

    /// The enforcer reads everything from a fixture `/proc` and cgroup tree (no fake system):
    /// a process over its slice's limit whose pid is taken over by another process between
    /// its attribution and the kill is not killed; the kill names the reuse.
    #[test]
    fn a_pid_reused_after_attribution_is_not_killed() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let cgroup_root = dir.path().join("cgroup");
        fake_process(&proc_root, 1, HOST_NS, 1, "0::/\n");
        std::os::unix::fs::symlink("1", proc_root.join("self")).unwrap();
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "fake-boot-0\n").unwrap();
        let ns = 4026540700;
        fake_process(&proc_root, 700, ns, 1, "0::/ctr\n");
        write_stat(&proc_root, 700, 1);
        fake_process(&proc_root, 701, ns, 2, "0::/ctr\n");
        write_stat(&proc_root, 701, 5);
        std::fs::create_dir_all(cgroup_root.join("ctr")).unwrap();
        std::fs::write(cgroup_root.join("ctr/cgroup.procs"), "700\n701\n").unwrap();
        let file = RegistryFile {
            reservations: vec![serde_json::from_value(serde_json::json!({
                "id": "0000000000000007", "state": "bound",
                "owner": {"kind": "container", "container_id": "ctr",
                    "process": {"pid": 700, "start_time": 1, "boot_id": "fake-boot-0",
                        "cgroup": "ctr"}},
                "gpus": [{"index": 0, "uuid": uuid(0), "memory": 4, "cores": 0}],
                "created_ms": 0, "bound_ms": 0,
            }))
            .unwrap()],
            ..RegistryFile::default()
        };
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let roots = Roots {
            state_dir,
            proc_root: proc_root.clone(),
            cgroup_root,
        };
        let kills = Kills::default();
        let signaller = ReusingProc {
            proc: crate::enforce::signal::ProcSignaller::new(&proc_root),
            root: proc_root.clone(),
            reused: 701,
            done: std::sync::atomic::AtomicBool::new(true),
            kills: kills.clone(),
        };
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(signaller),
            Throttles::default(),
        );
        let t0 = Instant::now();
        let over = on_gpu0(&[(701, 8)]);
        assert!(e.cycle(&file, &over, t0).events.is_empty(), "within grace");
        // Armed for the cycle that acts: the pid is reused once that cycle attributed it.
        e.signaller = Box::new(ReusingProc {
            proc: crate::enforce::signal::ProcSignaller::new(&proc_root),
            root: proc_root.clone(),
            reused: 701,
            done: std::sync::atomic::AtomicBool::new(false),
            kills: kills.clone(),
        });
        let out = e.cycle(&file, &over, t0 + Duration::from_secs(3));
        assert!(
            kills.lock().unwrap().is_empty(),
            "the new process was killed"
        );
        let report = out
            .events
            .iter()
            .find(|e| e.kind == EventKind::MemoryReport && e.pid == 701)
            .unwrap_or_else(|| panic!("no report of pid 701: {:?}", out.events));
        let error = report.error.as_deref().unwrap_or_default();
        assert!(
            error.contains("replaced by another") && error.contains("judged 5"),
            "{error}"
        );
    }

    /// With `compute = "throttle"`, a slice over its share is frozen only in a cgroup
    /// recorded for its containers: a container without a cgroup of its own (podman
    /// `--cgroups=disabled`: its init shared the session scope at bind, so the hook recorded
    /// none) is attributed by its pid namespace, and its process is reported (naming the
    /// pid and the cgroup), never frozen with the whole session scope; a container with a
    /// recorded cgroup beside it is frozen as before.
    #[test]
    fn throttling_never_freezes_a_cgroup_not_recorded_for_the_slice() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, mut file, sys) = node(dir.path(), &[[100, 100]; SLICES]);
        let shared = "user.slice/user-0.slice/session-1.scope";
        let ns = 4026549100;
        fake_process(&roots.proc_root, 900, ns, 1, &format!("0::/{shared}\n"));
        fake_process(&roots.proc_root, 901, ns, 2, &format!("0::/{shared}\n"));
        for pid in [900, 901] {
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, shared);
        }
        // Beside it, a container whose cgroup `own` was recorded at bind.
        fake_process(&roots.proc_root, 910, ns + 1, 1, "0::/own\n");
        fake_process(&roots.proc_root, 911, ns + 1, 2, "0::/own\n");
        for pid in [910, 911] {
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, "own");
        }
        for (cgroup, procs) in [(shared, "900\n901\n950\n"), ("own", "910\n911\n")] {
            let dir = roots.cgroup_root.join(cgroup);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.freeze"), "0").unwrap();
            std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
        }
        for (id, container, process) in [
            (
                "00000000000000dd",
                "nocg",
                serde_json::json!({"pid": 900, "start_time": 1, "boot_id": "fake-boot-0"}),
            ),
            (
                "00000000000000de",
                "own",
                serde_json::json!({"pid": 910, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": "own"}),
            ),
        ] {
            let r = serde_json::json!({
                "id": id, "state": "bound",
                "owner": {"kind": "container", "container_id": container, "process": process},
                "gpus": [{"index": 0, "uuid": uuid(0), "memory": 100, "cores": 30}],
                "created_ms": 0, "bound_ms": 0,
            });
            file.reservations.push(serde_json::from_value(r).unwrap());
        }
        let throttles = Throttles::default();
        let mut e = Enforcer::new(
            EnforceConfig {
                compute: ComputeAction::Throttle,
                ..EnforceConfig::default()
            },
            roots.clone(),
            Box::new(Recorder(Kills::default())),
            throttles.clone(),
        )
        .with_system(sys);
        let t0 = Instant::now();
        let mut events = Vec::new();
        let mut throttled = Vec::new();
        for i in 0..4u32 {
            let busy = |pid| GpuProcess {
                pid,
                used: Some(1),
                sm: Some(45),
            };
            let reading = vec![listed(uuid(0), vec![busy(901), busy(911)])];
            let out = e.cycle(&file, &reading, t0 + Duration::from_millis(500) * i);
            events.extend(out.events);
            throttled = out.throttled;
        }
        let held: Vec<FreezerFile> = throttles.lock().unwrap().keys().cloned().collect();
        let freeze = |c: &str| FreezerFile::V2(roots.cgroup_root.join(c).join("cgroup.freeze"));
        assert_eq!(
            held,
            vec![freeze("own")],
            "the shared session scope is held"
        );
        assert_eq!(
            throttled.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
            ["00000000000000de"]
        );
        let reports: Vec<&Event> = events
            .iter()
            .filter(|e| e.kind == EventKind::ComputeReport && e.pid == 901)
            .filter(|e| {
                e.error
                    .as_deref()
                    .is_some_and(|x| x.contains("not throttled"))
            })
            .collect();
        assert_eq!(reports.len(), 1, "reported once: {events:?}");
        assert_eq!(reports[0].reservation, "00000000000000dd");
        assert!(reports[0].line().contains(shared), "{}", reports[0].line());
    }

    /// A node whose container `own` (init 910, GPU process 911, cgroup `own` recorded at
    /// bind) holds a 30-core slice of GPU 0, and an enforcer with `compute = "throttle"`:
    /// the enforcer, its duty-cycle plan and the container's freezer file.
    fn throttled_own(dir: &Path) -> (Enforcer, Throttles, FreezerFile, RegistryFile) {
        let (roots, mut file, sys) = node(dir, &[[100, 100]; SLICES]);
        fake_process(&roots.proc_root, 910, 4026549200, 1, "0::/own\n");
        fake_process(&roots.proc_root, 911, 4026549200, 2, "0::/own\n");
        for pid in [910, 911] {
            sys.spawn(pid, 1);
            sys.set_cgroup(pid, "own");
        }
        let cg = roots.cgroup_root.join("own");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.freeze"), "0").unwrap();
        std::fs::write(cg.join("cgroup.procs"), "910\n911\n").unwrap();
        let r = serde_json::json!({
            "id": "00000000000000de", "state": "bound",
            "owner": {"kind": "container", "container_id": "own",
                "process": {"pid": 910, "start_time": 1, "boot_id": "fake-boot-0", "cgroup": "own"}},
            "gpus": [{"index": 0, "uuid": uuid(0), "memory": 100, "cores": 30}],
            "created_ms": 0, "bound_ms": 0,
        });
        file.reservations.push(serde_json::from_value(r).unwrap());
        let throttles = Throttles::default();
        let e = Enforcer::new(
            EnforceConfig {
                compute: ComputeAction::Throttle,
                ..EnforceConfig::default()
            },
            roots,
            Box::new(Recorder(Kills::default())),
            throttles.clone(),
        )
        .with_system(sys);
        (
            e,
            throttles,
            FreezerFile::V2(cg.join("cgroup.freeze")),
            file,
        )
    }

    /// GPU 0 listing process 911 (of [`throttled_own`]'s container) at SM figure `sm`.
    fn own_at(sm: Option<u32>) -> Vec<DeviceReading> {
        vec![listed(
            uuid(0),
            vec![GpuProcess {
                pid: 911,
                used: Some(1),
                sm,
            }],
        )]
    }

    /// A slice under a duty cycle stays under it through a reading without a per-process
    /// figure (the driver's read failed: `sm` is `None` for all), at the run fraction it had,
    /// and no event is made of it; readings that say it is idle (0 %, what the meter reports
    /// for a listed process with no recent sample) are judged: they enter its window and the
    /// controller lets it run again.
    #[test]
    fn a_throttled_slice_stays_throttled_through_a_reading_without_figures() {
        let dir = tempfile::tempdir().unwrap();
        let (mut e, throttles, freeze, file) = throttled_own(dir.path());
        let t0 = Instant::now();
        let tick = Duration::from_millis(500);
        for i in 0..4u32 {
            e.cycle(&file, &own_at(Some(95)), t0 + tick * i);
        }
        let run = throttles.lock().unwrap().get(&freeze).copied();
        assert!(run.is_some_and(|r| r < 1.0), "throttled: {run:?}");
        let out = e.cycle(&file, &own_at(None), t0 + tick * 4);
        assert_eq!(
            throttles.lock().unwrap().get(&freeze).copied(),
            run,
            "held through a reading without figures"
        );
        assert_eq!(out.throttled.len(), 1, "{:?}", out.throttled);
        assert!(out.events.is_empty(), "{:?}", out.events);
        // Idle readings are judged: the slice wants less than its share and runs free.
        let out = e.cycle(&file, &own_at(Some(0)), t0 + tick * 5);
        assert!(throttles.lock().unwrap().is_empty(), "{:?}", throttles);
        assert!(out.throttled.is_empty());
        let key = ("00000000000000de".to_string(), uuid(0));
        let average = e.compute.get(&key).map(|t| t.average());
        assert!(
            average.is_some_and(|a| a < 0.95 * 4.0 / 5.0 + 1e-9),
            "the zero entered the window: {average:?}"
        );
    }

    /// A slice under a duty cycle stays under it, at the run fraction it had, through a
    /// cycle whose reading of its GPU has no process list (the driver's listing failed — a
    /// tenant can make it fail by opening contexts faster than the list is sized): it is
    /// not thawed, its controller is not reset, and no event is made of it.
    #[test]
    fn a_throttled_slice_stays_throttled_through_a_gpu_the_driver_would_not_list() {
        let dir = tempfile::tempdir().unwrap();
        let (mut e, throttles, freeze, file) = throttled_own(dir.path());
        let t0 = Instant::now();
        let tick = Duration::from_millis(500);
        for i in 0..4u32 {
            e.cycle(&file, &own_at(Some(95)), t0 + tick * i);
        }
        let run = throttles.lock().unwrap().get(&freeze).copied();
        assert!(run.is_some_and(|r| r < 1.0), "throttled: {run:?}");
        let unlisted = vec![DeviceReading {
            uuid: uuid(0),
            processes: None,
            ..Default::default()
        }];
        let out = e.cycle(&file, &unlisted, t0 + tick * 4);
        assert_eq!(
            throttles.lock().unwrap().get(&freeze).copied(),
            run,
            "held through a GPU whose processes were not listed"
        );
        assert_eq!(
            out.throttled,
            vec![("00000000000000de".to_string(), uuid(0), run.unwrap_or(1.0))]
        );
        assert!(out.events.is_empty(), "{:?}", out.events);
        // Listed again, still busy: the same episode goes on (no new throttle event).
        let out = e.cycle(&file, &own_at(Some(95)), t0 + tick * 5);
        assert!(
            throttles.lock().unwrap().contains_key(&freeze),
            "{throttles:?}"
        );
        assert!(out.events.is_empty(), "{:?}", out.events);
    }

    /// A GPU missing from the reading (its handle could not be read — fallen off the bus —
    /// or the GPUs could not be counted) holds nothing: a throttled slice on it is thawed at
    /// once, and its controller forgotten.
    #[test]
    fn a_throttled_slice_is_thawed_when_its_gpu_is_missing_from_the_reading() {
        for missing in [vec![], vec![listed(uuid(1), vec![])]] {
            let dir = tempfile::tempdir().unwrap();
            let (mut e, throttles, freeze, file) = throttled_own(dir.path());
            let t0 = Instant::now();
            let tick = Duration::from_millis(500);
            for i in 0..4u32 {
                e.cycle(&file, &own_at(Some(95)), t0 + tick * i);
            }
            assert!(throttles.lock().unwrap().contains_key(&freeze), "throttled");
            let out = e.cycle(&file, &missing, t0 + tick * 4);
            assert!(throttles.lock().unwrap().is_empty(), "{throttles:?}");
            assert!(out.throttled.is_empty(), "{:?}", out.throttled);
            assert!(e.compute.is_empty() && e.frozen.is_empty());
        }
    }

    /// A GPU read without a process list, cycle after cycle, holds its throttled slice for
    /// `enforce.window` (5 s) at most: held through the unlisted cycles before it, thawed at
    /// the first one past it, with one error line, its controller kept for when the GPU is
    /// listed again.
    #[test]
    fn a_gpu_the_driver_keeps_not_listing_holds_its_throttle_for_a_window_at_most() {
        let dir = tempfile::tempdir().unwrap();
        let (mut e, throttles, freeze, file) = throttled_own(dir.path());
        let t0 = Instant::now();
        let tick = Duration::from_millis(500);
        for i in 0..4u32 {
            e.cycle(&file, &own_at(Some(95)), t0 + tick * i);
        }
        let run = throttles.lock().unwrap().get(&freeze).copied();
        assert!(run.is_some_and(|r| r < 1.0), "throttled: {run:?}");
        let unlisted = vec![DeviceReading {
            uuid: uuid(0),
            processes: None,
            ..Default::default()
        }];
        // Unlisted from 2 s: held at 2, 2.5, ... 6.5 s (under 5 s since the first).
        for i in 4..14u32 {
            let out = e.cycle(&file, &unlisted, t0 + tick * i);
            assert_eq!(
                throttles.lock().unwrap().get(&freeze).copied(),
                run,
                "held at cycle {i}"
            );
            assert!(out.errors.is_empty(), "{:?}", out.errors);
        }
        let out = e.cycle(&file, &unlisted, t0 + tick * 14);
        assert!(throttles.lock().unwrap().is_empty(), "{throttles:?}");
        assert!(out.throttled.is_empty(), "{:?}", out.throttled);
        assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
        assert!(e.frozen.is_empty());
        // Thawed, not forgotten: failing the listing restarts no controller.
        assert!(!e.compute.is_empty() && !e.memory.is_empty());
        for i in 15..20u32 {
            let out = e.cycle(&file, &unlisted, t0 + tick * i);
            assert!(throttles.lock().unwrap().is_empty(), "{throttles:?}");
            assert!(out.errors.is_empty(), "{:?}", out.errors);
        }
        // Listed again, still busy: its kept controller throttles it at once (a new duty
        // cycle, reported as such: it had been thawed).
        e.cycle(&file, &own_at(Some(95)), t0 + tick * 20);
        let again = throttles.lock().unwrap().get(&freeze).copied();
        assert!(
            again.is_some_and(|r| r < 1.0),
            "throttled at once: {again:?}"
        );
    }

    /// A slice over its memory limit keeps its grace clock through a cycle whose reading of
    /// its GPU has no process list: over at 0, 0.5 and 1 s, unlisted at 1.5 s, listed over
    /// again at 2 s, it is acted on once its 2 s grace has passed, not a grace after the
    /// listing came back.
    #[test]
    fn a_gpu_the_driver_would_not_list_keeps_its_slices_grace_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, file, sys) = node(dir.path(), &[[4, 100], [4, 100], [4, 100]]);
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig {
                grace: Duration::from_secs(2),
                ..EnforceConfig::default()
            },
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let over = on_gpu0(&[(pid_of(0, 0), 6)]);
        let unlisted = vec![DeviceReading {
            uuid: uuid(0),
            processes: None,
            ..Default::default()
        }];
        let t0 = Instant::now();
        let mut events = Vec::new();
        for (ms, reading) in [
            (0, &over),
            (500, &over),
            (1000, &over),
            (1500, &unlisted),
            (2000, &over),
            (2500, &over),
        ] {
            let out = e.cycle(&file, reading, t0 + Duration::from_millis(ms));
            events.extend(out.events);
        }
        assert!(
            events.iter().any(|e| e.kind == EventKind::MemoryKill),
            "{events:?}"
        );
        assert_eq!(*kills.lock().unwrap(), vec![pid_of(0, 0)]);
    }

    /// With `memory = "report"`, a slice that stays over its limit is reported once for the
    /// episode, never escalated (nothing was done that could have failed); back under its
    /// limit and over again for a grace, it is reported again.
    #[test]
    fn report_mode_reports_an_episode_once_and_never_escalates() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, file, sys) = node(dir.path(), &[[4, 100], [4, 100], [4, 100]]);
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig {
                memory: MemoryAction::Report,
                ..EnforceConfig::default()
            },
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let over = on_gpu0(&[(pid_of(0, 0), 6)]);
        let under = on_gpu0(&[(pid_of(0, 0), 3)]);
        let t0 = Instant::now();
        let tick = Duration::from_millis(500);
        // (cycle, event kind) of every event.
        let mut events: Vec<(usize, EventKind)> = Vec::new();
        let mut readings: Vec<&Vec<DeviceReading>> = vec![&over; 20];
        readings.push(&under);
        readings.extend(vec![&over; 10]);
        for (i, reading) in readings.into_iter().enumerate() {
            let out = e.cycle(&file, reading, t0 + tick * i as u32);
            events.extend(out.events.iter().map(|e| (i, e.kind)));
        }
        assert!(kills.lock().unwrap().is_empty());
        assert!(
            events
                .iter()
                .all(|(_, k)| *k != EventKind::MemoryEscalation),
            "{events:?}"
        );
        // Over from cycle 0, reported once its 2 s grace passed (cycle 4) and not again
        // while it stayed over; under at cycle 20, over from 21: reported again at 25.
        assert_eq!(
            events,
            vec![(4, EventKind::MemoryReport), (25, EventKind::MemoryReport)]
        );
    }

    /// The process killed at one cycle is still listed by the driver at the next ones, with
    /// its memory (a real driver tears its contexts down for longer than an interval): it is
    /// not killed or counted again, and its slice is not escalated for it; listed past
    /// `DYING` it counts again, and the slice over again is escalated.
    #[test]
    fn a_killed_process_the_driver_still_lists_is_not_escalated_or_killed_again() {
        use crate::enforce::memory::DYING;
        let dir = tempfile::tempdir().unwrap();
        let (roots, file, sys) = node(dir.path(), &[[4, 100], [4, 100], [4, 100]]);
        let kills = Kills::default();
        let mut e = Enforcer::new(
            EnforceConfig::default(),
            roots,
            Box::new(Recorder(kills.clone())),
            Throttles::default(),
        )
        .with_system(sys);
        let reading = on_gpu0(&[(pid_of(0, 0), 3), (pid_of(0, 1), 3)]);
        let t0 = Instant::now();
        let acted = t0 + Duration::from_millis(2500);
        e.cycle(&file, &reading, t0);
        e.cycle(&file, &reading, acted);
        assert_eq!(kills.lock().unwrap().len(), 1);
        // The next intervals: the driver still lists the dying process with its memory.
        let mut events = Vec::new();
        for ms in (500..=5000).step_by(500) {
            let out = e.cycle(&file, &reading, acted + Duration::from_millis(ms));
            events.extend(out.events);
        }
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(kills.lock().unwrap().len(), 1, "killed again");
        // Still listed past DYING: it is the slice's again, and the slice over again within
        // the repeat window is escalated.
        let out = e.cycle(&file, &reading, acted + DYING + Duration::from_millis(500));
        assert!(
            out.events
                .iter()
                .any(|e| e.kind == EventKind::MemoryEscalation),
            "{:?}",
            out.events
        );
    }
}

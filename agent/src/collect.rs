//! One scrape's collection: `registry.json` read without the lock (it is replaced
//! atomically, and the exporter must never slow the create path), each live reservation's
//! `limits.json` and `usage` file, and the agent's one GPU meter (`gpu`, NVML). The live
//! reservations and the owners of NVML's processes are the enforcer's own (`attribution`:
//! host facts only). Whatever cannot be read is left out and counted by source; collection
//! itself never fails.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_registry::{
    gpu_loads, read_registry, Owner, RefusalReason, RegistryFile, Reservation, ReservationState,
    System, SLICES_DIR,
};
use gpuslice_slice::usage::{read_snapshot, UsageSnapshot};
use gpuslice_slice::{Limits, LIMITS_FILE, USAGE_FILE};

use crate::attribution::{attributed, Attribution, Owned};
use crate::errors::{ErrorLog, Source};
use crate::gpu::{DeviceReading, GpuMeter, GpuProcess, Reading};
use crate::liveness::OwnerCheck;
use crate::model::{GpuSample, OwnerLabels, RegistryHealth, Scrape, SliceSample};
use crate::procmap::ProcFs;
use crate::share::ShareTracker;

/// Opens the GPU meter again after it failed (NVML may load after the exporter starts).
pub type MeterOpener = Box<dyn FnMut() -> Result<Box<dyn GpuMeter>, crate::gpu::MeterError> + Send>;

/// How long to wait before trying to open an unavailable meter again.
pub const METER_RETRY: Duration = Duration::from_secs(60);

/// Where the collector reads from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The node's state directory (`registry.json`, `slices/`).
    pub state_dir: PathBuf,
    /// Normally `/proc`.
    pub proc_root: PathBuf,
    /// The `node` label.
    pub node: String,
}

/// Collects scrapes; keeps what must outlive one (share baselines, limits, error counts).
pub struct Collector {
    sources: Sources,
    proc: ProcFs,
    owners: OwnerCheck,
    meter: Option<Box<dyn GpuMeter>>,
    reopen: Option<MeterOpener>,
    last_open: Option<Instant>,
    /// Reservation id → device UUIDs in `limits.json` order (usage device `i`).
    limits: HashMap<String, Vec<String>>,
    shares: ShareTracker<(String, usize)>,
    errors: ErrorLog,
    enforcer: Option<crate::enforce::events::Shared>,
}

/// The owner as labels; a DRA claim shows its namespace and no pod.
fn owner_labels(owner: &Owner) -> OwnerLabels {
    match owner {
        Owner::Container {
            container_id,
            kubernetes,
            ..
        } => OwnerLabels {
            container_id: container_id.clone().unwrap_or_default(),
            namespace: kubernetes
                .as_ref()
                .map(|k| k.namespace.clone())
                .unwrap_or_default(),
            pod: kubernetes
                .as_ref()
                .map(|k| k.pod.clone())
                .unwrap_or_default(),
            container: kubernetes
                .as_ref()
                .map(|k| k.container.clone())
                .unwrap_or_default(),
        },
        Owner::DraClaim { namespace, .. } => OwnerLabels {
            namespace: namespace.clone(),
            ..OwnerLabels::default()
        },
    }
}

impl Collector {
    pub fn new(
        sources: Sources,
        system: Arc<dyn System>,
        meter: Option<Box<dyn GpuMeter>>,
        errors: ErrorLog,
    ) -> Collector {
        Collector {
            proc: ProcFs::new(sources.proc_root.clone()),
            sources,
            owners: OwnerCheck::new(system),
            meter,
            reopen: None,
            last_open: None,
            limits: HashMap::new(),
            shares: ShareTracker::default(),
            errors,
            enforcer: None,
        }
    }

    /// Tries `opener` again, at most every [`METER_RETRY`], while there is no meter.
    pub fn with_reopen(mut self, opener: MeterOpener, now: Instant) -> Collector {
        self.reopen = Some(opener);
        self.last_open = Some(now);
        self
    }

    /// Shows the enforcer's state in every scrape.
    pub fn with_enforcer(mut self, shared: crate::enforce::events::Shared) -> Collector {
        self.enforcer = Some(shared);
        self
    }

    pub fn errors(&self) -> &ErrorLog {
        &self.errors
    }

    /// Counts an error found outside collection (the meter failing to open at start).
    pub fn record_error(&mut self, source: Source, message: impl std::fmt::Display) {
        self.errors.record(source, message);
    }

    fn slice_file(&self, id: &str, name: &str) -> PathBuf {
        self.sources.state_dir.join(SLICES_DIR).join(id).join(name)
    }

    /// Reads the registry and collects one scrape.
    pub fn collect(&mut self, now: Instant) -> Scrape {
        let started = Instant::now();
        let file = match read_registry(&self.sources.state_dir) {
            Ok(f) => Some(f),
            Err(e) => {
                self.errors.record(Source::Registry, e);
                None
            }
        };
        let mut scrape = self.collect_from(file.as_ref(), now);
        scrape.enforcer = self
            .enforcer
            .as_ref()
            .map(|s| crate::enforce::events::lock(s).clone());
        scrape.collect_seconds = started.elapsed().as_secs_f64();
        scrape
    }

    fn read_meter(&mut self, now: Instant) -> Option<Reading> {
        if self.meter.is_none() {
            let due = self
                .last_open
                .is_none_or(|t| now.saturating_duration_since(t) >= METER_RETRY);
            if let (true, Some(open)) = (due, self.reopen.as_mut()) {
                self.last_open = Some(now);
                match open() {
                    Ok(m) => self.meter = Some(m),
                    Err(e) => self.errors.record(Source::Nvml, e),
                }
            }
        }
        let reading = self.meter.as_mut()?.read();
        for e in &reading.errors {
            self.errors.record(Source::Nvml, e);
        }
        Some(reading)
    }

    /// Collects one scrape from an already read registry (`None`: it could not be read).
    pub fn collect_from(&mut self, file: Option<&RegistryFile>, now: Instant) -> Scrape {
        let reading = self.read_meter(now);
        let listed = file.map(|f| f.reservations.as_slice()).unwrap_or_default();
        let set = attributed(&mut self.owners, listed, now);
        let live = set.live;
        let health = file.map(|f| {
            let mut refused_total = f.counters.refused_total.clone();
            // Every reason from the start, so rates work before the first refusal.
            for reason in [
                RefusalReason::NoFit,
                RefusalReason::BadSelector,
                RefusalReason::BadRequest,
                RefusalReason::NoInventory,
                RefusalReason::Unhealthy,
            ] {
                refused_total
                    .entry(reason.as_str().to_string())
                    .or_insert(0);
            }
            let count = |state| live.iter().filter(|r| r.state == state).count() as u64;
            RegistryHealth {
                pending: count(ReservationState::Pending),
                bound: count(ReservationState::Bound),
                stale: set.stale.len() as u64,
                reserved_total: f.counters.reserved_total,
                released_total: f.counters.released_total,
                reaped_total: f.counters.reaped_total,
                refused_total,
            }
        });
        for (_, vanished) in set.stale {
            if let Some(msg) = vanished {
                self.errors.record(Source::Container, msg);
            }
        }

        let mut gpus = self.gpu_samples(file, &live, reading.as_ref());
        self.add_health(&mut gpus);
        let files: Vec<SliceFiles> = live.iter().map(|r| self.slice_files(r)).collect();
        let driver = self.attribute(&live, reading.as_ref());
        let mut slices = Vec::new();
        for (n, (r, f)) in live.iter().zip(&files).enumerate() {
            self.slice_samples(r, f, file, &driver[n], now, &mut slices);
        }

        let keep: HashSet<&str> = live.iter().map(|r| r.id.as_str()).collect();
        self.limits.retain(|id, _| keep.contains(id.as_str()));
        self.shares.retain(|(id, _)| keep.contains(id.as_str()));

        Scrape {
            node: self.sources.node.clone(),
            gpus,
            slices,
            registry: health,
            collect_seconds: 0.0,
            enforcer: None,
        }
    }

    /// Each GPU's health as the health watch recorded it (`health.json`).
    fn add_health(&mut self, gpus: &mut [GpuSample]) {
        let path = self.sources.state_dir.join(gpuslice_config::HEALTH_FILE);
        match gpuslice_driver::health::read_health(&path) {
            Ok(list) => {
                for g in gpus {
                    let sick = gpuslice_driver::health::find(&list, &g.uuid);
                    g.healthy = Some(sick.is_none());
                    g.xid = sick.map(|u| u.xid);
                }
            }
            Err(e) => self.errors.record(Source::Registry, e),
        }
    }

    /// Inventory GPUs with their live bookings, joined with NVML's figures by UUID; GPUs
    /// only NVML knows get the measured figures alone.
    fn gpu_samples(
        &self,
        file: Option<&RegistryFile>,
        live: &[&Reservation],
        reading: Option<&Reading>,
    ) -> Vec<GpuSample> {
        let owned: Vec<Reservation> = live.iter().map(|r| (*r).clone()).collect();
        let loads = gpu_loads(&owned);
        let measured: HashMap<&str, &DeviceReading> = reading
            .map(|r| r.devices.iter().map(|d| (d.uuid.as_str(), d)).collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for g in file
            .map(|f| f.inventory.gpus.as_slice())
            .unwrap_or_default()
        {
            let l = loads.get(g.uuid.as_str()).copied().unwrap_or_default();
            let m = measured.get(g.uuid.as_str());
            seen.insert(g.uuid.as_str());
            out.push(GpuSample {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory_total: Some(g.memory_total),
                memory_booked: Some(l.memory),
                cores_booked: Some(f64::from(l.cores.min(100)) / 100.0),
                slices: Some(l.slices),
                memory_used: m.and_then(|d| d.memory_used),
                utilization: m.and_then(|d| d.utilization),
                ..GpuSample::default()
            });
        }
        for d in reading.map(|r| r.devices.as_slice()).unwrap_or_default() {
            if seen.contains(d.uuid.as_str()) {
                continue;
            }
            out.push(GpuSample {
                index: d.index,
                uuid: d.uuid.clone(),
                model: d.model.clone(),
                memory_total: d.memory_total,
                memory_used: d.memory_used,
                utilization: d.utilization,
                ..GpuSample::default()
            });
        }
        out
    }

    /// The device UUIDs of a slice's `limits.json`, read once per reservation.
    fn limits_uuids(&mut self, id: &str) -> Option<&Vec<String>> {
        if !self.limits.contains_key(id) {
            let path = self.slice_file(id, LIMITS_FILE);
            let limits = std::fs::read(&path)
                .map_err(|e| format!("limits file {}: cannot read: {e}", path.display()))
                .and_then(|b| Limits::from_json(&b, &path).map_err(|e| e.to_string()));
            match limits {
                Ok(l) => {
                    let uuids = l.devices.into_iter().map(|d| d.uuid).collect();
                    self.limits.insert(id.to_string(), uuids);
                }
                Err(e) => {
                    self.errors.record(Source::Limits, e);
                    return None;
                }
            }
        }
        self.limits.get(id)
    }

    /// The limits and usage of a live reservation (none for whole GPUs, which have no
    /// slice files: no shim, nothing to account).
    fn slice_files(&mut self, r: &Reservation) -> SliceFiles {
        if r.whole_gpu {
            return SliceFiles::default();
        }
        let uuids = self.limits_uuids(&r.id).cloned();
        let path = self.slice_file(&r.id, USAGE_FILE);
        let usage = match read_snapshot(&path) {
            Ok(u) => Some(u),
            Err(e) => {
                self.errors.record(Source::Usage, e);
                None
            }
        };
        SliceFiles { uuids, usage }
    }

    /// NVML's per-process figures attributed to each live reservation: for reservation `n`,
    /// by GPU UUID; a GPU whose processes NVML listed is present (possibly 0).
    fn attribute(
        &mut self,
        live: &[&Reservation],
        reading: Option<&Reading>,
    ) -> Vec<HashMap<String, DriverUse>> {
        let mut out: Vec<HashMap<String, DriverUse>> = vec![HashMap::new(); live.len()];
        let Some(reading) = reading else {
            return out;
        };
        let listed: Vec<&DeviceReading> = reading
            .devices
            .iter()
            .filter(|d| d.processes.is_some())
            .collect();
        for (n, r) in live.iter().enumerate() {
            for b in &r.gpus {
                if listed.iter().any(|d| d.uuid == b.uuid) {
                    out[n].insert(b.uuid.clone(), DriverUse::default());
                }
            }
        }
        if listed
            .iter()
            .all(|d| d.processes.as_ref().is_none_or(Vec::is_empty))
        {
            return out;
        }
        let mut errors = Vec::new();
        let mut who = Attribution::new(&self.proc, self.owners.system(), live);
        for d in listed {
            for p in d.processes.iter().flatten() {
                match who.owner_on(p.pid, &d.uuid) {
                    Ok(Owned::By(n)) => {
                        if let Some(sum) = out[n].get_mut(&d.uuid) {
                            sum.add(p);
                        }
                    }
                    Ok(Owned::ElsewhereBy(_) | Owned::Nobody) => {}
                    Err(e) => errors.push(e),
                }
            }
        }
        for e in errors {
            self.errors.record(Source::Proc, e);
        }
        out
    }

    /// The series of one live reservation, one per booked GPU.
    fn slice_samples(
        &mut self,
        r: &Reservation,
        files: &SliceFiles,
        file: Option<&RegistryFile>,
        driver: &HashMap<String, DriverUse>,
        now: Instant,
        out: &mut Vec<SliceSample>,
    ) {
        let owner = owner_labels(&r.owner);
        for b in &r.gpus {
            let index = file
                .and_then(|f| f.inventory.gpu(&b.uuid))
                .map_or(b.index, |g| g.index);
            let device = files
                .uuids
                .as_ref()
                .and_then(|u| u.iter().position(|x| *x == b.uuid));
            let dev_usage = match (&files.usage, device) {
                (Some(u), Some(i)) => u.devices.get(i).map(|d| (i, *d)),
                _ => None,
            };
            let throttled = b.cores > 0 && !r.whole_gpu;
            let compute_limit = if r.whole_gpu {
                Some(1.0)
            } else if throttled {
                Some(f64::from(b.cores) / 100.0)
            } else {
                None
            };
            let (busy_seconds, compute_used) = match dev_usage {
                Some((i, d)) if throttled => (
                    Some(d.busy_ns as f64 / 1e9),
                    self.shares.update(&(r.id.clone(), i), now, d.busy_ns),
                ),
                _ => (None, None),
            };
            out.push(SliceSample {
                reservation: r.id.clone(),
                owner: owner.clone(),
                uuid: b.uuid.clone(),
                index,
                memory_limit: b.memory,
                compute_limit,
                memory_used: dev_usage.map(|(_, d)| d.used),
                nvml_memory_used: driver.get(&b.uuid).map(|d| d.memory),
                nvml_compute_used: driver.get(&b.uuid).and_then(DriverUse::share),
                busy_seconds,
                compute_used,
            });
        }
    }
}

/// What the driver reports for one slice's processes on one GPU.
#[derive(Debug, Clone, Copy, Default)]
struct DriverUse {
    /// Bytes held (processes whose memory the driver would not tell count 0).
    memory: u64,
    /// Summed SM utilisation, percent, of the processes the driver has a figure for.
    sm: u32,
    processes: u32,
    /// Processes without a per-process SM figure.
    sm_unknown: u32,
}

impl DriverUse {
    fn add(&mut self, p: &GpuProcess) {
        self.memory = self.memory.saturating_add(p.used.unwrap_or(0));
        self.processes += 1;
        match p.sm {
            Some(sm) => self.sm = self.sm.saturating_add(sm),
            None => self.sm_unknown += 1,
        }
    }

    /// The compute share of the GPU, 0–1: none when the slice has processes and the driver
    /// gave a figure for none of them (no per-process utilisation on this GPU); no process is
    /// an idle share, as the enforcer judges it.
    fn share(&self) -> Option<f64> {
        if self.processes > 0 && self.sm_unknown == self.processes {
            return None;
        }
        Some((f64::from(self.sm) / 100.0).min(1.0))
    }
}

/// A live slice's files as read this scrape.
#[derive(Debug, Default)]
struct SliceFiles {
    /// Device UUIDs of `limits.json`, in order.
    uuids: Option<Vec<String>>,
    usage: Option<UsageSnapshot>,
}

/// The `node` label: `NODE_NAME` (Kubernetes downward API) when set, else the hostname
/// from `<proc_root>/sys/kernel/hostname`, else `unknown`.
pub fn node_name(proc_root: &Path) -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| {
            std::fs::read_to_string(proc_root.join("sys/kernel/hostname"))
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

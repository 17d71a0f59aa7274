//! The node's GPU health, from the driver's own reports, in one place (`gpuslice serve`):
//! NVML's XID critical events, and each second a probe of every GPU (does it answer, or is
//! it lost — `NVML_ERROR_GPU_IS_LOST`, XID 79 — and what recovery does the driver say it
//! needs, `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`). A fatal XID (every XID but
//! `health.ignored_xids`) marks the GPU unhealthy with the XID and its time in
//! `<state_dir>/health.json` (`gpuslice_driver::health`), which the create path, the kubelet
//! plugin, `status` and the exporter read. The GPU is healthy again only on a recovery the
//! driver shows: it was seen asking for one (a reset, or the GPU lost) after its latest fatal
//! XID and then answers asking for none; after XIDs 63 and 64 a row remapping pending or failed
//! (`nvmlDeviceGetRemappedRows`) counts as asking for a reset. A GPU whose driver never asks
//! (a driver without the recovery field) stays unhealthy until the node reboots or its record
//! is removed; a GPU that does not answer at all never counts as recovered. A record that
//! cannot be read at start is left as it is, never overwritten, until it reads again
//! (docs/troubleshooting.md, "GPU health and XIDs").

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuslice_config::HealthConfig;
use gpuslice_driver::health::{
    now_ms, read_health, read_health_with_recovery, write_health, Unhealthy,
    XID_RECOVERY_ACTION_CHANGED,
};
use gpuslice_driver::simfault::XID_FALLEN_OFF_BUS;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{EventSet, Nvml};
use nvml_wrapper_sys::bindings::NvmlLib;

use crate::gpu::NvmlSource;
use gpuslice_hook::node::NodeContext;

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const RECOVERY_ACTION_FIELD: u32 = 230;
/// How long one wait for an event lasts; the GPUs are probed between waits.
const WAIT: Duration = Duration::from_secs(1);
/// How long the watch waits before opening NVML again after it failed.
const REOPEN: Duration = Duration::from_secs(10);

/// A GPU of the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    pub index: u32,
    pub uuid: String,
}

/// What a probe of one GPU found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// It answers and the driver asks for no recovery.
    Healthy,
    /// It answers, but the driver asks for a reset or a reboot.
    NeedsRecovery,
    /// It answers and asks for no recovery, but a row remapping is pending (applied at the
    /// next reset) or failed (`nvmlDeviceGetRemappedRows`): what follows XIDs 63 and 64.
    /// Keeps a marked GPU out, as a request for a reset; marks none by itself (an operator
    /// who lists 63 in `health.ignored_xids` keeps such GPUs in service).
    RowRemapping,
    /// It answers, and the driver does not say what it needs (a driver without the recovery
    /// field: the query is not supported, or not known to it).
    Unknown,
    /// It has fallen off the bus.
    Lost,
    /// It does not answer: NVML has no handle for it (`NotFound` once the device was unbound
    /// or removed, or another failure) or fails to read it other than as lost or unsupported.
    /// No proof of anything: it marks no GPU, and never counts as a recovery (a GPU must
    /// answer to be healthy again).
    Absent,
}

/// What a failed `nvmlDeviceGetHandleByUUID` of a GPU says: lost (XID 79, the GPU is still
/// there), or no answer at all.
pub fn no_handle(e: &NvmlError) -> Probe {
    match e {
        NvmlError::GpuLost => Probe::Lost,
        _ => Probe::Absent,
    }
}

/// What a failed read of the recovery field of a GPU that has a handle says: lost; a driver
/// that does not have the field (not supported, an unknown field or function); or, for any
/// other failure, no answer.
pub fn no_field(e: &NvmlError) -> Probe {
    match e {
        NvmlError::GpuLost => Probe::Lost,
        NvmlError::NotSupported
        | NvmlError::InvalidArg
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_) => Probe::Unknown,
        _ => Probe::Absent,
    }
}

/// A change of one GPU's health, or an XID that changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Unhealthy(Unhealthy),
    Recovered(Unhealthy),
    /// A marked GPU that is no longer in the inventory: its record is dropped.
    Gone(Unhealthy),
    /// A reported XID that `health.ignored_xids` leaves healthy.
    Ignored {
        gpu: GpuId,
        xid: u32,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Unhealthy(u) => write!(f, "{u}; it is offered to no one new"),
            Change::Recovered(u) => write!(
                f,
                "GPU {} ({}) is healthy again (it was unhealthy from XID {} at {})",
                u.index,
                u.uuid,
                u.xid,
                u.since_text()
            ),
            Change::Gone(u) => write!(
                f,
                "GPU {} ({}) is no longer in the inventory; its record (XID {} at {}) is dropped",
                u.index,
                u.uuid,
                u.xid,
                u.since_text()
            ),
            Change::Ignored { gpu, xid } => write!(
                f,
                "GPU {} ({}): the driver reported XID {xid}, an application error (health.ignored_xids); the GPU stays healthy",
                gpu.index, gpu.uuid
            ),
        }
    }
}

/// The unhealthy GPUs, updated from events and probes.
#[derive(Debug, Clone)]
pub struct Tracker {
    config: HealthConfig,
    list: Vec<Unhealthy>,
}

impl Tracker {
    /// Starts from `list` (what an earlier run recorded).
    pub fn new(config: HealthConfig, list: Vec<Unhealthy>) -> Tracker {
        Tracker { config, list }
    }

    pub fn list(&self) -> &[Unhealthy] {
        &self.list
    }

    /// Takes on the records of `list` for GPUs it does not have yet (a record that could not
    /// be read at start and reads now): a GPU marked in either stays marked.
    pub fn adopt(&mut self, list: Vec<Unhealthy>) {
        for u in list {
            if self.position(&u.uuid).is_none() {
                self.list.push(u);
            }
        }
    }

    fn position(&self, uuid: &str) -> Option<usize> {
        self.list
            .iter()
            .position(|u| u.uuid.eq_ignore_ascii_case(uuid))
    }

    /// Marks `gpu` unhealthy from `xid`; `recovery_seen` when the mark comes from a probe
    /// that found the driver asking for a recovery. A GPU already marked keeps its first
    /// cause, but a new fault on it (any fatal XID but 154, which only announces the
    /// recovery the driver asks for) needs its own recovery: a recovery seen before it no
    /// longer counts, so a reset that came before the new XID, and the recovery field read
    /// as none right after it, do not clear the mark.
    fn mark(&mut self, gpu: &GpuId, xid: u32, now_ms: u64, recovery_seen: bool) -> Option<Change> {
        if let Some(i) = self.position(&gpu.uuid) {
            if xid != XID_RECOVERY_ACTION_CHANGED {
                self.list[i].recovery_seen = false;
            }
            return None;
        }
        let u = Unhealthy {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            xid,
            since_ms: now_ms,
            recovery_seen,
        };
        self.list.push(u.clone());
        Some(Change::Unhealthy(u))
    }

    /// Matches the records to the inventory `gpus` by UUID: each takes its GPU's index now
    /// (a renumbered GPU is refused under its new index, never another GPU under its old
    /// one), and a GPU no longer inventoried is dropped (it is probed no more, so nothing
    /// else would ever remove it). An empty inventory is what a registry not written yet
    /// reads as, which proves no GPU gone: it changes nothing.
    pub fn follow_inventory(&mut self, gpus: &[GpuId]) -> Vec<Change> {
        if gpus.is_empty() {
            return Vec::new();
        }
        let mut gone = Vec::new();
        self.list.retain_mut(|u| {
            match gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(&u.uuid)) {
                Some(g) => {
                    u.index = g.index;
                    true
                }
                None => {
                    gone.push(Change::Gone(u.clone()));
                    false
                }
            }
        });
        gone
    }

    /// The driver reported `xid` on `gpu`. The driver reports every XID, in order, so an
    /// application error often follows a fatal XID of the same GPU: it changes nothing then.
    /// A later fatal XID keeps the first cause but restarts the wait for a recovery
    /// ([`Tracker::mark`]).
    pub fn on_xid(&mut self, gpu: &GpuId, xid: u32, now_ms: u64) -> Option<Change> {
        if !self.config.is_fatal(xid) {
            if self.position(&gpu.uuid).is_some() {
                return None;
            }
            return Some(Change::Ignored {
                gpu: gpu.clone(),
                xid,
            });
        }
        self.mark(gpu, xid, now_ms, false)
    }

    /// A probe of `gpu` found `probe`. A lost GPU is unhealthy with XID 79, and one whose
    /// driver asks for a recovery with XID 154, even when the XID's event was missed (the
    /// agent was not running, its event set was being rebuilt). A marked GPU is healthy
    /// again only after the driver was seen asking for a recovery (a reset, or the GPU lost)
    /// and then asks for none — or, on a driver that does not say, when a GPU that was seen
    /// lost answers again: a recovery field that reads none right after the XID (the driver
    /// needs no reset, or has not updated it yet) does not clear the mark.
    pub fn on_probe(&mut self, gpu: &GpuId, probe: Probe, now_ms: u64) -> Option<Change> {
        let Some(i) = self.position(&gpu.uuid) else {
            return match probe {
                Probe::Lost if self.config.is_fatal(XID_FALLEN_OFF_BUS) => {
                    self.mark(gpu, XID_FALLEN_OFF_BUS, now_ms, true)
                }
                Probe::NeedsRecovery if self.config.is_fatal(XID_RECOVERY_ACTION_CHANGED) => {
                    self.mark(gpu, XID_RECOVERY_ACTION_CHANGED, now_ms, true)
                }
                _ => None,
            };
        };
        let u = &mut self.list[i];
        let recovered = match probe {
            Probe::Lost | Probe::NeedsRecovery | Probe::RowRemapping => {
                u.recovery_seen = true;
                false
            }
            Probe::Healthy => u.recovery_seen,
            Probe::Unknown => u.recovery_seen && u.xid == XID_FALLEN_OFF_BUS,
            // Gone from NVML (unbound after it fell off the bus, say): not an answer.
            Probe::Absent => false,
        };
        recovered.then(|| Change::Recovered(self.list.remove(i)))
    }
}

/// The health record on disk as the watch keeps it: what it last wrote, and whether the
/// record it found at start could be read. One that could not (garbage, or a `version` this
/// build does not know: written by a newer release before a downgrade) is never overwritten:
/// the GPUs it names cannot be told, so it stays as it is, and every node path that reads
/// it (the create path, the kubelet plugin's prepare) refuses new work on every GPU, until
/// an operator restores or removes it.
#[derive(Debug)]
pub struct Record {
    path: PathBuf,
    /// The list last written; `None` before the first write.
    written: Option<Vec<Unhealthy>>,
    /// Why the record found at start cannot be read, while it cannot.
    unreadable: Option<String>,
}

impl Record {
    /// Reads the record at `path` (with the recoveries seen beside it, where that file
    /// reads). Returns the record and the GPUs it lists; an unreadable one lists none and
    /// is logged once, naming the path and what is wrong with it.
    pub fn open(path: &Path) -> (Record, Vec<Unhealthy>) {
        let mut record = Record {
            path: path.to_path_buf(),
            written: None,
            unreadable: None,
        };
        let list = match read_health_with_recovery(path) {
            Ok(list) => list,
            Err(e) => match read_health(path) {
                Ok(list) => {
                    eprintln!("gpuslice serve: health: {e}; starting from health.json alone (no recovery counts as seen)");
                    list
                }
                Err(e) => {
                    eprintln!(
                        "gpuslice serve: health: {e}; left as it is and not written until it reads (restore it, or remove it to record the GPUs' health afresh); until then no new work is given any GPU of this node"
                    );
                    record.unreadable = Some(e.to_string());
                    Vec::new()
                }
            },
        };
        (record, list)
    }

    /// Whether the record found at start is still unreadable (and so left alone).
    pub fn is_unreadable(&self) -> bool {
        self.unreadable.is_some()
    }

    /// Writes `tracker`'s list when it changed. While the record found at start cannot be
    /// read it is read again instead, and written only once it reads (restored, or removed):
    /// the GPUs it then lists join `tracker`'s.
    pub fn sync(&mut self, tracker: &mut Tracker) {
        if self.unreadable.is_some() {
            match read_health(&self.path) {
                Ok(list) => {
                    eprintln!(
                        "gpuslice serve: health: {} reads again; recording the GPUs' health in it",
                        self.path.display()
                    );
                    self.unreadable = None;
                    tracker.adopt(list);
                }
                Err(e) => {
                    let e = e.to_string();
                    if self.unreadable.as_deref() != Some(e.as_str()) {
                        eprintln!("gpuslice serve: health: {e}; left as it is");
                        self.unreadable = Some(e);
                    }
                    return;
                }
            }
        }
        if self.written.as_deref() != Some(tracker.list()) {
            match write_health(&self.path, tracker.list()) {
                Ok(()) => self.written = Some(tracker.list().to_vec()),
                Err(e) => eprintln!("gpuslice serve: health: {e}"),
            }
        }
    }
}

/// The inventory's GPUs (index and UUID); none when the registry cannot be read yet.
fn inventory(state_dir: &Path) -> Vec<GpuId> {
    gpuslice_registry::read_registry(state_dir)
        .map(|f| {
            f.inventory
                .gpus
                .iter()
                .map(|g| GpuId {
                    index: g.index,
                    uuid: g.uuid.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Probes GPU `uuid` through NVML, and its row remapping through `rows` (the same driver
/// library's `nvmlDeviceGetRemappedRows`, which nvml-wrapper does not wrap) where the driver
/// has it.
fn probe(nvml: &Nvml, rows: Option<&NvmlLib>, uuid: &str) -> Probe {
    let dev = match nvml.device_by_uuid(uuid) {
        Ok(d) => d,
        Err(e) => return no_handle(&e),
    };
    let action = match dev.field_values_for(&[FieldId(RECOVERY_ACTION_FIELD)]) {
        Ok(values) => match values.into_iter().next() {
            Some(Ok(FieldValueSample { value: Ok(v), .. })) => match v {
                SampleValue::U32(0) | SampleValue::U64(0) => Probe::Healthy,
                _ => Probe::NeedsRecovery,
            },
            Some(Ok(FieldValueSample { value: Err(e), .. })) | Some(Err(e)) => no_field(&e),
            // Asked for one field, given none: the driver does not have it.
            None => Probe::Unknown,
        },
        Err(e) => no_field(&e),
    };
    if matches!(action, Probe::Lost | Probe::NeedsRecovery | Probe::Absent) {
        return action;
    }
    let Some(get) = rows.and_then(|l| l.nvmlDeviceGetRemappedRows.as_ref().ok()) else {
        return action;
    };
    let (mut corr, mut unc, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: the handle is a live device of the initialised library `rows` is a second
    // handle of (the same loaded object); the four out-pointers point to local integers.
    let ret = unsafe { get(dev.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    if ret == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS
        && (pending != 0 || failed != 0)
    {
        Probe::RowRemapping
    } else {
        action
    }
}

/// An event set with the XID events of `gpus` registered, and the raw handle of each
/// registered GPU (an event names its GPU by handle; a lost GPU cannot be asked its UUID).
/// A GPU whose registration fails is left out.
fn register<'n>(nvml: &'n Nvml, gpus: &[GpuId]) -> Option<(EventSet<'n>, Vec<(usize, GpuId)>)> {
    let mut skip: Vec<&str> = Vec::new();
    'again: loop {
        let mut set = nvml.create_event_set().ok()?;
        let mut handles = Vec::new();
        for g in gpus.iter().filter(|g| !skip.contains(&g.uuid.as_str())) {
            let Ok(dev) = nvml.device_by_uuid(g.uuid.as_str()) else {
                continue;
            };
            let supported = dev
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if !supported {
                continue;
            }
            // SAFETY: the raw handle is only compared with the handles events carry; no
            // second owner of the device is made from it.
            let handle = unsafe { dev.handle() } as usize;
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    handles.push((handle, g.clone()));
                }
                Err(e) => {
                    // The failed registration released the set: start over without it.
                    eprintln!(
                        "gpuslice serve: health: cannot watch the XID events of GPU {} ({}): {e}",
                        g.index, g.uuid
                    );
                    skip.push(&g.uuid);
                    continue 'again;
                }
            }
        }
        return Some((set, handles));
    }
}

/// Watches the driver until the process ends: events, probes, and the health record.
fn watch(
    nvml: &Nvml,
    rows: Option<&NvmlLib>,
    state_dir: &Path,
    record: &mut Record,
    tracker: &mut Tracker,
) {
    let mut events: Option<(EventSet<'_>, Vec<(usize, GpuId)>)> = None;
    let mut registered: Vec<GpuId> = Vec::new();
    loop {
        let gpus = inventory(state_dir);
        let mut changes = tracker.follow_inventory(&gpus);
        let mut reachable = Vec::new();
        for g in &gpus {
            let p = probe(nvml, rows, &g.uuid);
            if !matches!(p, Probe::Lost | Probe::Absent) {
                reachable.push(g.clone());
            }
            changes.extend(tracker.on_probe(g, p, now_ms()));
        }
        if events.is_none() || reachable != registered {
            events = register(nvml, &reachable);
            registered = reachable;
        }
        match &events {
            Some((set, handles)) => match set.wait(WAIT.as_millis() as u32) {
                Ok(e) => {
                    // SAFETY: as in `register`: compared only.
                    let handle = unsafe { e.device.handle() } as usize;
                    let gpu = handles.iter().find(|(h, _)| *h == handle).map(|(_, g)| g);
                    let xid = match e.event_data {
                        Some(XidError::Value(x)) => u32::try_from(x).ok(),
                        _ => None,
                    };
                    if let (Some(gpu), Some(xid)) = (gpu, xid) {
                        changes.extend(tracker.on_xid(gpu, xid, now_ms()));
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    eprintln!("gpuslice serve: health: waiting for XID events: {e}");
                    events = None;
                    std::thread::sleep(WAIT);
                }
            },
            None => std::thread::sleep(WAIT),
        }
        for c in &changes {
            eprintln!("gpuslice serve: health: {c}");
        }
        record.sync(tracker);
    }
}

/// Starts the health watch of `node` on a thread of its own; NVML's environment must have
/// been set (the exporter's collector opens NVML first). It never stops on an error: NVML
/// that cannot be opened is opened again later.
pub fn start(node: &NodeContext) -> std::io::Result<()> {
    let config = node.config();
    let state_dir = config.state_dir.clone();
    let source = NvmlSource::of(config);
    let (mut record, list) = Record::open(&config.health_path());
    let mut tracker = Tracker::new(config.health.clone(), list);
    std::thread::Builder::new()
        .name("gpu-health".into())
        .spawn(move || loop {
            match Nvml::builder().lib_path(source.lib.as_os_str()).init() {
                Ok(nvml) => {
                    // SAFETY: loads the driver library NVML was just initialised from, a
                    // second handle of the same object; only its row-remapping query is
                    // called, with devices of `nvml`.
                    let rows = unsafe { NvmlLib::new(source.lib.as_os_str()) }.ok();
                    watch(&nvml, rows.as_ref(), &state_dir, &mut record, &mut tracker)
                }
                Err(e) => {
                    eprintln!(
                        "gpuslice serve: health: NVML ({}) cannot be initialised: {e}; retrying",
                        source.lib.display()
                    );
                    std::thread::sleep(REOPEN);
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuId {
        GpuId {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
        }
    }

    #[test]
    fn a_fatal_xid_marks_the_gpu_once_and_an_application_error_does_not() {
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        assert!(matches!(
            t.on_xid(&gpu(1), 13, 5),
            Some(Change::Ignored { xid: 13, .. })
        ));
        assert!(t.list().is_empty());
        let Some(Change::Unhealthy(u)) = t.on_xid(&gpu(1), 48, 10) else {
            panic!("48 is fatal");
        };
        assert_eq!((u.index, u.xid, u.since_ms), (1, 48, 10));
        assert_eq!(t.on_xid(&gpu(1), 79, 20), None, "the first cause stays");
        assert_eq!(t.list()[0].xid, 48);
        // An application error after it (the driver delivers both) is not said to leave
        // the GPU healthy.
        assert_eq!(t.on_xid(&gpu(1), 13, 25), None);
        assert_eq!(t.list()[0].xid, 48);
        // While the driver asks for a reset, it stays.
        assert_eq!(t.on_probe(&gpu(1), Probe::NeedsRecovery, 30), None);
        assert_eq!(t.on_probe(&gpu(1), Probe::Unknown, 30), None);
        let Some(Change::Recovered(u)) = t.on_probe(&gpu(1), Probe::Healthy, 40) else {
            panic!("healthy again");
        };
        assert_eq!(u.xid, 48);
        assert!(t.list().is_empty());
    }

    /// XID 48, the driver asks for a reset, the reset, then XID 119 before the next probe:
    /// the recovery field reading none right after the new XID is no recovery from it.
    #[test]
    fn a_new_fatal_xid_on_a_marked_gpu_needs_a_recovery_seen_again() {
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        assert!(matches!(
            t.on_xid(&gpu(1), 48, 10),
            Some(Change::Unhealthy(_))
        ));
        assert_eq!(t.on_probe(&gpu(1), Probe::NeedsRecovery, 11), None);
        assert!(t.list()[0].recovery_seen);
        assert_eq!(t.on_xid(&gpu(1), 119, 12), None);
        assert!(!t.list()[0].recovery_seen, "recorded for the next run");
        assert_eq!(t.on_probe(&gpu(1), Probe::Healthy, 13), None);
        assert_eq!(
            (t.list()[0].xid, t.list()[0].since_ms),
            (48, 10),
            "first cause"
        );
        // The driver asks for a reset for 119, then the reset: healthy again.
        assert_eq!(t.on_probe(&gpu(1), Probe::NeedsRecovery, 14), None);
        let Some(Change::Recovered(u)) = t.on_probe(&gpu(1), Probe::Healthy, 15) else {
            panic!("recovered from both");
        };
        assert_eq!(u.xid, 48);
        // XID 154 announces the recovery already seen: it is no new fault.
        t.on_xid(&gpu(1), 48, 20);
        t.on_probe(&gpu(1), Probe::NeedsRecovery, 21);
        assert_eq!(t.on_xid(&gpu(1), XID_RECOVERY_ACTION_CHANGED, 22), None);
        assert!(t.list()[0].recovery_seen);
        // An application error is no new fault either.
        assert_eq!(t.on_xid(&gpu(1), 13, 23), None);
        assert!(matches!(
            t.on_probe(&gpu(1), Probe::Healthy, 24),
            Some(Change::Recovered(_))
        ));
    }

    #[test]
    fn a_lost_gpu_is_unhealthy_without_its_event_and_back_when_it_answers() {
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        let Some(Change::Unhealthy(u)) = t.on_probe(&gpu(0), Probe::Lost, 7) else {
            panic!("lost");
        };
        assert_eq!((u.xid, u.since_ms), (79, 7));
        assert_eq!(t.on_probe(&gpu(0), Probe::Lost, 8), None);
        // A driver that cannot say what the GPU needs: answering again is enough for 79.
        assert!(matches!(
            t.on_probe(&gpu(0), Probe::Unknown, 9),
            Some(Change::Recovered(_))
        ));
    }

    /// A GPU that fell off the bus and then left NVML (unbound: its handle lookup finds
    /// nothing) does not answer, so it is not healthy again; only answering again is.
    #[test]
    fn a_lost_gpu_that_vanishes_from_nvml_stays_unhealthy() {
        assert_eq!(no_handle(&NvmlError::GpuLost), Probe::Lost);
        assert_eq!(no_handle(&NvmlError::NotFound), Probe::Absent);
        assert_eq!(no_handle(&NvmlError::Unknown), Probe::Absent);
        assert_eq!(no_handle(&NvmlError::NotSupported), Probe::Absent);
        assert_eq!(no_field(&NvmlError::GpuLost), Probe::Lost);
        assert_eq!(no_field(&NvmlError::NotSupported), Probe::Unknown);
        assert_eq!(no_field(&NvmlError::InvalidArg), Probe::Unknown);
        assert_eq!(no_field(&NvmlError::NotFound), Probe::Absent);
        assert_eq!(no_field(&NvmlError::Unknown), Probe::Absent);
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        assert!(matches!(
            t.on_probe(&gpu(0), Probe::Lost, 1),
            Some(Change::Unhealthy(_))
        ));
        for now in 2..10 {
            assert_eq!(
                t.on_probe(&gpu(0), no_handle(&NvmlError::NotFound), now),
                None
            );
        }
        assert_eq!(t.list().len(), 1, "still out");
        // Absent marks no GPU by itself.
        assert_eq!(t.on_probe(&gpu(1), Probe::Absent, 3), None);
        assert_eq!(t.list().len(), 1);
        // It answers again (a driver without the recovery field): healthy again.
        assert!(matches!(
            t.on_probe(&gpu(0), Probe::Unknown, 11),
            Some(Change::Recovered(_))
        ));
    }

    /// A health record the watch cannot read at start (garbage, or `version` 2 written by a
    /// newer release before a downgrade) is never overwritten, not even with the GPUs the
    /// watch marks meanwhile; once an operator removes it, the watch writes what it knows.
    #[test]
    fn an_unreadable_record_is_kept_until_it_reads_again() {
        let sick = Unhealthy {
            index: 1,
            uuid: gpu(1).uuid,
            xid: 48,
            since_ms: 3,
            recovery_seen: false,
        };
        let v2 =
            serde_json::json!({"version": 2, "unhealthy": [], "gpus": [sick.uuid]}).to_string();
        for text in [v2.as_str(), "{not json"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("health.json");
            std::fs::write(&path, text).unwrap();
            let (mut record, list) = Record::open(&path);
            assert!(list.is_empty());
            assert!(record.is_unreadable());
            let mut t = Tracker::new(HealthConfig::default(), list);
            record.sync(&mut t);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "kept");
            t.on_probe(&gpu(0), Probe::Lost, 5);
            record.sync(&mut t);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "kept");
            // Restored by an operator (the earlier release's format): its GPUs join.
            write_health(&path, std::slice::from_ref(&sick)).unwrap();
            record.sync(&mut t);
            assert!(!record.is_unreadable());
            let back = read_health(&path).unwrap();
            assert_eq!(back.len(), 2, "{back:?}");
            assert!(gpuslice_driver::health::find(&back, &sick.uuid).is_some());
            assert!(gpuslice_driver::health::find(&back, &gpu(0).uuid).is_some());
        }
        // Removed by an operator: written afresh from what the watch knows.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        std::fs::write(&path, "garbage").unwrap();
        let (mut record, list) = Record::open(&path);
        let mut t = Tracker::new(HealthConfig::default(), list);
        t.on_probe(&gpu(0), Probe::Lost, 5);
        record.sync(&mut t);
        std::fs::remove_file(&path).unwrap();
        record.sync(&mut t);
        assert_eq!(read_health(&path).unwrap().len(), 1);
        // A readable record starts the watch with its GPUs, and is rewritten as they change.
        let (mut record, list) = Record::open(&path);
        assert!(!record.is_unreadable());
        let mut t = Tracker::new(HealthConfig::default(), list);
        assert_eq!(t.list().len(), 1);
        t.on_probe(&gpu(0), Probe::Unknown, 6);
        record.sync(&mut t);
        assert!(read_health(&path).unwrap().is_empty());
    }

    #[test]
    fn ignored_xids_come_from_the_config() {
        let config = HealthConfig {
            ignored_xids: vec![79],
            ..HealthConfig::default()
        };
        let mut t = Tracker::new(config, Vec::new());
        assert_eq!(t.on_probe(&gpu(0), Probe::Lost, 1), None);
        assert!(matches!(
            t.on_xid(&gpu(0), 79, 1),
            Some(Change::Ignored { .. })
        ));
        assert!(matches!(
            t.on_xid(&gpu(0), 13, 1),
            Some(Change::Unhealthy(_))
        ));
    }

    #[test]
    fn a_recorded_gpu_is_kept_across_a_restart_until_it_recovers() {
        let earlier = vec![Unhealthy {
            index: 2,
            uuid: gpu(2).uuid,
            xid: 94,
            since_ms: 3,
            recovery_seen: false,
        }];
        let mut t = Tracker::new(HealthConfig::default(), earlier.clone());
        assert_eq!(t.list(), earlier);
        assert_eq!(t.on_probe(&gpu(2), Probe::NeedsRecovery, 4), None);
        assert!(matches!(
            t.on_probe(&gpu(2), Probe::Healthy, 5),
            Some(Change::Recovered(_))
        ));
    }

    #[test]
    fn an_xid_the_driver_asks_no_reset_for_keeps_the_gpu_out() {
        // XID 63 (row remapping recorded): the driver's recovery field reads none all along.
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        assert!(matches!(
            t.on_xid(&gpu(1), 63, 10),
            Some(Change::Unhealthy(_))
        ));
        for now in 11..20 {
            assert_eq!(t.on_probe(&gpu(1), Probe::Healthy, now), None);
            assert_eq!(t.on_probe(&gpu(1), Probe::Unknown, now), None);
        }
        assert_eq!(t.list().len(), 1);
        assert!(!t.list()[0].recovery_seen);
    }

    #[test]
    fn a_pending_row_remapping_keeps_the_gpu_out_until_the_reset_applies_it() {
        // XID 63: no recovery action, but a remapping pending until the next reset.
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        assert!(matches!(
            t.on_xid(&gpu(1), 63, 10),
            Some(Change::Unhealthy(_))
        ));
        assert_eq!(t.on_probe(&gpu(1), Probe::RowRemapping, 11), None);
        assert_eq!(t.on_probe(&gpu(1), Probe::RowRemapping, 12), None);
        assert!(t.list()[0].recovery_seen, "recorded for the next run");
        // The reset applied it: nothing pending, no recovery asked.
        assert!(matches!(
            t.on_probe(&gpu(1), Probe::Healthy, 13),
            Some(Change::Recovered(_))
        ));
        // A remapping pending alone marks no GPU: with 63 ignored, the GPU stays in service.
        let config = HealthConfig {
            ignored_xids: vec![63],
            ..HealthConfig::default()
        };
        let mut t = Tracker::new(config, Vec::new());
        assert!(matches!(
            t.on_xid(&gpu(1), 63, 10),
            Some(Change::Ignored { .. })
        ));
        assert_eq!(t.on_probe(&gpu(1), Probe::RowRemapping, 11), None);
        assert!(t.list().is_empty());
    }

    #[test]
    fn a_recovery_field_that_lags_the_xid_does_not_clear_it() {
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        t.on_xid(&gpu(0), 48, 1);
        // Not updated yet when the first probe runs.
        assert_eq!(t.on_probe(&gpu(0), Probe::Healthy, 2), None);
        assert_eq!(t.on_probe(&gpu(0), Probe::NeedsRecovery, 3), None);
        assert!(t.list()[0].recovery_seen, "recorded for the next run");
        // The reset: the driver stops asking.
        assert!(matches!(
            t.on_probe(&gpu(0), Probe::Healthy, 4),
            Some(Change::Recovered(_))
        ));
    }

    #[test]
    fn a_record_without_a_seen_recovery_stays_across_a_restart() {
        // As the earlier release recorded it, or one whose driver never asked yet.
        let earlier = vec![Unhealthy {
            index: 0,
            uuid: gpu(0).uuid,
            xid: 64,
            since_ms: 3,
            recovery_seen: false,
        }];
        let mut t = Tracker::new(HealthConfig::default(), earlier);
        assert_eq!(t.on_probe(&gpu(0), Probe::Healthy, 4), None);
        // One that had seen it recovers on the next healthy probe.
        let seen = vec![Unhealthy {
            recovery_seen: true,
            ..t.list()[0].clone()
        }];
        let mut t = Tracker::new(HealthConfig::default(), seen);
        assert!(matches!(
            t.on_probe(&gpu(0), Probe::Healthy, 5),
            Some(Change::Recovered(_))
        ));
    }

    #[test]
    fn a_gpu_whose_driver_asks_for_recovery_is_marked_without_its_xid() {
        // XID 48 while the agent was down: the first probe finds the driver asking for a reset.
        let mut t = Tracker::new(HealthConfig::default(), Vec::new());
        let Some(Change::Unhealthy(u)) = t.on_probe(&gpu(1), Probe::NeedsRecovery, 7) else {
            panic!("the driver asks for a reset");
        };
        assert_eq!((u.index, u.xid, u.since_ms), (1, 154, 7));
        assert!(u.recovery_seen);
        assert_eq!(t.on_probe(&gpu(1), Probe::NeedsRecovery, 8), None);
        assert!(matches!(
            t.on_probe(&gpu(1), Probe::Healthy, 9),
            Some(Change::Recovered(_))
        ));
        // Left healthy where the operator ignores XID 154.
        let config = HealthConfig {
            ignored_xids: vec![154],
            ..HealthConfig::default()
        };
        let mut t = Tracker::new(config, Vec::new());
        assert_eq!(t.on_probe(&gpu(1), Probe::NeedsRecovery, 7), None);
    }

    #[test]
    fn records_follow_the_inventory_by_uuid() {
        let sick = |index: u32, uuid: String| Unhealthy {
            index,
            uuid,
            xid: 79,
            since_ms: 1,
            recovery_seen: true,
        };
        // A (was GPU 1) left; B (was GPU 2) is GPU 1 now.
        let (a, b) = (gpu(1).uuid, gpu(2).uuid);
        let mut t = Tracker::new(
            HealthConfig::default(),
            vec![sick(1, a.clone()), sick(2, b.clone())],
        );
        assert!(t.follow_inventory(&[]).is_empty(), "no inventory read yet");
        assert_eq!(t.list().len(), 2);
        let now = [
            gpu(0),
            GpuId {
                index: 1,
                uuid: b.to_lowercase(),
            },
        ];
        let changes = t.follow_inventory(&now);
        assert_eq!(changes, vec![Change::Gone(sick(1, a))]);
        assert!(changes[0]
            .to_string()
            .contains("no longer in the inventory"));
        assert_eq!(t.list(), [sick(1, b)]);
    }
}

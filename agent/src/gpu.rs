//! The node's one reading of the driver, behind the [`GpuMeter`] seam, for both the exporter
//! and the enforcer: per GPU its used memory and utilisation, and its compute processes
//! (host pids) with the memory each holds and its SM utilisation. The real meter is NVML
//! through nvml-wrapper (`nvmlDeviceGetComputeRunningProcesses`,
//! `nvmlDeviceGetProcessUtilization`; the simulated `libnvidia-ml.so.1` on a simulated
//! node); tests use fakes. A meter never fails as a whole: what it cannot read is left out
//! and reported as an error line.
//!
//! The driver's per-process utilisation is a buffer of samples, recorded each sample period
//! only for the processes that ran kernels in it, and read from a timestamp on
//! ([`SampleCursor`]): each meter keeps, per GPU, the newest stamp it read and each process's
//! latest sample, so a figure is never an old sample's, and a listed process with no recent
//! sample is idle (0 %), not unknown.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;

use gpuslice_config::Config;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use gpuslice_driver::device_memory;
use gpuslice_driver::simnode::SimLayout;
use nvml_wrapper_sys::bindings::NvmlLib;

/// NVML's soname on a real node.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// NVML could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    #[error("NVML ({lib}) cannot be initialised: {detail}")]
    Init { lib: String, detail: String },
}

/// One compute process on a GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host pid (the agent's pid namespace).
    pub pid: u32,
    /// Bytes it uses on this GPU, when the driver tells.
    pub used: Option<u64>,
    /// Its SM utilisation, percent, from the driver's latest sample of it (0 when it ran no
    /// kernel lately, see [`SampleCursor`]); `None` when the driver would not tell.
    pub sm: Option<u32>,
}

/// What was measured on one GPU; a field the driver would not give is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceReading {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// The memory the inventory would book (NVML's total less the driver's reserved memory).
    pub memory_total: Option<u64>,
    /// What processes allocated, the driver's reserved memory not counted.
    pub memory_used: Option<u64>,
    /// Fraction (0–1) of the last sample period a kernel ran.
    pub utilization: Option<f64>,
    /// `None` when the driver would not list them (nothing can be judged on this GPU).
    pub processes: Option<Vec<GpuProcess>>,
}

/// One reading of every GPU, and one line per thing that could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub devices: Vec<DeviceReading>,
    pub errors: Vec<String>,
}

/// Measures the node's GPUs.
pub trait GpuMeter: Send {
    fn read(&mut self) -> Reading;
}

/// How long a process's latest utilisation sample stands for it when no newer one came:
/// the longest utilisation sample period NVIDIA documents for its products (1 s,
/// nvidia-smi(1); 1/6 s on others) and half of it again for a sample recorded late. Reads
/// come more often than that (`enforce.interval`, 500 ms by default), so "no sample since
/// the last read" alone would read a busy process as idle on a GPU with a 1 s period; past
/// this, a listed process has run no kernel for a whole sample period and is idle.
pub const SAMPLE_HOLD_US: u64 = 1_500_000;

/// One GPU's place in the driver's sample buffer: the newest stamp read (the next read's
/// `lastSeenTimeStamp`) and each listed process's latest sample (stamp, SM percent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleCursor {
    last_seen: u64,
    latest: HashMap<u32, (u64, u32)>,
}

impl SampleCursor {
    /// The `lastSeenTimeStamp` for a read at wall-clock microsecond `now_us`: 0 at first (the
    /// whole buffer, its old samples judged by their stamps), then the newest stamp read. A
    /// wall clock stepped back below it would hide every new sample until it caught up: then
    /// the cursor starts over.
    pub fn last_seen(&mut self, now_us: u64) -> u64 {
        if self.last_seen > now_us {
            *self = SampleCursor::default();
        }
        self.last_seen
    }

    /// Takes in the samples a read returned, `(pid, stamp µs, SM %)` in any order and
    /// possibly several per process (none: `NVML_ERROR_NOT_FOUND`, no kernel ran since), and
    /// gives each of `pids` (the processes the driver lists) its SM utilisation: its latest
    /// sample, while that is at most [`SAMPLE_HOLD_US`] old, else 0 — a process the driver
    /// lists that ran no kernel lately, a frozen container's among them, is idle, and its
    /// zeros are what the enforcer's window must see. The latest rather than a mean over the
    /// samples since the last read: each sample already covers the driver's trailing sample
    /// window, which the compute controller models (`enforce/compute.rs`), and the window
    /// average is the enforcer's own. Processes no longer listed are forgotten.
    pub fn update(
        &mut self,
        samples: impl IntoIterator<Item = (u32, u64, u32)>,
        pids: &[u32],
        now_us: u64,
    ) -> Vec<u32> {
        for (pid, stamp, sm) in samples {
            self.last_seen = self.last_seen.max(stamp);
            let e = self.latest.entry(pid).or_insert((stamp, sm));
            if stamp >= e.0 {
                *e = (stamp, sm);
            }
        }
        self.latest.retain(|pid, _| pids.contains(pid));
        pids.iter()
            .map(|pid| match self.latest.get(pid) {
                Some((stamp, sm)) if now_us.saturating_sub(*stamp) <= SAMPLE_HOLD_US => *sm,
                _ => 0,
            })
            .collect()
    }
}

/// The SM figure of each of `pids` (the processes the driver lists) from one read of the
/// driver's samples newer than `cursor`'s stamp, `(pid, stamp µs, SM %)` each:
/// `NVML_ERROR_NOT_FOUND` is no kernel run since (every process reads what
/// [`SampleCursor::update`] holds for it, 0 once idle for a sample period); any other error
/// is no figure (`None` for all), returned to be reported.
fn sm_figures(
    cursor: &mut SampleCursor,
    read: Result<Vec<(u32, u64, u32)>, NvmlError>,
    pids: &[u32],
    now_us: u64,
) -> (Vec<Option<u32>>, Option<NvmlError>) {
    let samples = match read {
        Ok(samples) => samples,
        Err(NvmlError::NotFound) => Vec::new(),
        Err(e) => return (vec![None; pids.len()], Some(e)),
    };
    let sm = cursor.update(samples, pids, now_us);
    (sm.into_iter().map(Some).collect(), None)
}

/// Microseconds of the wall clock: the clock of NVML's sample stamps.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// NVML through nvml-wrapper. Device identities (index, UUID, name) are read once.
pub struct NvmlMeter {
    nvml: Nvml,
    /// A second handle of the same library, for the v2 memory query nvml-wrapper lacks.
    v2: Option<NvmlLib>,
    identities: Vec<Option<(String, String)>>,
    /// Per NVML index: where the last read of its utilisation samples stopped.
    cursors: Vec<SampleCursor>,
}

impl std::fmt::Debug for NvmlMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlMeter").finish_non_exhaustive()
    }
}

/// Where NVML is loaded from for `config`, and the environment the simulated NVML needs to
/// find its node (set only where not set already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlSource {
    pub lib: PathBuf,
    pub env: Vec<(&'static str, PathBuf)>,
}

impl NvmlSource {
    /// The NVML of `config`: the driver's soname, or the simulated library under
    /// `state_dir/sim` with `GPUSLICE_SIM_STATE` / `GPUSLICE_SIM_DEV` pointing at that node
    /// (a `--config` flag is not seen by the library, which otherwise reads the default
    /// config).
    pub fn of(config: &Config) -> NvmlSource {
        if !config.is_simulated() {
            return NvmlSource {
                lib: PathBuf::from(NVML_SONAME),
                env: Vec::new(),
            };
        }
        let layout = SimLayout::of(config);
        NvmlSource {
            lib: layout.lib_dir.join(NVML_SONAME),
            env: vec![
                (gpuslice_driver::simulated::STATE_ENV, layout.state),
                (gpuslice_driver::simulated::DEV_ENV, layout.dev),
            ],
        }
    }
}

impl NvmlMeter {
    /// Loads and initialises NVML from `source`, first setting the simulated node's
    /// environment where it is not set. The first call must come before the process starts
    /// other threads (`std::env::set_var` is not thread-safe); later calls (retries) find
    /// the variables set and leave the environment alone.
    pub fn open(source: &NvmlSource) -> Result<NvmlMeter, MeterError> {
        for (key, value) in &source.env {
            if std::env::var_os(key).is_none() {
                std::env::set_var(key, value);
            }
        }
        let nvml = Nvml::builder()
            .lib_path(source.lib.as_os_str())
            .init()
            .map_err(|e| MeterError::Init {
                lib: source.lib.display().to_string(),
                detail: e.to_string(),
            })?;
        // SAFETY: loads the library NVML was just initialised from, a second handle of the
        // same object; only its v2 memory query is called, with devices of `nvml`.
        let v2 = unsafe { NvmlLib::new(source.lib.as_os_str()) }.ok();
        Ok(NvmlMeter {
            nvml,
            v2,
            identities: Vec::new(),
            cursors: Vec::new(),
        })
    }

    /// Opens NVML from `lib` with no extra environment (tests).
    pub fn open_lib(lib: &OsStr) -> Result<NvmlMeter, MeterError> {
        NvmlMeter::open(&NvmlSource {
            lib: PathBuf::from(lib),
            env: Vec::new(),
        })
    }
}

/// A failure worth counting: "not supported" on this GPU is an absent figure, not an error.
fn counted(e: &NvmlError) -> bool {
    !matches!(e, NvmlError::NotSupported)
}

impl GpuMeter for NvmlMeter {
    fn read(&mut self) -> Reading {
        let mut reading = Reading::default();
        let count = match self.nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                reading
                    .errors
                    .push(format!("NVML cannot count the GPUs: {e}"));
                return reading;
            }
        };
        self.identities.resize(count as usize, None);
        self.cursors.resize(count as usize, SampleCursor::default());
        for index in 0..count {
            let mut err = |what: &str, e: NvmlError| {
                if counted(&e) {
                    reading
                        .errors
                        .push(format!("NVML GPU {index}: cannot read {what}: {e}"));
                }
            };
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    err("the device handle", e);
                    continue;
                }
            };
            let slot = &mut self.identities[index as usize];
            if slot.is_none() {
                match dev.uuid().and_then(|u| Ok((u, dev.name()?))) {
                    Ok(id) => *slot = Some(id),
                    Err(e) => {
                        err("UUID and name", e);
                        continue;
                    }
                }
            }
            let Some((uuid, model)) = slot.clone() else {
                continue;
            };
            let mut d = DeviceReading {
                index,
                uuid,
                model,
                ..DeviceReading::default()
            };
            // The memory the inventory books and what processes allocated of it: NVML v1's
            // `used` counts the driver's reserved memory too, which no process holds.
            match device_memory(self.v2.as_ref(), &dev) {
                Ok(m) => {
                    d.memory_total = Some(m.bookable());
                    d.memory_used = Some(m.used);
                }
                Err(e) => err("memory", e),
            }
            match dev.utilization_rates() {
                Ok(u) => d.utilization = Some(f64::from(u.gpu.min(100)) / 100.0),
                Err(e) => err("utilisation", e),
            }
            match dev.running_compute_processes() {
                Ok(list) => {
                    let now = wall_us();
                    let cursor = &mut self.cursors[index as usize];
                    let since = cursor.last_seen(now);
                    // Samples recorded between nvml-wrapper's size query and its read can
                    // outgrow the buffer it sized: read again once.
                    let read = match dev.process_utilization_stats(since) {
                        Err(NvmlError::InsufficientSize(_)) => dev.process_utilization_stats(since),
                        other => other,
                    };
                    let pids: Vec<u32> = list.iter().map(|p| p.pid).collect();
                    let read = read.map(|samples| {
                        samples
                            .iter()
                            .map(|s| (s.pid, s.timestamp, s.sm_util))
                            .collect()
                    });
                    let (sm, failed) = sm_figures(cursor, read, &pids, now);
                    if let Some(e) = failed {
                        err("process utilisation", e);
                    }
                    d.processes = Some(
                        list.into_iter()
                            .zip(sm)
                            .map(|(p, sm)| GpuProcess {
                                pid: p.pid,
                                used: match p.used_gpu_memory {
                                    UsedGpuMemory::Used(b) => Some(b),
                                    UsedGpuMemory::Unavailable => None,
                                },
                                sm,
                            })
                            .collect(),
                    )
                }
                Err(e) => err("compute processes", e),
            }
            reading.devices.push(d);
        }
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn source_follows_the_inventory() {
        let real = Config::default();
        assert_eq!(NvmlSource::of(&real).lib, PathBuf::from(NVML_SONAME));
        assert!(NvmlSource::of(&real).env.is_empty());
        let sim = gpuslice_config::parse_config(
            "state_dir=\"/s\"\n[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory=\"1Gi\"\n",
            Path::new("/c.toml"),
        )
        .unwrap();
        let s = NvmlSource::of(&sim);
        assert_eq!(
            s.lib,
            Path::new("/s/sim/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        assert!(s.env.contains(&(
            gpuslice_driver::simulated::STATE_ENV,
            PathBuf::from("/s/sim/state")
        )));
        assert!(s.env.contains(&(
            gpuslice_driver::simulated::DEV_ENV,
            PathBuf::from("/s/sim/dev")
        )));
    }

    const S: u64 = 1_000_000;

    /// Reads of the driver's samples as the meter makes them: the cursor's stamp decides
    /// what the driver returns from its buffer `all` (`NOT_FOUND` when nothing is newer).
    fn read_at(
        cursor: &mut SampleCursor,
        all: &[(u32, u64, u32)],
        pids: &[u32],
        now: u64,
    ) -> (u64, Vec<Option<u32>>) {
        let since = cursor.last_seen(now);
        let newer: Vec<(u32, u64, u32)> = all.iter().copied().filter(|s| s.1 > since).collect();
        let read = if newer.is_empty() {
            Err(NvmlError::NotFound)
        } else {
            Ok(newer)
        };
        let (sm, failed) = sm_figures(cursor, read, pids, now);
        assert!(failed.is_none());
        (since, sm)
    }

    /// Several samples per process come back, in no particular order: each process reads
    /// its latest, and the next read asks only for what is newer than the newest stamp.
    #[test]
    fn each_process_reads_its_latest_sample_and_the_next_read_starts_after_it() {
        let mut c = SampleCursor::default();
        let buffer = [
            (7, 100 * S + 200_000, 90),
            (7, 100 * S, 10),
            (8, 100 * S + 400_000, 30),
        ];
        let (since, sm) = read_at(&mut c, &buffer, &[7, 8], 100 * S + 500_000);
        assert_eq!(since, 0, "the first read takes the whole buffer");
        assert_eq!(sm, [Some(90), Some(30)]);
        let (since, _) = read_at(&mut c, &buffer, &[7, 8], 101 * S);
        assert_eq!(
            since,
            100 * S + 400_000,
            "lastSeen is the newest stamp read"
        );
    }

    /// `NOT_FOUND` is no kernel since, not "no figure": a listed process keeps its latest
    /// sample while a sample period may still be running, then reads 0 (a frozen or idle
    /// container's zeros reach the enforcer's window); samples from before a process went
    /// idle, which a first read returns with their old stamps, are not taken as its use now.
    #[test]
    fn a_listed_process_without_recent_samples_is_idle() {
        let mut c = SampleCursor::default();
        let buffer = [(7, 100 * S, 95), (9, 96 * S, 80)];
        let (_, sm) = read_at(&mut c, &buffer, &[7, 9], 100 * S + 300_000);
        assert_eq!(sm, [Some(95), Some(0)], "pid 9's sample is 4 s old");
        let (_, sm) = read_at(&mut c, &buffer, &[7, 9], 100 * S + 800_000);
        assert_eq!(sm, [Some(95), Some(0)], "NOT_FOUND: pid 7 within the hold");
        let (_, sm) = read_at(&mut c, &buffer, &[7, 9], 100 * S + SAMPLE_HOLD_US + 1);
        assert_eq!(sm, [Some(0), Some(0)], "idle since");
        // It runs again: its new samples count.
        let buffer = [(7, 102 * S, 40)];
        let (_, sm) = read_at(&mut c, &buffer, &[7, 9], 102 * S + 100_000);
        assert_eq!(sm, [Some(40), Some(0)]);
    }

    /// A failed read (other than `NOT_FOUND`) is no figure for anyone, reported; the cursor
    /// stays where it was. A wall clock stepped back below the cursor starts it over.
    #[test]
    fn a_failed_read_is_no_figure_and_a_clock_stepped_back_restarts_the_cursor() {
        let mut c = SampleCursor::default();
        read_at(&mut c, &[(7, 100 * S, 50)], &[7], 100 * S);
        let (sm, failed) = sm_figures(&mut c, Err(NvmlError::Unknown), &[7, 8], 100 * S);
        assert_eq!(sm, [None, None]);
        assert!(matches!(failed, Some(NvmlError::Unknown)));
        assert_eq!(c.last_seen(100 * S), 100 * S);
        assert_eq!(c.last_seen(50 * S), 0, "the clock went back 50 s");
    }

    #[test]
    fn missing_library_is_an_init_error_naming_it() {
        let e = NvmlMeter::open_lib(OsStr::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        let line = e.to_string();
        assert!(line.contains("/nonexistent/libnvidia-ml.so.1"), "{line}");
        assert!(!line.contains('\n'));
    }
}

//! The host-side enforcer of `gpuslice serve` (docs/security.md, "What only the enforcer guarantees"): what the shim inside a container
//! cannot guarantee against a process that bypasses or corrupts it, enforced from the
//! driver's own per-process figures. Every `enforce.interval` it reads NVML's per-process
//! memory and SM utilisation, maps each process to its reservation (`attribution`, host facts
//! only), brings a slice over its memory limit for longer than `grace` back under it in one
//! action (or reports it), stops the containers of a slice that goes over again within the
//! repeat window, reports a
//! slice above its compute share and, with `compute = "throttle"`, freezes its cgroup in a
//! duty cycle; processes that belong to no reservation are reported. The pure decisions
//! (`memory`, `compute`) are apart from the seams (the agent's one meter `gpu`, `signal`,
//! `freezer`).

pub mod compute;
pub mod cycle;
pub mod dutycycle;
pub mod events;
pub mod freezer;
pub mod memory;
pub mod signal;
pub mod status;
pub mod stop;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuslice_config::Config;
use gpuslice_registry::read_registry;

use crate::collect::{MeterOpener, METER_RETRY};
use crate::gpu::{GpuMeter, NvmlMeter, NvmlSource};
use cycle::{Enforcer, Roots, Throttles};
use events::{lock, publish, Shared};
use gpuslice_hook::node::NodeContext;

/// The enforcer could not start.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("cannot start the enforcer's {name} thread: {source}")]
    Thread {
        name: &'static str,
        source: std::io::Error,
    },
}

/// Where a node's cgroups are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The driver as the enforcer loop reads it: NVML once opened, else how to open it, when it
/// was last tried and why it failed.
pub struct Meter {
    meter: Option<Box<dyn GpuMeter>>,
    open: MeterOpener,
    retry: Duration,
    tried: Instant,
    error: Option<String>,
}

impl Meter {
    /// Tries `open` now and, while it fails, again every `retry` ([`Meter::ready`]). A failure
    /// is logged once, and again only when the error changes.
    pub fn open(open: MeterOpener, retry: Duration, now: Instant) -> Meter {
        let mut m = Meter {
            meter: None,
            open,
            retry,
            tried: now,
            error: None,
        };
        m.try_open(now);
        m
    }

    fn try_open(&mut self, now: Instant) {
        self.tried = now;
        match (self.open)() {
            Ok(m) => {
                if self.error.take().is_some() {
                    eprintln!("gpuslice serve: enforcer: NVML opened; enforcing from now on");
                }
                self.meter = Some(m);
            }
            Err(e) => {
                let e = e.to_string();
                if self.error.as_deref() != Some(e.as_str()) {
                    eprintln!(
                        "gpuslice serve: enforcer: {e}; nothing is enforced until it opens (tried again every {})",
                        humantime::format_duration(self.retry)
                    );
                    self.error = Some(e);
                }
            }
        }
    }

    /// The meter, opened now if it was not and a retry is due.
    pub fn ready(&mut self, now: Instant) -> Option<&mut Box<dyn GpuMeter>> {
        if self.meter.is_none() && now.saturating_duration_since(self.tried) >= self.retry {
            self.try_open(now);
        }
        self.meter.as_mut()
    }
}

/// Runs the enforcer loop: one cycle every `interval`, forever; while NVML cannot be opened,
/// no cycle, and another try every retry period of `meter`. Errors of a cycle are logged
/// once each until they change; the loop itself never stops.
pub fn run_loop(
    mut enforcer: Enforcer,
    mut meter: Meter,
    shared: Shared,
    state_dir: PathBuf,
    interval: std::time::Duration,
) {
    let mut last_errors: Vec<String> = Vec::new();
    loop {
        let started = Instant::now();
        if let Some(meter) = meter.ready(started) {
            let reading = meter.read();
            let mut errors = reading.errors;
            match read_registry(&state_dir) {
                Ok(file) => {
                    let out = enforcer.cycle(&file, &reading.devices, started);
                    errors.extend(out.errors);
                    {
                        let mut live = lock(&shared);
                        live.record.cycles_total += 1;
                        live.throttled = out.throttled;
                        live.unowned = out.unowned;
                        live.cycle_seconds = started.elapsed().as_secs_f64();
                    }
                    if let Err(e) = publish(&shared, &state_dir, out.events) {
                        errors.push(e.to_string());
                    }
                }
                Err(e) => errors.push(format!("enforcer: {e}")),
            }
            for e in errors.iter().filter(|e| !last_errors.contains(e)) {
                eprintln!("gpuslice serve: enforcer: {e}");
            }
            last_errors = errors;
        }
        if let Some(wait) = interval.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// Starts the enforcer of `node` on its own threads (the cycle loop and the freezer duty
/// cycle) and returns the state the exporter shows. What an earlier run left frozen is
/// thawed first, whatever else happens; then NVML is opened, before the threads start (it
/// may set the simulated driver's environment). When it cannot be, the enforcer runs
/// anyway and opens it again every [`METER_RETRY`] (as the exporter's collector does),
/// enforcing from the first time it opens.
pub fn start(node: &NodeContext) -> Result<Shared, EnforceError> {
    let source = NvmlSource::of(node.config());
    let open: MeterOpener =
        Box::new(move || NvmlMeter::open(&source).map(|m| Box::new(m) as Box<dyn GpuMeter>));
    start_with(node.config(), Path::new(CGROUP_ROOT), open, METER_RETRY)
}

/// [`start`] with the cgroup tree at `cgroup_root`, NVML opened by `open`, and opened again
/// every `retry` while it fails.
pub fn start_with(
    config: &Config,
    cgroup_root: &Path,
    open: MeterOpener,
    retry: Duration,
) -> Result<Shared, EnforceError> {
    let cfg = config.enforce.clone();
    let state_dir = config.state_dir.clone();
    // What an earlier run left frozen (stopped mid-period) is thawed before anything else,
    // and whether NVML opens or not: nothing else would ever thaw it.
    let left = freezer::thaw_held(&state_dir, cgroup_root, &mut freezer::CgroupFreezer);
    for e in &left.errors {
        eprintln!("gpuslice serve: enforcer: {e}");
    }
    let meter = Meter::open(open, retry, Instant::now());
    let shared = Shared::default();
    if let Ok(Some(record)) = events::read_record(&state_dir) {
        // Totals survive a restart of the daemon; the cycle count is this run's.
        lock(&shared).record = events::Record {
            cycles_total: 0,
            ..record
        };
    }
    let throttles = Throttles::default();
    let roots = Roots {
        state_dir: state_dir.clone(),
        proc_root: PathBuf::from(crate::PROC_ROOT),
        cgroup_root: cgroup_root.to_path_buf(),
    };
    let enforcer = Enforcer::new(
        cfg.clone(),
        roots.clone(),
        Box::new(signal::ProcSignaller::new(roots.proc_root.clone())),
        throttles.clone(),
    );
    let t = throttles.clone();
    let held_dir = state_dir.clone();
    let kept = left.kept;
    std::thread::Builder::new()
        .name("gpuslice-freezer".into())
        .spawn(move || {
            dutycycle::run(
                t,
                Box::new(freezer::CgroupFreezer),
                dutycycle::PERIOD,
                &held_dir,
                &kept,
            )
        })
        .map_err(|source| EnforceError::Thread {
            name: "freezer",
            source,
        })?;
    let s = shared.clone();
    std::thread::Builder::new()
        .name("gpuslice-enforcer".into())
        .spawn(move || run_loop(enforcer, meter, s, state_dir, cfg.interval))
        .map_err(|source| EnforceError::Thread {
            name: "enforcer",
            source,
        })?;
    eprintln!(
        "gpuslice serve: enforcer: memory = {}, compute = {}, grace {}, every {}",
        cfg.memory.as_str(),
        cfg.compute.as_str(),
        humantime::format_duration(cfg.grace),
        humantime::format_duration(cfg.interval)
    );
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Reading;
    use freezer::{record_held, FreezerFile, HELD_FILE};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A node without GPUs, once NVML opens.
    struct NoGpus;

    impl GpuMeter for NoGpus {
        fn read(&mut self) -> Reading {
            Reading::default()
        }
    }

    /// A restart while NVML cannot be opened (no driver library where it is looked for, as
    /// while the driver is unloaded): what the earlier run left frozen is thawed at once,
    /// and the enforcer opens NVML again on its retry period and enforces from then on.
    #[test]
    fn a_start_without_nvml_thaws_what_was_held_and_enforces_once_nvml_opens() {
        let state = tempfile::tempdir().unwrap();
        let cgroups = tempfile::tempdir().unwrap();
        let dir = cgroups.path().join("system.slice/runc-x.scope");
        std::fs::create_dir_all(&dir).unwrap();
        let freeze = dir.join("cgroup.freeze");
        std::fs::write(&freeze, "1").unwrap();
        record_held(state.path(), &[FreezerFile::V2(freeze.clone())]).unwrap();
        let tries = Arc::new(AtomicUsize::new(0));
        let t = tries.clone();
        let open: MeterOpener = Box::new(move || {
            if t.fetch_add(1, Ordering::SeqCst) < 3 {
                let missing = std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1");
                return NvmlMeter::open_lib(missing).map(|m| Box::new(m) as Box<dyn GpuMeter>);
            }
            Ok(Box::new(NoGpus))
        });
        let mut config = Config {
            state_dir: state.path().to_path_buf(),
            ..Config::default()
        };
        config.enforce.interval = Duration::from_millis(10);
        let shared = start_with(&config, cgroups.path(), open, Duration::from_millis(30))
            .expect("the enforcer starts without NVML");
        assert_eq!(std::fs::read_to_string(&freeze).unwrap(), "0", "thawed");
        assert!(!state.path().join(HELD_FILE).exists(), "record removed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&shared).record.cycles_total == 0 {
            assert!(Instant::now() < deadline, "never enforced once NVML opened");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tries.load(Ordering::SeqCst) >= 4, "opened on a retry");
    }
}

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

use std::path::PathBuf;
use std::time::Instant;

use gpuslice_registry::read_registry;

use crate::gpu::{GpuMeter, MeterError, NvmlMeter, NvmlSource};
use cycle::{Enforcer, Roots, Throttles};
use events::{lock, publish, Shared};
use gpuslice_hook::node::NodeContext;

/// The enforcer could not start.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("the enforcer cannot start: {0}; nothing is enforced until it can")]
    Meter(#[from] MeterError),
    #[error("cannot start the enforcer's {name} thread: {source}")]
    Thread {
        name: &'static str,
        source: std::io::Error,
    },
}

/// Where a node's cgroups are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Runs the enforcer loop: one cycle every `interval`, forever. Errors of a cycle are
/// logged once each until they change; the loop itself never stops.
pub fn run_loop(
    mut enforcer: Enforcer,
    mut meter: Box<dyn GpuMeter>,
    shared: Shared,
    state_dir: PathBuf,
    interval: std::time::Duration,
) {
    let mut last_errors: Vec<String> = Vec::new();
    loop {
        let started = Instant::now();
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
        if let Some(wait) = interval.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// Starts the enforcer of `node` on its own threads (the cycle loop and the freezer duty
/// cycle) and returns the state the exporter shows. NVML is opened here, before the
/// threads start; when it cannot be, the enforcer is not started and the error is returned
/// (the exporter still serves).
pub fn start(node: &NodeContext) -> Result<Shared, EnforceError> {
    let cfg = node.config().enforce.clone();
    let state_dir = node.config().state_dir.clone();
    let meter = NvmlMeter::open(&NvmlSource::of(node.config()))?;
    let shared = Shared::default();
    if let Ok(Some(record)) = events::read_record(&state_dir) {
        // Totals survive a restart of the daemon; the cycle count is this run's.
        lock(&shared).record = events::Record {
            cycles_total: 0,
            ..record
        };
    }
    let throttles = Throttles::default();
    // What an earlier run left frozen (stopped mid-period) is thawed before anything else.
    for e in freezer::thaw_held(
        &state_dir,
        std::path::Path::new(CGROUP_ROOT),
        &mut freezer::CgroupFreezer,
    ) {
        eprintln!("gpuslice serve: enforcer: {e}");
    }
    let roots = Roots {
        state_dir: state_dir.clone(),
        proc_root: PathBuf::from(crate::PROC_ROOT),
        cgroup_root: PathBuf::from(CGROUP_ROOT),
    };
    let enforcer = Enforcer::new(
        cfg.clone(),
        roots.clone(),
        Box::new(signal::ProcSignaller::new(roots.proc_root.clone())),
        throttles.clone(),
    );
    let t = throttles.clone();
    let held_dir = state_dir.clone();
    std::thread::Builder::new()
        .name("gpuslice-freezer".into())
        .spawn(move || {
            dutycycle::run(
                t,
                Box::new(freezer::CgroupFreezer),
                dutycycle::PERIOD,
                &held_dir,
            )
        })
        .map_err(|source| EnforceError::Thread {
            name: "freezer",
            source,
        })?;
    let s = shared.clone();
    std::thread::Builder::new()
        .name("gpuslice-enforcer".into())
        .spawn(move || run_loop(enforcer, Box::new(meter), s, state_dir, cfg.interval))
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

//! The node agent: `gpuslice serve`, the node's Prometheus exporter and the host-side
//! enforcer beside it, over one process attribution (`attribution`); `status`/`gc`,
//! which show what they measured and did; and `cdi generate`/`cdi list`, which take the
//! node's inventory and publish its CDI spec (`nodespec`). The exporter, per GPU: capacity,
//! booked memory and cores, used memory and utilisation as measured by NVML; per
//! reservation: its limits, the
//! memory its processes hold (usage file, cross-checked with NVML's per-process figures),
//! its compute limit and achieved share; the registry's health; the exporter's own errors.
//! Everything is read lock-free per scrape, and nothing a scrape meets is fatal. Beside it
//! runs the host-side enforcer (`enforce`), whose kills, reports and throttles the
//! exporter shows, and the GPU health watch (`health`), which turns the driver's XIDs into
//! the node's record of unhealthy GPUs.

pub mod args;
pub mod attribution;
pub mod collect;
pub mod encode;
pub mod enforce;
pub mod errors;
pub mod gpu;
pub mod health;
pub mod http;
pub mod liveness;
pub mod model;
pub mod nodespec;
pub mod procmap;
pub mod share;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpuslice_registry::RealSystem;

use collect::{node_name, Collector, Sources};
use errors::{ErrorLog, Source};
use gpu::{GpuMeter, NvmlMeter, NvmlSource};
use gpuslice_hook::node::NodeContext;
pub use http::HttpError as ServeError;

/// The proc filesystem the exporter reads on a node.
pub const PROC_ROOT: &str = "/proc";

/// A collector for `node`: its state dir, `/proc`, and NVML (the simulated one on a
/// simulated node) opened now — before any thread starts, as opening may set the simulated
/// driver's environment — and retried later if it fails.
pub fn collector_for(node: &NodeContext, mut errors: ErrorLog) -> Collector {
    let proc_root = PathBuf::from(PROC_ROOT);
    let sources = Sources {
        state_dir: node.config().state_dir.clone(),
        node: node_name(&proc_root),
        proc_root: proc_root.clone(),
    };
    let source = NvmlSource::of(node.config());
    let open = move || NvmlMeter::open(&source).map(|m| Box::new(m) as Box<dyn GpuMeter>);
    let meter = match open() {
        Ok(m) => Some(m),
        Err(e) => {
            errors.record(Source::Nvml, e);
            None
        }
    };
    Collector::new(sources, Arc::new(RealSystem::new(proc_root)), meter, errors)
        .with_reopen(Box::new(open), Instant::now())
}

/// Serves `/metrics` and `/healthz` on `listen` until the listener fails.
pub fn run(node: &NodeContext, listen: SocketAddr) -> Result<(), ServeError> {
    let mut collector = collector_for(node, ErrorLog::default());
    let server = http::bind(listen)?;
    let addr = http::local_addr(&server).unwrap_or(listen);
    eprintln!("gpuslice serve: listening on http://{addr}/metrics");
    match enforce::start(node) {
        Ok(shared) => collector = collector.with_enforcer(shared),
        Err(e) => collector.record_error(Source::Nvml, &e),
    }
    if let Err(e) = health::start(node) {
        collector.record_error(
            Source::Nvml,
            format!("cannot start the GPU health watch: {e}"),
        );
    }
    http::serve(&server, &mut collector)
}

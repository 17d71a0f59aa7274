//! `gpuslice kubelet-plugin`: the DRA socket and the registration socket (each created under
//! a dot-name the kubelet ignores, then renamed; both sockets' connections pass through
//! `h2_relay::relay`, so any standard gRPC client is answered whatever `:authority` it sends),
//! the slice publisher (in the mode `dra.mode` resolves to), the watches of the node's slices
//! and of the kubelet's stalled prepares, and the cleanup loop, in the foreground until the
//! shutdown signal; then the servers stop and the sockets go.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuslice_config::{DraConfig, TaintEffect};
use gpuslice_dra::api::{clients, Timeouts};
use gpuslice_dra::slices::{build_slices, is_dns_subdomain, SliceError, MAX_NAME};
use gpuslice_registry::Registry;
use tokio::net::UnixListener;
use tokio::sync::{watch, Notify};

use crate::api_watch::Logged;
use crate::booking::{Holdings, Plugin};
use crate::cleanup::release_stale;
use crate::dra_service::DraService;
use crate::h2_relay::relayed_incoming;
use crate::health_events::tell_pods;
use crate::mode::{resolve, write_record, ModeRecord};
use crate::offer::{offer, with_health, NodeHealth, Publication, TaintReason, UNHEALTHY_TAINT};
use crate::probe::{what_the_api_server_keeps, Kept};
use crate::proto::dra::dra_plugin_server::DraPluginServer;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::publisher::Publisher;
use crate::registration::RegistrationService;
use crate::slice_watch::watch_slices;
use crate::stalled_prepare::wake_stalled_prepares;
use crate::writer::SliceWriter;
use gpuslice_driver::health::{read_health, Unhealthy};

/// Default `--plugin-dir`: holds the DRA socket.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/gpuslice.io";
/// Default `--registration-dir`: the kubelet's plugin watcher directory.
pub const DEFAULT_REGISTRATION_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The DRA socket's name in the plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";
/// The registration socket's name in the registration directory.
pub const REGISTRATION_SOCKET: &str = "gpuslice.io-reg.sock";

/// How the plugin runs.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    pub node_name: String,
    /// `None`: the pod's in-cluster credentials.
    pub kubeconfig: Option<PathBuf>,
    pub plugin_dir: PathBuf,
    pub registration_dir: PathBuf,
    /// How often the registry is read for inventory and node-path booking changes.
    pub publish_interval: Duration,
    /// How often the API server's slices are compared with what they should say, changed or
    /// not (someone may have deleted them).
    pub resync_interval: Duration,
    /// How often claim bookings are checked against the API server (also at once after a
    /// prepare refused for capacity someone holds).
    pub cleanup_interval: Duration,
    /// `[dra]`: the publication mode and the slots per GPU.
    pub dra: DraConfig,
    /// Where the mode in effect is recorded for `gpuslice status` (`None`: nowhere).
    pub mode_file: Option<PathBuf>,
    /// The node's record of unhealthy GPUs, `health.json` (`None`: every GPU is healthy).
    pub health_file: Option<PathBuf>,
    /// `health.taint_effect`: the effect of an unhealthy GPU's device taint.
    pub taint_effect: gpuslice_config::TaintEffect,
    /// How long API requests wait for an answer, and how long each watch lasts.
    pub api_timeouts: Timeouts,
}

impl PluginOptions {
    /// The documented defaults (docs/kubernetes-dra.md) for node `node_name`.
    pub fn new(node_name: String) -> PluginOptions {
        PluginOptions {
            node_name,
            kubeconfig: None,
            plugin_dir: PathBuf::from(DEFAULT_PLUGIN_DIR),
            registration_dir: PathBuf::from(DEFAULT_REGISTRATION_DIR),
            publish_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(60),
            cleanup_interval: Duration::from_secs(60),
            dra: DraConfig::default(),
            mode_file: None,
            health_file: None,
            taint_effect: gpuslice_config::TaintEffect::NoSchedule,
            api_timeouts: Timeouts::default(),
        }
    }

    /// The DRA socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET)
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> PathBuf {
        self.registration_dir.join(REGISTRATION_SOCKET)
    }
}

/// The plugin could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("node name `{0}` is not a Node name (a DNS subdomain); pass --node-name NAME or set $NODE_NAME")]
    NodeName(String),
    #[error("{0}")]
    Slices(#[from] SliceError),
    #[error("{0}")]
    Api(#[from] gpuslice_dra::api::ApiError),
    #[error("cannot {op} socket {path}: {source}")]
    Socket {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {what} server failed: {detail}")]
    Server { what: &'static str, detail: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Binds `dir/name` through the dot-name `dir/.name.tmp` (which the kubelet ignores), so the
/// socket appears complete. A stale socket of an earlier run is replaced.
fn bind(dir: &Path, name: &str) -> Result<(UnixListener, PathBuf), ServeError> {
    let err = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source| ServeError::Socket { op, path, source }
    };
    std::fs::create_dir_all(dir).map_err(err("create the directory of", dir))?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    for p in [&tmp, &path] {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("remove the stale", p)(e)),
        }
    }
    let listener = UnixListener::bind(&tmp).map_err(err("bind", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(err("rename into place", &path))?;
    Ok((listener, path))
}

/// Runs the plugin until `shutdown` completes, then stops serving and removes the sockets.
pub async fn run(
    options: PluginOptions,
    registry: Arc<Registry>,
    writer: Arc<dyn SliceWriter>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let node = options.node_name.clone();
    if !is_dns_subdomain(&node, MAX_NAME) {
        return Err(ServeError::NodeName(node));
    }
    // The slices are named after the node: a name they cannot carry is refused now, not on
    // every publication.
    build_slices(&node, &[], 0, None)?;
    let clients = clients(options.kubeconfig.as_deref(), options.api_timeouts).await?;
    let client = clients.requests;
    let plugin = Arc::new(
        Plugin::new(node.clone(), registry.clone(), writer, client.clone())
            .with_slots_per_gpu(options.dra.slots_per_gpu)
            .with_health_file(options.health_file.clone()),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // The DRA socket first: the kubelet connects to it once registered.
    let (dra_listener, dra_path) = bind(&options.plugin_dir, DRA_SOCKET)?;
    let dra = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(DraService::new(plugin.clone())))
            .serve_with_incoming_shutdown(relayed_incoming(dra_listener), stopped(stop_rx.clone())),
    );
    let republish = Arc::new(Notify::new());
    let endpoint = std::path::absolute(&dra_path).unwrap_or(dra_path.clone());
    let reg_service = RegistrationService::new(endpoint.display().to_string(), republish.clone());
    let (reg_listener, reg_path) = bind(&options.registration_dir, REGISTRATION_SOCKET)?;
    let reg = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(reg_service))
            .serve_with_incoming_shutdown(relayed_incoming(reg_listener), stopped(stop_rx.clone())),
    );
    eprintln!(
        "gpuslice kubelet-plugin: node {node}: serving {} and {}",
        dra_path.display(),
        reg_path.display()
    );

    // Slices someone else deletes (a starting kubelet does) are published again at once.
    let watch = tokio::spawn(watch_slices(
        clients.watches.clone(),
        node.clone(),
        republish.clone(),
        options.publish_interval,
    ));
    // A pod the kubelet was refused its claims for on the node authorizer's race starts now,
    // not at the kubelet's next resync.
    let wake = tokio::spawn(wake_stalled_prepares(
        client.clone(),
        clients.watches,
        node.clone(),
        options.publish_interval,
    ));
    let publish = tokio::spawn(publish_loop(
        Publisher::new(client, node.clone()),
        registry,
        plugin.holdings().clone(),
        republish,
        options.clone(),
    ));
    let cleanup_plugin = plugin.clone();
    let cleanup_every = options.cleanup_interval;
    let cleanup = tokio::spawn(async move {
        let wanted = cleanup_plugin.cleanup_wanted().clone();
        loop {
            match release_stale(&cleanup_plugin).await {
                Ok(report) => {
                    for (uid, why) in &report.released {
                        eprintln!("gpuslice kubelet-plugin: released claim {uid}: {why}");
                    }
                    for kept in &report.kept {
                        eprintln!("gpuslice kubelet-plugin: {kept}");
                    }
                }
                Err(e) => eprintln!("gpuslice kubelet-plugin: claim cleanup: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(cleanup_every) => {}
                _ = wanted.notified() => {}
            }
        }
    });

    shutdown.await;
    let _ = stop_tx.send(true);
    publish.abort();
    watch.abort();
    wake.abort();
    cleanup.abort();
    let dra = dra.await;
    let reg = reg.await;
    for p in [&dra_path, &reg_path] {
        let _ = std::fs::remove_file(p);
    }
    eprintln!("gpuslice kubelet-plugin: stopped; sockets removed");
    for (what, r) in [("DRA", dra), ("registration", reg)] {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(ServeError::Server {
                    what,
                    detail: e.to_string(),
                })
            }
            Err(e) => {
                return Err(ServeError::Server {
                    what,
                    detail: e.to_string(),
                })
            }
        }
    }
    Ok(())
}

/// What the health record at `path` says now: every GPU healthy where there is none (no path,
/// or no file at it); [`NodeHealth::Unreadable`] while the file exists but cannot be read, since
/// the first failed read (`unreadable_since`, kept until a read succeeds; `now_s` otherwise).
fn node_health(path: Option<&Path>, unreadable_since: &mut Option<i64>, now_s: i64) -> NodeHealth {
    let Some(path) = path else {
        return NodeHealth::Read(Vec::new());
    };
    match read_health(path) {
        Ok(list) => {
            *unreadable_since = None;
            NodeHealth::Read(list)
        }
        Err(e) => NodeHealth::Unreadable {
            error: e.to_string(),
            since_s: *unreadable_since.get_or_insert(now_s),
        },
    }
}

/// The log lines for the node's health going from `was` to `now` (none when unchanged): the
/// record unreadable (once per distinct error, which names its path) or readable again, each
/// GPU the record lists and how it leaves the offer, and each GPU of `last_listed` (what the
/// record last read listed) healthy again.
fn health_log(
    was: &NodeHealth,
    now: &NodeHealth,
    last_listed: &[Unhealthy],
    taints_kept: Option<bool>,
    effect: TaintEffect,
) -> Vec<String> {
    if was == now {
        return Vec::new();
    }
    let how = |reason: TaintReason, effect: TaintEffect| match taints_kept {
        Some(true) => format!(
            "its devices carry the taint {UNHEALTHY_TAINT}={} ({})",
            reason.value(),
            effect.as_str()
        ),
        _ => "withdrawn from the ResourceSlice (the API server keeps no device taints)".to_string(),
    };
    let mut lines = Vec::new();
    match now {
        NodeHealth::Unreadable { error, .. } => lines.push(format!(
            "gpuslice kubelet-plugin: {error}; every GPU of the node is offered to no new claim until it can be read: {}",
            how(TaintReason::RecordUnreadable, TaintEffect::NoSchedule)
        )),
        NodeHealth::Read(list) => {
            if matches!(was, NodeHealth::Unreadable { .. }) {
                lines.push(
                    "gpuslice kubelet-plugin: the GPU health record can be read again: every GPU is offered by its health"
                        .to_string(),
                );
            }
            for u in list {
                lines.push(format!(
                    "gpuslice kubelet-plugin: {u}: {}",
                    how(TaintReason::Xid(u.xid), effect)
                ));
            }
            for u in last_listed.iter().filter(|u| !list.contains(u)) {
                lines.push(format!(
                    "gpuslice kubelet-plugin: GPU {} ({}) is healthy again: offered again",
                    u.index, u.uuid
                ));
            }
        }
    }
    lines
}

/// Now, whole seconds since the Unix epoch.
fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Republishes when the registry's offer or the GPUs' health changes, when the kubelet
/// registers the plugin or someone deletes the slices (`republish`), and every resync
/// interval, changed or not; a failed publication is retried on the next tick.
async fn publish_loop(
    mut publisher: Publisher,
    registry: Arc<Registry>,
    holdings: Holdings,
    republish: Arc<Notify>,
    options: PluginOptions,
) {
    let (publication, kept) = publication(&publisher, &options).await;
    let mut force = true;
    let mut last_error = String::new();
    let mut last_sync = tokio::time::Instant::now();
    let mut taints_kept: Option<bool> = kept.map(|k| k.device_taints);
    let mut probe_errors = Logged::default();
    let mut next_probe = tokio::time::Instant::now();
    let mut unreadable_since: Option<i64> = None;
    let mut last_health = NodeHealth::Read(Vec::new());
    let mut last_listed: Vec<Unhealthy> = Vec::new();
    // GPUs newly listed unhealthy whose pods have not been told yet.
    let mut untold: Vec<Unhealthy> = Vec::new();
    loop {
        let health = node_health(
            options.health_file.as_deref(),
            &mut unreadable_since,
            now_s(),
        );
        // Asked again each resync interval, not each tick, while the API server cannot say.
        if health.any_unavailable()
            && taints_kept.is_none()
            && tokio::time::Instant::now() >= next_probe
        {
            match what_the_api_server_keeps(publisher.client(), &options.node_name).await {
                Ok(kept) => taints_kept = Some(kept.device_taints),
                Err(e) => {
                    let e = e.to_string();
                    if probe_errors.first_time(&e) {
                        eprintln!(
                            "gpuslice kubelet-plugin: {e}; withdrawing unhealthy GPUs until the API server answers"
                        );
                    }
                    next_probe = tokio::time::Instant::now() + options.resync_interval;
                }
            }
        }
        if health != last_health {
            for line in health_log(
                &last_health,
                &health,
                &last_listed,
                taints_kept,
                options.taint_effect,
            ) {
                eprintln!("{line}");
            }
            // Only a GPU the record lists is known unhealthy: the pods on it hear of it once.
            if let NodeHealth::Read(list) = &health {
                for u in list.iter().filter(|u| !last_listed.contains(u)) {
                    if !untold.contains(u) {
                        untold.push(u.clone());
                    }
                }
                last_listed = list.clone();
            }
            last_health = health.clone();
        }
        let r = registry.clone();
        let snapshot = tokio::task::spawn_blocking(move || r.snapshot()).await;
        match snapshot {
            Ok(Ok(file)) => {
                // Told once the registry says who is on the GPU; a failed read keeps them.
                for u in std::mem::take(&mut untold) {
                    // The pods already on it hear of it; nothing waits for the answer.
                    let client = publisher.client().clone();
                    let node = options.node_name.clone();
                    let reservations = file.reservations.clone();
                    let effect = options.taint_effect;
                    tokio::spawn(async move {
                        for e in tell_pods(&client, &node, &reservations, &u, effect).await {
                            eprintln!("gpuslice kubelet-plugin: {e}");
                        }
                    });
                }
                let held = holdings.lock().map(|h| h.clone()).unwrap_or_default();
                let gpus = offer(&file.inventory, &file.reservations, publication, &held);
                let (gpus, taints) = with_health(
                    gpus,
                    &health,
                    taints_kept.unwrap_or(false),
                    options.taint_effect,
                );
                match publisher.sync(&gpus, &taints, force).await {
                    Ok(wrote) => {
                        if wrote {
                            eprintln!(
                                "gpuslice kubelet-plugin: published {} device(s), pool generation {}",
                                gpus.len(),
                                publisher.generation()
                            );
                        }
                        // Only a forced sync compared the API server's slices with the
                        // offer; an unforced one that found the offer unchanged asked nothing.
                        if force {
                            last_sync = tokio::time::Instant::now();
                        }
                        force = false;
                        last_error.clear();
                    }
                    Err(e) => {
                        let e = e.to_string();
                        if e != last_error {
                            eprintln!("gpuslice kubelet-plugin: publishing slices: {e} (retrying)");
                            last_error = e;
                        }
                    }
                }
            }
            Ok(Err(e)) => eprintln!("gpuslice kubelet-plugin: reading the registry: {e}"),
            Err(e) => eprintln!("gpuslice kubelet-plugin: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(options.publish_interval) => {}
            _ = republish.notified() => force = true,
        }
        if last_sync.elapsed() >= options.resync_interval {
            force = true;
        }
    }
}

/// The publication `options.dra` resolves to, asking the API server (until it answers) when
/// the mode is `auto`; logged, and recorded in the mode file. With it, the API server's
/// answers when it was asked.
async fn publication(
    publisher: &Publisher,
    options: &PluginOptions,
) -> (Publication, Option<Kept>) {
    let node = &options.node_name;
    let kept = if options.dra.mode == gpuslice_config::DraMode::Auto {
        let mut last_error = String::new();
        loop {
            match what_the_api_server_keeps(publisher.client(), node).await {
                Ok(kept) => break Some(kept),
                Err(e) => {
                    let e = e.to_string();
                    if e != last_error {
                        eprintln!("gpuslice kubelet-plugin: {e} (retrying)");
                        last_error = e;
                    }
                    tokio::time::sleep(options.publish_interval).await;
                }
            }
        }
    } else {
        None
    };
    let keeps = kept.map(|k| k.consumable_capacity);
    let publication = resolve(&options.dra, keeps);
    for line in mode_log(node, publication, &options.dra, keeps) {
        eprintln!("{line}");
    }
    if let Some(path) = &options.mode_file {
        let record = ModeRecord::new(publication, &options.dra, node);
        if let Err(e) = write_record(path, &record) {
            eprintln!("gpuslice kubelet-plugin: {e}");
        }
    }
    (publication, kept)
}

/// What the plugin logs at start about its mode: the publication and why, and in slot mode
/// with more slots per GPU than the scheduler of 1.34/1.35 decides in time, a warning.
fn mode_log(
    node: &str,
    publication: Publication,
    dra: &DraConfig,
    keeps: Option<bool>,
) -> Vec<String> {
    let why = match keeps {
        Some(true) => "the API server keeps consumable capacity",
        Some(false) => "the API server drops consumable capacity (DRAConsumableCapacity off)",
        None => "as configured",
    };
    let mut lines = vec![format!(
        "gpuslice kubelet-plugin: node {node}: publishing in {publication}: {why} (dra.mode = {})",
        dra.mode.as_str()
    )];
    if let Publication::Slots(n) = publication {
        if let Some(w) = gpuslice_config::slots_per_gpu_warning(n) {
            lines.push(format!("gpuslice kubelet-plugin: warning: {w}"));
        }
    }
    lines
}

/// Runs the plugin on a runtime of its own until SIGTERM or SIGINT.
pub fn run_until_signal(
    options: PluginOptions,
    registry: Arc<Registry>,
    writer: Arc<dyn SliceWriter>,
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(ServeError::Runtime)?;
        let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Runtime)?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        run(options, registry, writer, stop).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_config::DraMode;

    #[test]
    fn slot_mode_above_six_slots_per_gpu_is_warned_of_at_start() {
        let dra = |n| DraConfig {
            mode: DraMode::Slots,
            slots_per_gpu: n,
        };
        let six = mode_log("n1", Publication::Slots(6), &dra(6), None);
        assert_eq!(
            six,
            ["gpuslice kubelet-plugin: node n1: publishing in slot mode (6 slot devices per GPU): as configured (dra.mode = slots)"]
        );
        let eight = mode_log("n1", Publication::Slots(8), &dra(8), Some(false));
        assert_eq!(eight.len(), 2, "{eight:?}");
        assert!(
            eight[1].starts_with(
                "gpuslice kubelet-plugin: warning: dra.slots_per_gpu = 8 is above 6 (the default is 6): the scheduler of Kubernetes 1.34/1.35"
            ),
            "{eight:?}"
        );
        // Capacity mode publishes no slots: N does not matter there.
        let capacity = mode_log("n1", Publication::Capacity, &dra(8), Some(true));
        assert_eq!(capacity.len(), 1, "{capacity:?}");
    }

    #[test]
    fn an_unreadable_health_record_makes_every_gpu_unavailable_and_is_logged_once_per_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        let mut since = None;
        // No record: every GPU healthy.
        let none = node_health(Some(&path), &mut since, 100);
        assert_eq!(none, NodeHealth::Read(Vec::new()));
        assert!(!none.any_unavailable());
        assert_eq!(node_health(None, &mut since, 100), none);
        // A record this build cannot read: unavailable from the first failed read on.
        std::fs::write(&path, b"{not json").unwrap();
        let bad = node_health(Some(&path), &mut since, 200);
        let NodeHealth::Unreadable { error, since_s } = &bad else {
            panic!("{bad:?}");
        };
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert_eq!(*since_s, 200);
        assert!(bad.any_unavailable());
        assert_eq!(node_health(Some(&path), &mut since, 300), bad, "same since");
        let lines = health_log(&none, &bad, &[], Some(true), TaintEffect::NoExecute);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!("gpuslice kubelet-plugin: {error}; ")),
            "{lines:?}"
        );
        assert!(
            lines[0].ends_with(
                "every GPU of the node is offered to no new claim until it can be read: its devices carry the taint gpuslice.io/unhealthy=health-record-unreadable (NoSchedule)"
            ),
            "{lines:?}"
        );
        assert!(health_log(&bad, &bad, &[], Some(true), TaintEffect::NoSchedule).is_empty());
        // Another error is logged again.
        std::fs::write(&path, br#"{"version": 9, "unhealthy": []}"#).unwrap();
        let other = node_health(Some(&path), &mut since, 400);
        assert!(
            matches!(&other, NodeHealth::Unreadable { error: e, since_s: 200 } if e != error),
            "{other:?}"
        );
        let lines = health_log(&bad, &other, &[], None, TaintEffect::NoSchedule);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("version 9"), "{lines:?}");
        assert!(
            lines[0].ends_with(
                "withdrawn from the ResourceSlice (the API server keeps no device taints)"
            ),
            "{lines:?}"
        );
        // Readable again: GPUs by their health; a later failure starts a new since.
        let sick = gpuslice_driver::health::Unhealthy {
            index: 1,
            uuid: "GPU-00000001-0000-0000-0000-000000000000".into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        };
        gpuslice_driver::health::write_health(&path, std::slice::from_ref(&sick)).unwrap();
        let read = node_health(Some(&path), &mut since, 500);
        assert_eq!(read, NodeHealth::Read(vec![sick.clone()]));
        let lines = health_log(&other, &read, &[], Some(true), TaintEffect::NoSchedule);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("can be read again"), "{lines:?}");
        assert!(
            lines[1].ends_with("gpuslice.io/unhealthy=xid-79 (NoSchedule)"),
            "{lines:?}"
        );
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            node_health(Some(&path), &mut since, 600),
            NodeHealth::Unreadable { since_s: 600, .. }
        ));
    }
}

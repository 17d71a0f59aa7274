//! `gpuslice console`, the web page over the console's model: Nodes, a node's GPUs, Pods and
//! Workloads with a workload's GPU tab, rendered on the server per request from the same
//! functions kubectl-gpuslice uses (`fetch::sources`, `model::build`, `workload::allocate`
//! and `release`), Prometheus range queries for the charts. It acts with its kubeconfig's
//! rights, so it listens on loopback by default, answers only requests naming it
//! ([`http`]), and changes workloads only when started with `--allow-edit`.

pub mod charts;
pub mod http;
pub mod pages;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::ListParams;
use kube::Api;
use tokio::sync::Semaphore;

use crate::client::{self, Cluster};
use crate::edit::{self, Kind, Request as SliceRequest};
use crate::fetch::{self, PodScope};
use crate::model::{self, Model};
use crate::usage;
use crate::workload::{self, AllocateArgs, ReleaseArgs, WorkloadError};
use http::{Refusal, Route};
use pages::{Banner, Chrome, ContainerUse, History, Slice, WorkloadRow};

/// The stylesheet, served at `/static/console.css`.
const CSS: &str = include_str!("../../static/console.css");

/// The Content-Security-Policy of every answer: no script, no fetches; styles from the
/// console and inline (the SVG charts), forms only to the console.
pub const CSP: &str = "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'";

/// A request head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// errno of "too many open files" (per process, system-wide).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;
/// The span of the charts.
const HISTORY: u64 = 3600;
/// One chart point per this many seconds.
const STEP: u64 = 60;

/// `gpuslice console` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Address to listen on (`127.0.0.1:0`: a free port). The console acts with the
    /// kubeconfig's rights for anyone who reaches it: keep it on loopback, or put an
    /// authenticating proxy in front of a non-loopback address.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Prometheus scraping the nodes' `gpuslice serve`, e.g. http://prometheus:9090
    /// (without it, used figures and charts are not shown).
    #[arg(long, env = "GPUSLICE_PROMETHEUS", value_name = "URL")]
    pub prometheus: Option<String>,
    /// Let the page allocate, edit and release workloads' slices (default: read-only).
    #[arg(long)]
    pub allow_edit: bool,
    /// Connections served at once; further ones wait in the kernel's accept queue until one
    /// closes (an idle connection closes after 10 s without a request).
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
}

/// The console cannot start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("--prometheus `{url}` is not an http:// URL; accepted: http://HOST:PORT[/PATH], e.g. http://127.0.0.1:9090")]
    Prometheus { url: String },
    #[error("cannot listen on {addr}: {source}; pass a free address with --listen")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the console on {addr} stopped accepting connections: {source}")]
    Accept {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime or the signal handlers: {0}")]
    Runtime(std::io::Error),
}

/// What every request needs.
struct State {
    cluster: Cluster,
    rights: String,
    prometheus: Option<String>,
    allow_edit: bool,
    listen: SocketAddr,
}

/// A bound console, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    max_connections: usize,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listen", &self.state.listen)
            .finish_non_exhaustive()
    }
}

/// Whose rights the console acts with, from the kubeconfig kubectl would read.
pub fn rights(kubeconfig: Option<&Path>, context: Option<&str>) -> String {
    let kc = match kubeconfig {
        Some(p) => kube::config::Kubeconfig::read_from(p).ok(),
        None => kube::config::Kubeconfig::read().ok(),
    };
    let Some(kc) = kc else {
        return "Acts with the rights of its in-cluster service account: whoever opens this page reads (and with --allow-edit changes) the cluster as that account.".to_string();
    };
    let ctx = context.map(str::to_string).or(kc.current_context.clone());
    let user = ctx
        .as_ref()
        .and_then(|c| kc.contexts.iter().find(|n| &n.name == c))
        .and_then(|n| n.context.as_ref())
        .and_then(|c| c.user.clone());
    format!(
        "Acts with the rights of kubeconfig context `{}` (user `{}`): whoever opens this page reads (and with --allow-edit changes) the cluster as that user.",
        ctx.as_deref().unwrap_or("(none)"),
        user.as_deref().unwrap_or("(none)")
    )
}

fn check_prometheus(url: &str) -> Result<(), WebError> {
    let ok = url
        .parse::<hyper::Uri>()
        .is_ok_and(|u| u.scheme_str() == Some("http") && u.authority().is_some());
    if ok {
        Ok(())
    } else {
        Err(WebError::Prometheus {
            url: url.to_string(),
        })
    }
}

impl Server {
    /// Makes the API client and binds `--listen`.
    pub async fn bind(opts: &Options) -> Result<Server, WebError> {
        if let Some(url) = &opts.prometheus {
            check_prometheus(url)?;
        }
        let cluster = client::connect(opts.kubeconfig.as_deref(), opts.context.as_deref()).await?;
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|source| WebError::Bind {
                addr: opts.listen,
                source,
            })?;
        let listen = listener.local_addr().map_err(|source| WebError::Bind {
            addr: opts.listen,
            source,
        })?;
        Ok(Server {
            listener,
            state: Arc::new(State {
                cluster,
                rights: rights(opts.kubeconfig.as_deref(), opts.context.as_deref()),
                prometheus: opts.prometheus.clone(),
                allow_edit: opts.allow_edit,
                listen,
            }),
            max_connections: opts.max_connections as usize,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.state.listen
    }

    /// Serves until `stop` completes.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), WebError> {
        let addr = self.state.listen;
        let slots = Arc::new(Semaphore::new(self.max_connections));
        tokio::pin!(stop);
        loop {
            // A free slot first: at the cap, connections wait unaccepted.
            let slot = tokio::select! {
                _ = &mut stop => return Ok(()),
                s = slots.clone().acquire_owned() => s,
            };
            // The semaphore is never closed.
            let Ok(slot) = slot else { return Ok(()) };
            let accepted = tokio::select! {
                _ = &mut stop => return Ok(()),
                a = self.listener.accept() => a,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                // The fd limits (EMFILE, ENFILE) and aborted handshakes pass; the next
                // accept may work.
                Err(e)
                    if matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
                        || e.kind() == std::io::ErrorKind::ConnectionAborted =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(source) => return Err(WebError::Accept { addr, source }),
            };
            let state = self.state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(&state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                drop(slot);
            });
        }
    }
}

/// `gpuslice console`: binds, prints `gpuslice console: listening on http://ADDR/`, serves
/// until SIGTERM or SIGINT.
pub fn run_until_signal(opts: Options) -> Result<(), WebError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WebError::Runtime)?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(WebError::Runtime)?;
        let mut int = signal(SignalKind::interrupt()).map_err(WebError::Runtime)?;
        let server = Server::bind(&opts).await?;
        let addr = server.local_addr();
        if !addr.ip().is_loopback() {
            eprintln!(
                "warning: gpuslice console listens on {addr}, not loopback: anyone who can reach it acts with the kubeconfig's rights{}",
                if opts.allow_edit { " and can change workloads (--allow-edit)" } else { "" }
            );
        }
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "gpuslice console: listening on http://{addr}/");
        let _ = stdout.flush();
        server
            .run(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            })
            .await
    })
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

fn html(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    respond(status, "text/html; charset=utf-8", body)
}

fn refusal(r: Refusal) -> Response<Full<Bytes>> {
    let mut resp = respond(
        r.status,
        "text/plain; charset=utf-8",
        format!("{}\n", r.message),
    );
    if r.status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = if r.message.contains("POST only") {
            "POST"
        } else {
            "GET, HEAD"
        };
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    resp
}

fn header_str(req: &Request<Incoming>, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match serve(state, req).await {
        Ok(r) => r,
        Err(r) => refusal(r),
    }
}

async fn serve(state: &State, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let host = http::check_host(header_str(&req, header::HOST), state.listen)?;
    let route = http::route(req.uri().path())?;
    let method = req.method().clone();
    if route.is_action() {
        if method != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} {}: POST only", req.uri().path()),
            ));
        }
        if !state.allow_edit {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "read-only: start gpuslice console with --allow-edit to allocate",
            ));
        }
        http::check_origin(
            &host,
            header_str(&req, header::ORIGIN),
            header_str(&req, header::REFERER),
        )?;
        http::check_form(
            header_str(&req, header::CONTENT_TYPE),
            header_str(&req, header::CONTENT_LENGTH),
        )?;
        let body = Limited::new(req.into_body(), http::MAX_BODY)
            .collect()
            .await
            .map_err(|_| http::too_large())?
            .to_bytes();
        let form: BTreeMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
        return Ok(match route {
            Route::Allocate(w) => allocate(state, &w, &form).await,
            Route::Release(w) => release(state, &w, &form).await,
            _ => unreachable_route(),
        });
    }
    if method != Method::GET && method != Method::HEAD {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} {}: pages take GET and HEAD", req.uri().path()),
        ));
    }
    let query = req.uri().query();
    let namespace = match http::query_param(query, "namespace").filter(|n| !n.is_empty()) {
        Some(ns) => Some(http::namespace(&ns)?),
        None => None,
    };
    Ok(match route {
        Route::Css => respond(StatusCode::OK, "text/css; charset=utf-8", CSS.to_string()),
        Route::Nodes => {
            let available = http::query_param(query, "available").is_some_and(|v| v == "1");
            nodes(state, available).await
        }
        Route::Node(name) => node(state, &name).await,
        Route::Pods => pods(state, namespace.as_deref()).await,
        Route::Workloads => workloads(state, namespace.as_deref()).await,
        Route::Workload(w) => workload_tab(state, &w).await,
        Route::Allocate(_) | Route::Release(_) => unreachable_route(),
    })
}

fn unreachable_route() -> Response<Full<Bytes>> {
    refusal(Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal: unrouted request",
    ))
}

fn chrome(state: &State, banners: Vec<Banner>) -> Chrome {
    Chrome {
        rights: state.rights.clone(),
        allow_edit: state.allow_edit,
        banners,
    }
}

fn banner(source: &str, text: impl Into<String>) -> Banner {
    Banner {
        source: source.to_string(),
        text: text.into(),
    }
}

fn api_banner(detail: impl std::fmt::Display) -> Banner {
    banner("api", format!("API server: {detail}"))
}

/// The model and the banners of its missing sources (`None`: the API server could not be
/// read). `plugins`: also name the cluster's nodes that publish no gpuslice ResourceSlice.
async fn model_of(state: &State, scope: PodScope, plugins: bool) -> (Option<Model>, Vec<Banner>) {
    let client = &state.cluster.client;
    let src = match fetch::sources(client, &scope, state.prometheus.as_deref()).await {
        Ok(s) => s,
        Err(e) => return (None, vec![api_banner(e)]),
    };
    let only = match &scope {
        PodScope::Namespace(ns) => Some(BTreeSet::from([ns.clone()])),
        _ => None,
    };
    let m = model::build(&src, only.as_ref());
    let mut banners = Vec::new();
    if let Some(why) = &m.usage_unavailable {
        banners.push(match &state.prometheus {
            None => banner(
                "prometheus",
                "Prometheus: not configured (start with --prometheus URL)",
            ),
            Some(_) => banner("prometheus", why.clone()),
        });
    }
    if plugins {
        // Listing nodes may be forbidden to the kubeconfig's user: then no such banners.
        if let Ok(list) = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            for n in list.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
                if !m.nodes.iter().any(|v| v.name == n) {
                    banners.push(banner(
                        &format!("plugin:{n}"),
                        format!(
                            "node {n}: no gpuslice plugin (no ResourceSlice of driver gpuslice.io)"
                        ),
                    ));
                }
            }
        }
    }
    (Some(m), banners)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Memory used per GPU UUID over the last hour; `Err`: why not.
async fn gpu_history(state: &State) -> Result<History, String> {
    let Some(url) = &state.prometheus else {
        return Err("Prometheus: not configured (start with --prometheus URL)".into());
    };
    let end = now();
    let start = end.saturating_sub(HISTORY);
    let series = usage::query_range(url, "gpuslice_gpu_memory_used_bytes", start, end, STEP)
        .await
        .map_err(|e| e.to_string())?;
    let mut h = History {
        start: start as f64,
        end: end as f64,
        series: BTreeMap::new(),
    };
    for s in series {
        if let Some(uuid) = s.metric.get("uuid") {
            h.series.entry(uuid.clone()).or_default().extend(s.points);
        }
    }
    Ok(h)
}

/// Per node (and the total row): the sum of its GPUs' points at each time.
fn node_history(m: &Model, gpus: &History) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for g in &m.gpus {
        for (t, v) in gpus.series.get(&g.uuid).into_iter().flatten() {
            let key = t.round() as u64;
            for row in [g.node.as_str(), pages::TOTAL_ROW] {
                *sums
                    .entry(row.to_string())
                    .or_default()
                    .entry(key)
                    .or_default() += v;
            }
        }
    }
    History {
        start: gpus.start,
        end: gpus.end,
        series: sums
            .into_iter()
            .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect(),
    }
}

async fn nodes(state: &State, available: bool) -> Response<Full<Bytes>> {
    let (m, mut banners) = model_of(state, PodScope::None, true).await;
    let history = match (&m, m.as_ref().and_then(|m| m.usage_unavailable.as_ref())) {
        (Some(m), None) => match gpu_history(state).await {
            Ok(h) => Some(node_history(m, &h)),
            Err(e) => {
                banners.push(banner("prometheus", e));
                None
            }
        },
        _ => None,
    };
    html(
        StatusCode::OK,
        pages::nodes_page(
            &chrome(state, banners),
            m.as_ref(),
            available,
            history.as_ref(),
        ),
    )
}

async fn node(state: &State, name: &str) -> Response<Full<Bytes>> {
    let (m, mut banners) = model_of(state, PodScope::None, true).await;
    let Some(m) = m else {
        return html(
            StatusCode::OK,
            pages::nodes_page(&chrome(state, banners), None, false, None),
        );
    };
    let known = m.nodes.iter().any(|n| n.name == name);
    let plugin_missing = banners.iter().any(|b| b.source == format!("plugin:{name}"));
    banners.retain(|b| !b.source.starts_with("plugin:") || b.source == format!("plugin:{name}"));
    if !known && !plugin_missing {
        return html(
            StatusCode::NOT_FOUND,
            pages::not_found_page(&chrome(state, banners), &format!("node {name}")),
        );
    }
    let history = if m.usage_unavailable.is_none() {
        match gpu_history(state).await {
            Ok(h) => Some(h),
            Err(e) => {
                banners.push(banner("prometheus", e));
                None
            }
        }
    } else {
        None
    };
    html(
        StatusCode::OK,
        pages::node_page(&chrome(state, banners), &m, name, history.as_ref()),
    )
}

/// cAdvisor's CPU (millicores, over 5 minutes) and working set per container.
async fn container_use(state: &State) -> Result<ContainerUse, String> {
    let Some(url) = &state.prometheus else {
        return Err("cAdvisor (containers' CPU and memory): Prometheus not configured (start with --prometheus URL)".into());
    };
    const CPU: &str = r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD"}[5m]))"#;
    const MEM: &str = r#"sum by (namespace, pod, container) (container_memory_working_set_bytes{container!="",container!="POD"})"#;
    let (cpu, mem) = tokio::join!(usage::query(url, CPU), usage::query(url, MEM));
    let (cpu, mem) = (
        cpu.map_err(|e| e.to_string())?,
        mem.map_err(|e| e.to_string())?,
    );
    if cpu.is_empty() && mem.is_empty() {
        return Err(format!("cAdvisor: Prometheus at {url} has no container_cpu_usage_seconds_total or container_memory_working_set_bytes series (it scrapes no kubelet's cAdvisor)"));
    }
    let mut out = ContainerUse::new();
    for (samples, is_cpu) in [(cpu, true), (mem, false)] {
        for s in samples {
            let label = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
            let Some(v) = s.value.1.parse::<f64>().ok().filter(|v| v.is_finite()) else {
                continue;
            };
            let e = out
                .entry((label("namespace"), label("pod"), label("container")))
                .or_default();
            if is_cpu {
                e.0 = Some((v.max(0.0) * 1000.0).round() as u64);
            } else {
                e.1 = Some(v.max(0.0).round() as u64);
            }
        }
    }
    Ok(out)
}

async fn pods(state: &State, namespace: Option<&str>) -> Response<Full<Bytes>> {
    let scope = match namespace {
        Some(ns) => PodScope::Namespace(ns.to_string()),
        None => PodScope::All,
    };
    let (m, mut banners) = model_of(state, scope, false).await;
    let cadvisor = match container_use(state).await {
        Ok(c) => Some(c),
        Err(e) => {
            banners.push(banner("cadvisor", e));
            None
        }
    };
    html(
        StatusCode::OK,
        pages::pods_page(
            &chrome(state, banners),
            m.as_ref(),
            namespace,
            cadvisor.as_ref(),
        ),
    )
}

/// The request a template of the console's shape asks for (the inverse of
/// [`edit::claim_template`]).
pub fn template_request(t: &ResourceClaimTemplate) -> Option<SliceRequest> {
    let exactly = t
        .spec
        .as_ref()?
        .spec
        .as_ref()?
        .devices
        .as_ref()?
        .requests
        .as_ref()?
        .first()?
        .exactly
        .as_ref()?;
    let requests = exactly.capacity.as_ref()?.requests.as_ref()?;
    let memory =
        gpuslice_kube::quantity::parse_whole(&requests.get(gpuslice_kube::slices::CAP_MEMORY)?.0)
            .ok()?;
    let cores = match requests.get(gpuslice_kube::slices::CAP_CORES) {
        Some(q) => Some(gpuslice_kube::quantity::parse_whole(&q.0).ok()?),
        None => None,
    };
    Some(SliceRequest {
        memory,
        cores,
        gpus: u32::try_from(exactly.count.unwrap_or(1)).ok()?,
    })
}

fn row_of<W: workload::Workload>(
    kind: Kind,
    w: &W,
    replicas: Option<u64>,
    templates: &[ResourceClaimTemplate],
) -> WorkloadRow {
    let namespace = w.meta().namespace.clone().unwrap_or_default();
    let slice = w
        .pod_spec()
        .and_then(edit::current_template)
        .map(|template| {
            let request = templates
                .iter()
                .find(|t| {
                    t.metadata.name.as_deref() == Some(template.as_str())
                        && t.metadata.namespace.as_deref() == Some(namespace.as_str())
                })
                .and_then(template_request);
            Slice { template, request }
        });
    WorkloadRow {
        namespace,
        kind,
        name: w.meta().name.clone().unwrap_or_default(),
        replicas,
        slice,
    }
}

fn daemonset_pods(d: &DaemonSet) -> Option<u64> {
    d.status
        .as_ref()
        .map(|s| s.desired_number_scheduled.max(0) as u64)
}

fn api_of<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn list_all<K>(api: Api<K>, what: &str) -> Result<Vec<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("cannot list {what}: {e}"))
}

async fn workload_rows(state: &State, namespace: Option<&str>) -> Result<Vec<WorkloadRow>, String> {
    let c = &state.cluster.client;
    let (deployments, statefulsets, daemonsets, templates) = tokio::join!(
        list_all(api_of::<Deployment>(c, namespace), "deployments.apps"),
        list_all(api_of::<StatefulSet>(c, namespace), "statefulsets.apps"),
        list_all(api_of::<DaemonSet>(c, namespace), "daemonsets.apps"),
        list_all(
            api_of::<ResourceClaimTemplate>(c, namespace),
            "resourceclaimtemplates.resource.k8s.io"
        ),
    );
    let templates = templates?;
    let mut rows = Vec::new();
    for d in deployments? {
        rows.push(row_of(
            Kind::Deployment,
            &d,
            workload::Workload::replicas(&d),
            &templates,
        ));
    }
    for s in statefulsets? {
        rows.push(row_of(
            Kind::StatefulSet,
            &s,
            workload::Workload::replicas(&s),
            &templates,
        ));
    }
    for d in daemonsets? {
        rows.push(row_of(Kind::DaemonSet, &d, daemonset_pods(&d), &templates));
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind)));
    Ok(rows)
}

async fn workloads(state: &State, namespace: Option<&str>) -> Response<Full<Bytes>> {
    let (rows, banners) = match workload_rows(state, namespace).await {
        Ok(r) => (Some(r), vec![]),
        Err(e) => (None, vec![api_banner(e)]),
    };
    html(
        StatusCode::OK,
        pages::workloads_page(&chrome(state, banners), rows.as_deref(), namespace),
    )
}

async fn get_row<W: workload::Workload>(
    state: &State,
    w: &http::Workload,
    replicas: fn(&W) -> Option<u64>,
) -> Result<Option<WorkloadRow>, String> {
    let c = &state.cluster.client;
    let api: Api<W> = Api::namespaced(c.clone(), &w.namespace);
    let Some(obj) = api
        .get_opt(&w.name)
        .await
        .map_err(|e| format!("cannot get {}: {e}", w.arg()))?
    else {
        return Ok(None);
    };
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), &w.namespace);
    let named = obj.pod_spec().and_then(edit::current_template);
    let template = match named {
        Some(t) => templates
            .get_opt(&t)
            .await
            .map_err(|e| format!("cannot get resourceclaimtemplate {t}: {e}"))?,
        None => None,
    };
    Ok(Some(row_of(
        w.kind,
        &obj,
        replicas(&obj),
        template.as_slice(),
    )))
}

async fn workload_tab(state: &State, w: &http::Workload) -> Response<Full<Bytes>> {
    let row = match w.kind {
        Kind::Deployment => get_row::<Deployment>(state, w, workload::Workload::replicas).await,
        Kind::StatefulSet => get_row::<StatefulSet>(state, w, workload::Workload::replicas).await,
        Kind::DaemonSet => get_row::<DaemonSet>(state, w, daemonset_pods).await,
    };
    match row {
        Ok(Some(row)) => html(
            StatusCode::OK,
            pages::workload_page(&chrome(state, vec![]), &row),
        ),
        Ok(None) => html(
            StatusCode::NOT_FOUND,
            pages::not_found_page(
                &chrome(state, vec![]),
                &format!("{} in namespace {}", w.arg(), w.namespace),
            ),
        ),
        Err(e) => html(
            StatusCode::OK,
            pages::workloads_page(
                &chrome(state, vec![api_banner(e)]),
                None,
                Some(&w.namespace),
            ),
        ),
    }
}

/// The status of a refusal of allocate or release.
fn status_of(e: &WorkloadError) -> StatusCode {
    match e {
        WorkloadError::Edit(_) => StatusCode::BAD_REQUEST,
        WorkloadError::NotFound { .. } => StatusCode::NOT_FOUND,
        WorkloadError::NoRoom { .. }
        | WorkloadError::ForeignTemplate { .. }
        | WorkloadError::NotAllocated { .. }
        | WorkloadError::Contended { .. } => StatusCode::CONFLICT,
        // The API server's own refusal (403 forbidden to the kubeconfig's user, 422 invalid)
        // keeps its status; an unreachable one is a bad gateway.
        WorkloadError::Api {
            source: kube::Error::Api(s),
            ..
        } if (400..500).contains(&s.code) => {
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY)
        }
        WorkloadError::Fetch(_) | WorkloadError::Api { .. } => StatusCode::BAD_GATEWAY,
        WorkloadError::Yaml { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn back(w: &http::Workload) -> String {
    format!("/workloads/{}/{}/{}", w.namespace, w.kind.as_str(), w.name)
}

fn outcome(
    state: &State,
    w: &http::Workload,
    r: Result<String, (StatusCode, String)>,
) -> Response<Full<Bytes>> {
    let c = chrome(state, vec![]);
    let label = w.arg();
    match r {
        Ok(out) => html(
            StatusCode::OK,
            pages::result_page(&c, &label, &back(w), Ok(&out)),
        ),
        Err((status, line)) => html(status, pages::result_page(&c, &label, &back(w), Err(&line))),
    }
}

fn dry_run(form: &BTreeMap<String, String>) -> bool {
    form.get("dry_run")
        .is_some_and(|v| !v.is_empty() && v != "0")
}

/// The Allocate / Edit form: `kubectl gpuslice allocate KIND/NAME -n NS --gpus G --memory M
/// [--cores C] [--dry-run]`, through the same function.
async fn allocate(
    state: &State,
    w: &http::Workload,
    form: &BTreeMap<String, String>,
) -> Response<Full<Bytes>> {
    let gpus_text = form
        .get("gpus")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or("1");
    let gpus = match gpus_text.parse::<u32>() {
        Ok(g) => g,
        Err(_) => {
            let line = format!(
                "--gpus `{}`: accepted 1 to 128 GPUs per pod",
                gpus_text.escape_default()
            );
            return outcome(state, w, Err((StatusCode::BAD_REQUEST, line)));
        }
    };
    let args = AllocateArgs {
        workload: w.arg(),
        memory: form
            .get("memory")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cores: form
            .get("cores")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        gpus,
        containers: Vec::new(),
        dry_run: dry_run(form),
        force: false,
    };
    let r = workload::allocate(&state.cluster.client, &w.namespace, &args).await;
    outcome(state, w, r.map_err(|e| (status_of(&e), e.to_string())))
}

/// The Release form: `kubectl gpuslice release KIND/NAME -n NS [--dry-run]`.
async fn release(
    state: &State,
    w: &http::Workload,
    form: &BTreeMap<String, String>,
) -> Response<Full<Bytes>> {
    let args = ReleaseArgs {
        workload: w.arg(),
        dry_run: dry_run(form),
    };
    let r = workload::release(&state.cluster.client, &w.namespace, &args).await;
    outcome(state, w, r.map_err(|e| (status_of(&e), e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_of_the_console_reads_back_as_its_request() {
        for (memory, cores, gpus) in [("20Gi", Some("30"), 1), ("1536Mi", None, 2)] {
            let req = SliceRequest::parse(memory, cores, gpus).unwrap();
            let t = edit::claim_template("ml", Kind::Deployment, "train", &req);
            assert_eq!(template_request(&t), Some(req));
        }
        assert_eq!(template_request(&ResourceClaimTemplate::default()), None);
    }

    #[test]
    fn rights_name_the_context_and_user() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubeconfig");
        std::fs::write(&p, "apiVersion: v1\nkind: Config\ncurrent-context: kind\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: admin, user: {token: x}}, {name: viewer, user: {token: y}}]\ncontexts: [{name: kind, context: {cluster: c, user: admin}}, {name: ro, context: {cluster: c, user: viewer}}]\n").unwrap();
        let r = rights(Some(&p), None);
        assert!(r.contains("context `kind` (user `admin`)"), "{r}");
        let r = rights(Some(&p), Some("ro"));
        assert!(r.contains("context `ro` (user `viewer`)"), "{r}");
    }

    #[test]
    fn node_rows_sum_their_gpus_at_each_time() {
        use crate::model::tests::{claims, slices};
        let m = model::build(
            &model::Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage: Err("x".into()),
            },
            None,
        );
        let mut h = History {
            start: 0.0,
            end: 120.0,
            series: BTreeMap::new(),
        };
        h.series
            .insert("GPU-NVIDIA-H200-0".into(), vec![(0.0, 1.0), (60.0, 2.0)]);
        h.series
            .insert("GPU-NVIDIA-H200-1".into(), vec![(0.0, 10.0), (60.0, 20.0)]);
        h.series
            .insert("GPU-NVIDIA-L4-0".into(), vec![(60.0, 100.0)]);
        h.series
            .insert("GPU-elsewhere".into(), vec![(60.0, 1000.0)]);
        let n = node_history(&m, &h);
        assert_eq!(n.series["node-a"], [(0.0, 11.0), (60.0, 22.0)]);
        assert_eq!(n.series["node-b"], [(60.0, 100.0)]);
        assert_eq!(n.series[pages::TOTAL_ROW], [(0.0, 11.0), (60.0, 122.0)]);
    }
}

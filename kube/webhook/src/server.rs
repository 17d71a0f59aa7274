//! `gpuslice webhook`: the HTTPS server the API server calls. TLS only (it refuses to start
//! without a certificate), `POST /mutate` for AdmissionReviews of Pods, `GET /healthz` (live)
//! and `GET /readyz` (the inventory was read) for probes, and bounds on what a client can
//! make it hold ([`Options`]): a connection cap at which the client waited on longest is shed
//! for a new one, deadlines on a handshake, a
//! request head (also between requests), a body and every write, the body's size (a larger
//! declared one is refused before it is read), the bytes of bodies held at once (past it the
//! slowest holder is shed) and the time one review may take.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpuslice_conn::{serve_until_shed, Activity, Holding, Limits, Slots, TimedIo};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::budget::{
    claim_entries, template_entries, BudgetError, Budgets, Ledger, Recount, MAX_NAMED_CLAIM_READS,
};
use crate::cluster::Cluster;
use crate::mutate::{asks_by_extended_resource, mentions_hami, plan};
use crate::placement::{
    asks_by_annotation, job_of, keep_ranks_apart, slice_annotations, unread_claim, PlacementError,
};
use crate::review;
use crate::tls::{server_config, CertFiles, TlsError};
use gpuslice_dra::quota::{Charge, Charged, QuotaError};

/// The largest AdmissionReview read. The API server takes request bodies of at most 3 MiB
/// (and etcd stores objects of at most 1.5 MiB); the webhook is registered for CREATE, whose
/// review carries the pod once (no `oldObject`), so no pod the API server can admit is larger.
pub const MAX_BODY: usize = 3 << 20;
/// Connections served at once; at the cap a new one takes the slot of the one that has
/// waited longest on its client.
pub const MAX_CONNECTIONS: usize = 256;
/// A TLS handshake, a request head (counted from when the connection waits for it, also
/// between requests) and a request body must each arrive within this; a write that moves
/// nothing for this long closes the connection.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(10);
/// One review's work (API calls included); the API server waits 10 s by default.
pub const REVIEW_DEADLINE: Duration = Duration::from_secs(8);
/// Bytes of review bodies held at once, all connections together (8 of the largest): past
/// it a new body waits, and the connection that has waited longest on its client while its
/// body is held is shed.
pub const BODY_BUDGET: usize = 8 * MAX_BODY;
/// While the body budget is spent, how often to look again for a connection to shed.
const SHED_RETRY: Duration = Duration::from_millis(100);

/// What the server holds for its clients, at most (the defaults: [`Options::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Connections served at once.
    pub max_connections: usize,
    /// A TLS handshake must end within this.
    pub handshake: Duration,
    /// Deadlines on a request's head (the idle deadline too), its body and every write, and
    /// the requests one connection may make.
    pub limits: Limits,
    /// The largest review body read.
    pub max_body: usize,
    /// Bytes of bodies held at once (at least `max_body`).
    pub body_budget: usize,
    /// One review's work.
    pub review: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_connections: MAX_CONNECTIONS,
            handshake: CLIENT_DEADLINE,
            limits: Limits {
                head: CLIENT_DEADLINE,
                body: CLIENT_DEADLINE,
                write: CLIENT_DEADLINE,
                ..Limits::default()
            },
            max_body: MAX_BODY,
            body_budget: BODY_BUDGET,
            review: REVIEW_DEADLINE,
        }
    }
}

/// `gpuslice webhook`'s flags (docs/webhook.md).
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Serving certificate (PEM, then its chain); re-read when the file changes. Required.
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); re-read when the file changes. Required.
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// Kubeconfig of the cluster [default: in-cluster credentials].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Also turn HAMi's nvidia.com/* limits and annotations into slices, in namespaces
    /// labelled gpuslice.io/hami-compat=true (`--hami-compat` alone is `=true`; off by
    /// default). The console and kubectl gpuslice take the same spelling.
    #[arg(long, env = "GPUSLICE_HAMI_COMPAT", value_name = "BOOL", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub hami_compat: bool,
    /// Seconds a ResourceClaimTemplate of the webhook's goes unnamed by every pod of its
    /// namespace before it is marked unused, and stays marked before it is deleted.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::sweep::DEFAULT_GRACE.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub unused_template_grace: u64,
    /// Seconds between recounts of the namespaces' budgets from their live pods and claims,
    /// and the window a booking is kept for: an admission must reach the API server's store
    /// within it. A deleted pod or claim, or a pod done, is freed within about a second by a
    /// recount of its namespace (less what was booked there within the window); this periodic
    /// one frees what those missed.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::budget::DEFAULT_RECOUNT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub budget_recount: u64,
    /// The Lease (NAMESPACE/NAME) the replicas take turns on to recount budgets, one at a
    /// time; without it this process recounts (run one replica, or name a lease).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = lease_name)]
    pub budget_lease: Option<(String, String)>,
}

/// `NAMESPACE/NAME`, a namespace (a DNS label) and a Lease's name (a DNS subdomain): a name
/// the API server would refuse would leave every replica without the lease, and no budget
/// ever freed.
fn lease_name(s: &str) -> Result<(String, String), String> {
    use gpuslice_dra::slices::{is_dns_label, is_dns_subdomain, MAX_NAME};
    match s.split_once('/') {
        Some((ns, name))
            if is_dns_label(ns) && is_dns_subdomain(name, MAX_NAME) =>
        {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!(
            "{s:?} is not accepted; expected NAMESPACE/NAME, a namespace (lowercase letters, digits and `-`) and a Lease's name (those and `.`), e.g. `gpuslice/gpuslice-webhook-budgets`"
        )),
    }
}

/// Why the webhook did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the webhook serves HTTPS only (the API server calls webhooks over TLS): pass --tls-cert PATH and --tls-key PATH")]
    NoTls,
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Api(#[from] gpuslice_dra::api::ApiError),
    #[error("cannot listen on --listen {addr}: {detail}")]
    Listen { addr: SocketAddr, detail: String },
    #[error("cannot start the webhook's runtime: {0}")]
    Runtime(String),
}

struct Shared {
    cluster: Cluster,
    ledger: Ledger,
    hami_compat: bool,
    opts: Options,
    slots: Slots,
    /// The body budget, in KiB.
    budget: Arc<Semaphore>,
}

/// Serves until SIGTERM or SIGINT; then stops accepting and returns.
pub fn run_until_signal(args: WebhookArgs) -> Result<(), WebhookError> {
    let (Some(cert), Some(key)) = (args.tls_cert.clone(), args.tls_key.clone()) else {
        return Err(WebhookError::NoTls);
    };
    let tls = server_config(CertFiles { cert, key })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| WebhookError::Runtime(e.to_string()))?;
    rt.block_on(async move {
        let client = gpuslice_dra::api::client(args.kubeconfig.as_deref()).await?;
        let listener = TcpListener::bind(args.listen)
            .await
            .map_err(|e| WebhookError::Listen {
                addr: args.listen,
                detail: e.to_string(),
            })?;
        let cluster = Cluster::start(client, Duration::from_secs(args.unused_template_grace)).await;
        // One watched copy of the quotas serves the admissions and tells the recount which
        // namespaces a deletion may free a budget in.
        let ledger = Ledger::watching(cluster, args.hami_compat);
        let recount = Recount::new(
            ledger.clone(),
            Duration::from_secs(args.budget_recount),
            args.budget_lease.clone(),
        );
        tokio::spawn(recount.run());
        eprintln!(
            "gpuslice webhook: serving https://{} (hami-compat: {})",
            listener.local_addr().map_or(args.listen, |a| a),
            args.hami_compat
        );
        let stop = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        };
        serve_with(listener, tls, ledger, Options::default(), stop).await;
        Ok(())
    })
}

/// Serves HTTPS on `listener` with `tls` until `stop` completes.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    cluster: Cluster,
    hami_compat: bool,
    opts: Options,
    stop: impl Future<Output = ()>,
) {
    let ledger = Ledger::watching(cluster, hami_compat);
    serve_with(listener, tls, ledger, opts, stop).await;
}

/// [`serve`], admissions booking through `ledger` (a watching one, crate::budget::Ledger),
/// which the recount may share.
pub async fn serve_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ledger: Ledger,
    opts: Options,
    stop: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let shared = Arc::new(Shared {
        cluster: ledger.cluster().clone(),
        hami_compat: ledger.hami_compat(),
        ledger,
        opts,
        slots: Slots::new(opts.max_connections),
        budget: Arc::new(Semaphore::new(
            kib(opts.body_budget.max(opts.max_body)) as usize
        )),
    });
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => match a {
                Ok((tcp, _)) => tcp,
                // A full file table and the like: wait a little rather than spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue }
            },
        };
        // A slot for it: a free one, else the one of the connection that has waited longest
        // on its client (a handshake, a head or a body not sent, an answer not read).
        let slot = tokio::select! {
            _ = &mut stop => return,
            s = shared.slots.take() => s,
        };
        let (acceptor, shared) = (acceptor.clone(), Arc::clone(&shared));
        tokio::spawn(async move {
            // The slot frees when the task ends (also on a panic).
            let conn = slot.conn();
            serve_until_shed(
                conn,
                serve_connection(tcp, acceptor, shared, conn.activity()),
            )
            .await;
        });
    }
}

/// One connection: the handshake, then requests until the client closes, a deadline passes
/// or its request cap is reached.
async fn serve_connection(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    activity: &Arc<Activity>,
) {
    let limits = shared.opts.limits;
    let _ = tcp.set_nodelay(true);
    let io = TimedIo::new(tcp, Arc::clone(activity), limits.write);
    let Ok(Ok(tls)) = tokio::time::timeout(shared.opts.handshake, acceptor.accept(io)).await else {
        return;
    };
    let answered = Arc::new(AtomicU32::new(0));
    let activity = Arc::clone(activity);
    let service = hyper::service::service_fn(move |req| {
        let (shared, activity, answered) = (
            Arc::clone(&shared),
            Arc::clone(&activity),
            Arc::clone(&answered),
        );
        async move {
            let mut resp = route(req, &shared, &activity).await;
            // The last request a connection may make: its answer closes it, and requests
            // pipelined behind it are not read.
            if answered.fetch_add(1, Ordering::Relaxed) + 1 >= limits.requests_per_connection {
                resp.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head)
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

/// An answer after which the connection closes: the body was not read (whole).
fn refuse_body(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let mut r = reply(status, "text/plain", message.into_bytes());
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Why a review's body was not read.
enum BodyRefused {
    TooLarge,
    TooSlow,
    Broken(hyper::Error),
}

/// `bytes` in whole KiB (the budget's unit), at least one.
fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX)
}

/// A body read whole, and its share of the budget until it drops.
struct Received {
    bytes: Vec<u8>,
    _budget: OwnedSemaphorePermit,
    _holding: Holding,
}

/// Reads a body whole within the body deadline into one buffer (of the declared size when
/// there is one), refusing it past the size limit, and within the body budget: while that is
/// spent, the connection that has waited longest on its client while its body is held is
/// shed (a body sent slowly or never finished holds no memory others need).
async fn read_body(
    mut body: Incoming,
    shared: &Shared,
    activity: &Arc<Activity>,
) -> Result<Received, BodyRefused> {
    let opts = &shared.opts;
    let hint = body.size_hint();
    let declared = usize::try_from(hint.lower()).unwrap_or(usize::MAX);
    if declared > opts.max_body {
        return Err(BodyRefused::TooLarge);
    }
    let deadline = tokio::time::Instant::now() + opts.limits.body;
    // A chunked body may take up to the limit.
    let want = if hint.exact().is_some() {
        declared
    } else {
        opts.max_body
    };
    let budget = loop {
        if let Ok(p) = Arc::clone(&shared.budget).try_acquire_many_owned(kib(want)) {
            break p;
        }
        shared.slots.shed_holder();
        let look_again = (tokio::time::Instant::now() + SHED_RETRY).min(deadline);
        let acquire = Arc::clone(&shared.budget).acquire_many_owned(kib(want));
        match tokio::time::timeout_at(look_again, acquire).await {
            Ok(Ok(p)) => break p,
            // The semaphore is never closed.
            Ok(Err(_)) => return Err(BodyRefused::TooSlow),
            Err(_) if tokio::time::Instant::now() >= deadline => return Err(BodyRefused::TooSlow),
            Err(_) => {}
        }
    };
    let holding = activity.holding(want);
    let read = async {
        let mut buf = Vec::with_capacity(declared);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(BodyRefused::Broken)?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > opts.max_body {
                    return Err(BodyRefused::TooLarge);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf)
    };
    let bytes = tokio::time::timeout_at(deadline, read)
        .await
        .unwrap_or(Err(BodyRefused::TooSlow))?;
    Ok(Received {
        bytes,
        _budget: budget,
        _holding: holding,
    })
}

async fn route(
    req: Request<Incoming>,
    shared: &Shared,
    activity: &Arc<Activity>,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
        // Ready once the cluster's inventory was read (before, every GPU pod is refused).
        (&Method::GET, "/readyz") => match shared.cluster.inventory() {
            Ok(_) => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{e}\n").into_bytes(),
            ),
        },
        (&Method::POST, "/mutate") => {
            let opts = &shared.opts;
            let body = match read_body(req.into_body(), shared, activity).await {
                Ok(b) => b,
                Err(BodyRefused::TooLarge) => {
                    return refuse_body(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("the review is larger than {} bytes\n", opts.max_body),
                    )
                }
                Err(BodyRefused::TooSlow) => {
                    return refuse_body(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "the review's body did not arrive within {} s\n",
                            opts.limits.body.as_secs_f64()
                        ),
                    )
                }
                Err(BodyRefused::Broken(e)) => {
                    return refuse_body(
                        StatusCode::BAD_REQUEST,
                        format!("the review is not read: {e}\n"),
                    )
                }
            };
            // From here the webhook works and the client waits: the connection is not shed.
            let _serving = activity.serving();
            let parsed = review::parse(&body.bytes);
            // Only what the webhook reads of the review lives on, not its body.
            drop(body);
            let r = match parsed {
                Ok(r) => r,
                Err(e) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        "text/plain",
                        e.to_string().into_bytes(),
                    )
                }
            };
            let answer = match tokio::time::timeout(opts.review, admit(&r, shared)).await {
                Ok(v) => v,
                Err(_) => review::deny(
                    &r.uid,
                    500,
                    &format!(
                        "gpuslice-webhook: the API server did not answer within {}s",
                        opts.review.as_secs()
                    ),
                ),
            };
            reply(
                StatusCode::OK,
                "application/json",
                serde_json::to_vec(&answer).unwrap_or_default(),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            b"gpuslice webhook: POST /mutate, GET /healthz, GET /readyz\n".to_vec(),
        ),
    }
}

/// The answer to one review.
async fn admit(r: &review::Request, shared: &Shared) -> Value {
    if r.operation != "CREATE" {
        return review::allow(&r.uid, &[], &[]);
    }
    match r.kind.as_str() {
        "ResourceClaim" => admit_claim(r, shared).await,
        _ => admit_pod(r, shared).await,
    }
}

/// A refusal for a budget that was not booked: 403 when it is exceeded or not counted yet (as
/// the API server's own quota answers), 400 when the ask, the quota or the pod cannot be read
/// or counted, 500 when the API server could not be read or written.
fn deny_budget(uid: &str, e: &BudgetError) -> Value {
    let code = match e {
        BudgetError::Quota(QuotaError::Exceeded { .. } | QuotaError::Uncounted { .. })
        | BudgetError::ByAnnotation { .. } => 403,
        BudgetError::Quota(_) | BudgetError::NoTemplate { .. } => 400,
        _ => 500,
    };
    review::deny(uid, code, &e.to_string())
}

/// Books `charge` against the namespace's budgets `b` (a dry run only checks it).
async fn charge(
    shared: &Shared,
    r: &review::Request,
    b: Budgets,
    c: &Charge,
) -> Result<(), BudgetError> {
    if r.dry_run {
        b.check(c)
    } else {
        shared.ledger.book(b, c).await
    }
}

/// A ResourceClaim of gpuslice's device classes: charged against the namespace's budgets.
async fn admit_claim(r: &review::Request, shared: &Shared) -> Value {
    let claim = match &r.object {
        Ok(v) if v.is_object() => {
            match serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceClaim>(v.clone())
            {
                Ok(c) => c,
                Err(e) => {
                    return review::deny(
                        &r.uid,
                        400,
                        &format!(
                            "ResourceClaim {}/{} cannot be read: {e}",
                            r.namespace,
                            v["metadata"]["name"]
                                .as_str()
                                .or(v["metadata"]["generateName"].as_str())
                                .unwrap_or("?")
                        ),
                    )
                }
            }
        }
        // Refused, never admitted uncharged: a claim the webhook cannot read could ask
        // anything.
        Ok(_) => {
            return review::deny(
                &r.uid,
                400,
                "the review of a ResourceClaim carries no ResourceClaim object; accepted: a review as the API server sends it",
            )
        }
        Err(e) => return review::deny(&r.uid, 400, &e.to_string()),
    };
    // A claim is in no quota scope: only the quotas without scopes count it.
    let budgets = match shared.ledger.budgets(&r.namespace).await {
        Ok(Some(b)) => match b.counting(Charged::Claim) {
            Ok(Some(b)) => b,
            Ok(None) => return review::allow(&r.uid, &[], &[]),
            Err(e) => return deny_budget(&r.uid, &e),
        },
        Ok(None) => return review::allow(&r.uid, &[], &[]),
        Err(e) => return deny_budget(&r.uid, &e),
    };
    let inventory = match shared.cluster.inventory() {
        Ok(i) => i,
        Err(e) => return review::deny(&r.uid, 500, &e.to_string()),
    };
    let c = match shared
        .ledger
        .claim_charge(&r.namespace, &claim, r.by_claim_controller, &inventory)
        .await
    {
        Ok(c) => c,
        Err(e) => return deny_budget(&r.uid, &e),
    };
    match charge(shared, r, budgets, &c).await {
        Ok(()) => review::allow(&r.uid, &[], &[]),
        Err(e) => deny_budget(&r.uid, &e),
    }
}

/// A pod: its GPU limits turned into claims, and what its claim templates ask charged
/// against the namespace's budgets.
async fn admit_pod(r: &review::Request, shared: &Shared) -> Value {
    let pod = match &r.object {
        Ok(pod) if pod.is_object() => pod,
        Ok(_) => return review::allow(&r.uid, &[], &[]),
        Err(e) => return review::deny(&r.uid, 400, &e.to_string()),
    };
    // The node books what `gpuslice.io/*` annotations ask, past every budget: in a namespace
    // with one (a quota not counted yet included), such a pod is refused, dry run or not.
    let annotations = slice_annotations(pod);
    if !annotations.is_empty() {
        match shared.ledger.budgets(&r.namespace).await {
            Ok(Some(b)) => return deny_budget(&r.uid, &b.refuse_annotations(&annotations)),
            Ok(None) => {}
            Err(e) => return deny_budget(&r.uid, &e),
        }
    }
    let hami = if shared.hami_compat && mentions_hami(pod) {
        match shared.cluster.hami_namespace(&r.namespace).await {
            Ok(h) => h,
            Err(e) => return review::deny(&r.uid, 500, &e.to_string()),
        }
    } else {
        false
    };
    let inventory = match shared.cluster.inventory() {
        Ok(i) => i,
        Err(e) => return review::deny(&r.uid, 500, &e.to_string()),
    };
    let mut p = match plan(pod, &r.namespace, hami, &inventory) {
        Ok(p) => p,
        Err(e) => return review::deny(&r.uid, 400, &e.to_string()),
    };
    let entries = template_entries(pod, &p);
    let budgets = if entries.is_empty() {
        None
    } else {
        // The quotas whose scopes hold for the pod.
        match shared.ledger.budgets(&r.namespace).await {
            Ok(Some(b)) => match b.counting(Charged::Pod(&r.scope)) {
                Ok(b) => b,
                Err(e) => return deny_budget(&r.uid, &e),
            },
            Ok(None) => None,
            Err(e) => return deny_budget(&r.uid, &e),
        }
    };
    let booking = match budgets {
        None => None,
        Some(b) => match shared
            .ledger
            .pod_charge(&r.namespace, &entries, &p.templates, &inventory)
            .await
        {
            Ok(c) => Some((b, c)),
            Err(e) => return deny_budget(&r.uid, &e),
        },
    };
    // A rank of a job that gets gpuslice's devices otherwise than by the limits the plan
    // turned into claims (the plan saw to those) keeps off its job's other ranks' nodes too:
    // one asking the node by annotation (left as written), one asking a device class's
    // extended resource (the scheduler writes its claim), one whose own claim templates ask
    // gpuslice's devices, one naming a claim that asks them. Nothing is refused for it but
    // naming more claims than are read, none of those asking them (the rule's answer unknown).
    // Without a budget nothing is charged: whether the templates ask gpuslice's devices at
    // all decides (one missing or unreadable counts as asking; the extra term is harmless).
    // A named claim counts only once read and known to ask them (one missing yet or
    // unreadable is named in a warning): another driver's claim may well be written after
    // its pods, and the term would keep that job's ranks one per node.
    if let Some((label, value)) = job_of(pod).filter(|_| p.entries.is_empty()) {
        let mut asks = asks_by_annotation(pod)
            || asks_by_extended_resource(pod)
            || match &booking {
                Some((_, c)) => !c.is_zero(),
                None if !entries.is_empty() => {
                    shared
                        .ledger
                        .names_gpuslice_devices(&r.namespace, &entries, &p.templates)
                        .await
                }
                None => false,
            };
        let claims = claim_entries(pod);
        if !asks && !claims.is_empty() {
            let named = shared
                .ledger
                .names_gpuslice_claims(&r.namespace, &claims)
                .await;
            asks = named.asks;
            for (entry, detail) in named.unread {
                p.warnings
                    .push(unread_claim(&entry, &detail, label, &value));
            }
            // Past the claims read, none asking: whether the rank must be kept apart is
            // unknown, and the rule promises ranks never share a GPU.
            if named.not_read > 0 {
                let e = PlacementError::TooManyClaims {
                    count: MAX_NAMED_CLAIM_READS + named.not_read,
                    max: MAX_NAMED_CLAIM_READS,
                    job: format!("{label}={value}"),
                };
                return review::deny(&r.uid, 400, &e.to_string());
            }
        }
        if asks {
            if let Some((ops, warning)) = keep_ranks_apart(pod) {
                p.patch.extend(ops);
                p.warnings.push(warning);
            }
        }
    }
    // A pod past its budget as read is refused before any template is made for it.
    if let Some((b, c)) = &booking {
        if let Err(e) = b.check(c) {
            return deny_budget(&r.uid, &e);
        }
    }
    // A dry run creates nothing: the patch names the templates a real create would make.
    if !r.dry_run {
        for t in &p.templates {
            if let Err(e) = shared.cluster.ensure_template(t).await {
                return review::deny(&r.uid, 500, &e.to_string());
            }
        }
    }
    // Booked last: a pod refused before this books nothing (its templates, unused, are swept).
    if let Some((b, c)) = booking {
        if let Err(e) = charge(shared, r, b, &c).await {
            return deny_budget(&r.uid, &e);
        }
    }
    review::allow(&r.uid, &p.patch, &p.warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--hami-compat` takes the console's spelling: alone or `=BOOL`, off by default, a
    /// value only after `=` (so a following argument is never read as its value).
    #[test]
    fn hami_compat_is_off_by_default_and_takes_a_value_after_equals() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: WebhookArgs,
        }
        let parse = |extra: &[&str]| {
            use clap::Parser;
            Cli::try_parse_from(["webhook"].iter().chain(extra)).map(|c| c.args.hami_compat)
        };
        // The variable is read where no flag is given: the default shows where none is set.
        if std::env::var_os("GPUSLICE_HAMI_COMPAT").is_none() {
            assert_eq!(parse(&[]).ok(), Some(false));
        }
        assert_eq!(parse(&["--hami-compat"]).ok(), Some(true));
        assert_eq!(parse(&["--hami-compat=true"]).ok(), Some(true));
        assert_eq!(parse(&["--hami-compat=false"]).ok(), Some(false));
        let e = parse(&["--hami-compat=maybe"]).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("invalid value 'maybe' for '--hami-compat[=<BOOL>]'")),
            "{e:?}"
        );
    }

    #[test]
    fn a_budget_lease_must_be_a_name_the_api_server_takes() {
        assert_eq!(
            lease_name("gpuslice/gpuslice-webhook-budgets"),
            Ok(("gpuslice".into(), "gpuslice-webhook-budgets".into()))
        );
        assert!(lease_name("ns/budgets.v1").is_ok());
        for bad in [
            "gpuslice/Bad_Name",
            "Gpuslice/b",
            "gpu.slice/b",
            "/b",
            "ns/",
            "ns/a/b",
            "nobudget",
            "ns/-b",
        ] {
            let e = lease_name(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("{bad:?} is not accepted; expected NAMESPACE/NAME")),
                "{e}"
            );
        }
    }
}

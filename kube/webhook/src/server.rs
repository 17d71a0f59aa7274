//! `gpuslice webhook`: the HTTPS server the API server calls. TLS only (it refuses to start
//! without a certificate), `POST /mutate` for AdmissionReviews of Pods, `GET /healthz` for
//! probes, and bounds on what a client can make it hold: connections, handshake and header
//! deadlines, the body's size and the time one review may take.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::cluster::Cluster;
use crate::mutate::{mentions_hami, plan};
use crate::review;
use crate::tls::{CertFiles, Reloading, TlsError};

/// The largest AdmissionReview read (a Pod is at most about 1.5 MiB in etcd; the review
/// carries it once, plus the request's metadata).
pub const MAX_BODY: usize = 3 << 20;
/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// A TLS handshake, a request head and a request body must each arrive within this.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(10);
/// One review's work (API calls included); the API server waits 10 s by default.
pub const REVIEW_DEADLINE: Duration = Duration::from_secs(8);

/// `gpuslice webhook`'s flags (DESIGN §7).
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
    /// labelled gpuslice.io/hami-compat=true.
    #[arg(long)]
    pub hami_compat: bool,
}

/// Why the webhook did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("gpuslice webhook serves HTTPS only (the API server calls webhooks over TLS): pass --tls-cert PATH and --tls-key PATH")]
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
    hami_compat: bool,
}

/// Serves until SIGTERM or SIGINT; then stops accepting and returns.
pub fn run_until_signal(args: WebhookArgs) -> Result<(), WebhookError> {
    let (Some(cert), Some(key)) = (args.tls_cert.clone(), args.tls_key.clone()) else {
        return Err(WebhookError::NoTls);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Checked before anything else starts: a bad pair is an error at start, not at a handshake.
    let resolver = Arc::new(Reloading::new(
        CertFiles { cert, key },
        Arc::clone(&provider),
    )?);
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
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| WebhookError::Runtime(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let shared = Arc::new(Shared {
            cluster: Cluster::start(client).await,
            hami_compat: args.hami_compat,
        });
        eprintln!(
            "gpuslice webhook: serving https://{} (hami-compat: {})",
            listener.local_addr().map_or(args.listen, |a| a),
            args.hami_compat
        );
        serve(listener, acceptor, shared).await;
        Ok(())
    })
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
    tokio::pin!(stop);
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (tcp, _) = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                // A full file table and the like: wait a little rather than spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue }
            },
        };
        let acceptor = acceptor.clone();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tcp.set_nodelay(true);
            let Ok(Ok(tls)) = tokio::time::timeout(CLIENT_DEADLINE, acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(route(req, &shared).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(CLIENT_DEADLINE)
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn route(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
        (&Method::POST, "/mutate") => {
            let body = Limited::new(req.into_body(), MAX_BODY);
            let bytes = match tokio::time::timeout(CLIENT_DEADLINE, body.collect()).await {
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(e)) => {
                    let msg = format!("the review is not read: {e} (at most {MAX_BODY} bytes)");
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "text/plain",
                        msg.into_bytes(),
                    );
                }
                Err(_) => {
                    return reply(
                        StatusCode::REQUEST_TIMEOUT,
                        "text/plain",
                        b"the review's body did not arrive in time\n".to_vec(),
                    )
                }
            };
            let r = match review::parse(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        "text/plain",
                        e.to_string().into_bytes(),
                    )
                }
            };
            let answer = match tokio::time::timeout(REVIEW_DEADLINE, admit(&r, shared)).await {
                Ok(v) => v,
                Err(_) => review::deny(
                    &r.uid,
                    500,
                    &format!(
                        "gpuslice-webhook: the API server did not answer within {}s",
                        REVIEW_DEADLINE.as_secs()
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
            b"gpuslice webhook: POST /mutate, GET /healthz\n".to_vec(),
        ),
    }
}

/// The answer to one review.
async fn admit(r: &review::Request, shared: &Shared) -> Value {
    if r.operation != "CREATE" || !r.object.is_object() {
        return review::allow(&r.uid, &[], &[]);
    }
    let hami = if shared.hami_compat && mentions_hami(&r.object) {
        match shared.cluster.hami_namespace(&r.namespace).await {
            Ok(h) => h,
            Err(e) => return review::deny(&r.uid, 500, &e.to_string()),
        }
    } else {
        false
    };
    let inventory = shared.cluster.inventory();
    let p = match plan(&r.object, &r.namespace, hami, &inventory) {
        Ok(p) => p,
        Err(e) => return review::deny(&r.uid, 400, &e.to_string()),
    };
    // A dry run creates nothing: the patch names the templates a real create would make.
    if !r.dry_run {
        for t in &p.templates {
            if let Err(e) = shared.cluster.ensure_template(t).await {
                return review::deny(&r.uid, 500, &e.to_string());
            }
        }
    }
    review::allow(&r.uid, &p.patch, &p.warnings)
}

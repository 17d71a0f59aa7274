//! The console's server: binds `--listen`, accepts connections up to `--max-connections`
//! and serves each with hyper under its [`Limits`]. At the cap a new connection takes the
//! slot of the one that has waited longest on its client (idle, a slow head or body, an
//! answer not read), so slow clients cannot hold every slot. `run_until_signal` is
//! `gpuslice console` itself.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{self, HeaderValue};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::client;

use super::http::{self, PublicUrl};
use super::options::{rights, Options};
use super::routes;
use super::state::State;
use gpuslice_conn::{serve_until_shed, Conn, Limits, Slots, TimedIo};

/// errno of "too many open files" (per process, system-wide).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// The console cannot start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("--prometheus `{url}` is not an http:// URL; accepted: http://HOST:PORT[/PATH], e.g. http://127.0.0.1:9090")]
    Prometheus { url: String },
    #[error(transparent)]
    PublicUrl(#[from] http::PublicUrlError),
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

/// A bound console, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    max_connections: usize,
    limits: Limits,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listen", &self.state.listen)
            .finish_non_exhaustive()
    }
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
    /// Checks `--prometheus` and `--public-url`, makes the API client and binds `--listen`.
    pub async fn bind(opts: &Options) -> Result<Server, WebError> {
        if let Some(url) = &opts.prometheus {
            check_prometheus(url)?;
        }
        let public = opts
            .public_url
            .iter()
            .map(|u| PublicUrl::parse(u))
            .collect::<Result<Vec<_>, _>>()?;
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
                hami_compat: opts.hami_compat,
                listen,
                public,
            }),
            max_connections: opts.max_connections as usize,
            limits: Limits::default(),
        })
    }

    /// The same server under other limits (the defaults: [`Limits::default`]).
    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.state.listen
    }

    /// Serves until `stop` completes.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), WebError> {
        let addr = self.state.listen;
        let slots = Slots::new(self.max_connections);
        tokio::pin!(stop);
        loop {
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
            // A slot for it: a free one, else the one of the connection that has waited
            // longest on its client. While every connection is serving, it waits (and
            // further ones wait unaccepted in the kernel's queue).
            let slot = tokio::select! {
                _ = &mut stop => return Ok(()),
                s = slots.take() => s,
            };
            let (state, limits) = (self.state.clone(), self.limits);
            tokio::spawn(async move {
                // The slot frees when the task ends (also on a panic).
                serve_connection(state, limits, stream, slot.conn()).await;
            });
        }
    }
}

/// Serves one connection with hyper until it ends, a limit closes it, or the accept loop
/// sheds it while it waits on its client.
async fn serve_connection(state: Arc<State>, limits: Limits, stream: TcpStream, conn: &Conn) {
    let activity = conn.activity().clone();
    let answered = Arc::new(AtomicU32::new(0));
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req| {
            let (state, activity, answered) = (state.clone(), activity.clone(), answered.clone());
            async move {
                let mut resp = routes::handle(&state, &limits, &activity, req).await;
                // The last request a connection may make: its answer closes it, and
                // requests pipelined behind it are not read.
                if answered.fetch_add(1, Ordering::Relaxed) + 1 >= limits.requests_per_connection {
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let io = TimedIo::new(stream, activity.clone(), limits.write);
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head)
        .serve_connection(TokioIo::new(io), service);
    serve_until_shed(conn, served).await;
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

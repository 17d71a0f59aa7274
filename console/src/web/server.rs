//! The console's server: binds `--listen`, accepts connections up to `--max-connections`
//! and serves each with hyper under the head timeout; `run_until_signal` is
//! `gpuslice console` itself.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::client;

use super::options::{rights, Options};
use super::routes;
use super::state::State;

/// A request head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
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
                    async move { Ok::<_, Infallible>(routes::handle(&state, req).await) }
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

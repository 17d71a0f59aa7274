//! The exporter's HTTP side: answers `/metrics` with a fresh collection, `/healthz` with
//! `ok`, and everything else with 404 — and stays available whatever its clients do. It is
//! hyper's HTTP/1.1 on a single-threaded tokio runtime: every connection is a task with a
//! bounded request head ([`MAX_HEAD`], else 431), a deadline for the head and for any read
//! or write that makes no progress ([`HEAD_TIMEOUT`], [`STALL_TIMEOUT`]); at most
//! [`MAX_CONNECTIONS`] are served at once (more are answered 503 and closed), and a failed
//! accept (the fd limit: EMFILE) is logged and retried after a pause, never fatal.
//! Collections run one at a time on the serving thread, so they never overlap.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Sleep;

use crate::collect::Collector;
use crate::encode::{encode, Format};

/// Connections served at once; more are answered 503 and closed. Prometheus needs one per
/// scraper; the bound keeps memory (a head buffer and a reply each) and descriptors small.
pub const MAX_CONNECTIONS: usize = 64;
/// The largest request head read (hyper's smallest buffer); a longer one is answered 431.
pub const MAX_HEAD: usize = 16 << 10;
/// A request head must arrive within this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A read or write that makes no progress for this long closes the connection: a client that
/// stops reading its replies, or a keep-alive connection left idle.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after a failed accept (the fd limit), before the next try.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The HTTP server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot listen on {addr}: {detail}; pass a free address with --listen or set serve.listen"
    )]
    Bind { addr: SocketAddr, detail: String },
    #[error("the HTTP server on {addr} stopped: {source}")]
    Accept {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// An answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

const TEXT: &str = "text/plain; charset=utf-8";

fn plain(status: u16, body: &str) -> Reply {
    Reply {
        status,
        content_type: TEXT,
        body: body.to_string(),
    }
}

/// Answers `method url` (with the request's `Accept` header) from `collector`.
pub fn route(collector: &mut Collector, method: &Method, url: &str, accept: Option<&str>) -> Reply {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let readable = matches!(*method, Method::GET | Method::HEAD);
    match path {
        "/metrics" | "/healthz" | "/" if !readable => plain(405, "only GET and HEAD\n"),
        "/metrics" => {
            let format = Format::negotiate(accept);
            let scrape = collector.collect(Instant::now());
            Reply {
                status: 200,
                content_type: format.content_type(),
                body: encode(&scrape, collector.errors(), format),
            }
        }
        "/healthz" => plain(200, "ok\n"),
        "/" => plain(
            200,
            "gpuslice exporter\n/metrics  Prometheus metrics\n/healthz  liveness\n",
        ),
        _ => plain(404, "not found; try /metrics or /healthz\n"),
    }
}

/// A bound listening socket.
#[derive(Debug)]
pub struct Server {
    listener: std::net::TcpListener,
}

/// Starts listening on `addr` (port 0 picks a free port; see [`local_addr`]).
pub fn bind(addr: SocketAddr) -> Result<Server, HttpError> {
    let err = |e: std::io::Error| HttpError::Bind {
        addr,
        detail: e.to_string(),
    };
    let listener = std::net::TcpListener::bind(addr).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(Server { listener })
}

/// The address a server listens on.
pub fn local_addr(server: &Server) -> Option<SocketAddr> {
    server.listener.local_addr().ok()
}

/// One request handed to the collecting loop, and where its answer goes.
struct Job {
    method: Method,
    path: String,
    accept: Option<String>,
    reply: oneshot::Sender<Reply>,
}

/// Serves requests for as long as the process runs; fails only when the runtime or the
/// listener cannot be set up.
pub fn serve(server: &Server, collector: &mut Collector) -> Result<(), HttpError> {
    let addr = local_addr(server).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    let fail = |source| HttpError::Accept { addr, source };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(fail)?;
    let local = tokio::task::LocalSet::new();
    let std_listener = server.listener.try_clone().map_err(fail)?;
    local.block_on(&runtime, async {
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(fail)?;
        let (jobs, mut queue) = mpsc::channel::<Job>(MAX_CONNECTIONS);
        tokio::task::spawn_local(accept_loop(listener, addr, jobs));
        // The accept loop holds the sender for ever, so this runs as long as the process.
        while let Some(job) = queue.recv().await {
            let reply = route(collector, &job.method, &job.path, job.accept.as_deref());
            let _ = job.reply.send(reply);
        }
        Ok(())
    })
}

/// Accepts connections for ever: each one a task while under the bound, else refused.
async fn accept_loop(listener: tokio::net::TcpListener, addr: SocketAddr, jobs: mpsc::Sender<Job>) {
    // Every live connection task holds a clone; the count is the number served.
    let live = Rc::new(());
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                stream
            }
            Err(e) => {
                // EMFILE/ENFILE, ENOBUFS, a connection aborted in the backlog: wait for
                // descriptors to be freed. Logged once per run of failures.
                if !failing {
                    eprintln!(
                        "gpuslice serve: cannot accept a connection on {addr}: {e}; retrying every {} ms",
                        ACCEPT_BACKOFF.as_millis()
                    );
                    failing = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if Rc::strong_count(&live) > MAX_CONNECTIONS {
            refuse(stream);
            continue;
        }
        // Replies go out in one write; no waiting for the client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let token = live.clone();
        let jobs = jobs.clone();
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| answer(req, jobs.clone()));
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .keep_alive(true);
            // A client that misbehaves or goes away is its own problem, not the exporter's.
            let _ = http
                .serve_connection(TokioIo::new(Stalls::new(stream)), service)
                .await;
            drop(token);
        });
    }
}

/// Answers a connection over the bound with 503 (as far as the socket takes it without
/// waiting) and closes it.
fn refuse(stream: TcpStream) {
    let _ = stream.try_write(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
          content-length: 28\r\nconnection: close\r\n\r\ntoo many connections; retry\n",
    );
}

/// Hands one request to the collecting loop and turns its reply into a response.
async fn answer(
    req: Request<Incoming>,
    jobs: mpsc::Sender<Job>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (reply, answered) = oneshot::channel();
    let job = Job {
        method: req.method().clone(),
        path: req.uri().path().to_string(),
        accept: req
            .headers()
            .get(ACCEPT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        reply,
    };
    let reply = match jobs.send(job).await {
        Ok(()) => answered.await.ok(),
        Err(_) => None,
    }
    .unwrap_or_else(|| plain(503, "the exporter is stopping\n"));
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() =
        hyper::StatusCode::from_u16(reply.status).unwrap_or(hyper::StatusCode::OK);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    Ok(response)
}

/// A socket whose reads and writes fail with `TimedOut` once they have waited
/// [`STALL_TIMEOUT`] without progress.
struct Stalls {
    io: TcpStream,
    read: Option<Pin<Box<Sleep>>>,
    write: Option<Pin<Box<Sleep>>>,
}

impl Stalls {
    fn new(io: TcpStream) -> Stalls {
        Stalls {
            io,
            read: None,
            write: None,
        }
    }
}

/// `polled` on the socket: progress disarms `deadline`; waiting arms it, and past it the
/// operation fails.
fn within<T>(
    polled: Poll<std::io::Result<T>>,
    deadline: &mut Option<Pin<Box<Sleep>>>,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<T>> {
    match polled {
        Poll::Ready(r) => {
            *deadline = None;
            Poll::Ready(r)
        }
        Poll::Pending => {
            let timer = deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(STALL_TIMEOUT)));
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no progress within the stall timeout",
                ))),
                Poll::Pending => Poll::Pending,
            }
        }
    }
}

impl AsyncRead for Stalls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        within(polled, &mut this.read, cx)
    }
}

impl AsyncWrite for Stalls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        within(polled, &mut this.write, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        within(polled, &mut this.write, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        within(polled, &mut this.write, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        within(polled, &mut this.write, cx)
    }
}

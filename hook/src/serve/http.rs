//! The exporter's HTTP side: a small synchronous server (tiny_http, no async runtime) that
//! answers `/metrics` with a fresh collection, `/healthz` with `ok`, and everything else
//! with 404. Requests are handled one at a time, so collections never overlap.

use std::net::SocketAddr;
use std::time::Instant;

use tiny_http::{Header, Method, Response, Server};

use crate::serve::collect::Collector;
use crate::serve::encode::{encode, Format};

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
    let readable = matches!(method, Method::Get | Method::Head);
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

/// Starts listening on `addr` (port 0 picks a free port; see [`local_addr`]).
pub fn bind(addr: SocketAddr) -> Result<Server, HttpError> {
    let err = |detail: String| HttpError::Bind { addr, detail };
    let listener = std::net::TcpListener::bind(addr).map_err(|e| err(e.to_string()))?;
    // tiny_http writes responses in 1 KiB pieces: with Nagle's algorithm the last piece of
    // a scrape waits for the scraper's delayed ACK (up to 40 ms). Accepted sockets inherit
    // TCP_NODELAY from the listener.
    rustix::net::sockopt::set_tcp_nodelay(&listener, true).map_err(|e| err(e.to_string()))?;
    Server::from_listener(listener, None).map_err(|e| err(e.to_string()))
}

/// The address a server listens on.
pub fn local_addr(server: &Server) -> Option<SocketAddr> {
    server.server_addr().to_ip()
}

/// Serves requests until the listener fails.
pub fn serve(server: &Server, collector: &mut Collector) -> Result<(), HttpError> {
    let addr = local_addr(server).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    loop {
        let request = server
            .recv()
            .map_err(|source| HttpError::Accept { addr, source })?;
        let accept = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Accept"))
            .map(|h| h.value.as_str().to_string());
        let reply = route(
            collector,
            request.method(),
            request.url(),
            accept.as_deref(),
        );
        let mut response = Response::from_string(reply.body).with_status_code(reply.status);
        if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], reply.content_type.as_bytes()) {
            response = response.with_header(h);
        }
        // A client that went away is its own problem, not the exporter's.
        let _ = request.respond(response);
    }
}

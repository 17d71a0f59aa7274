//! Hostile clients cannot silence the webhook: a client that pipelines requests and never
//! reads the answers is dropped after the write deadline; while more such clients than the
//! connection cap hold connections, a new client is still answered (the one waited on
//! longest is shed); an idle connection is closed after the idle (head) deadline; a body
//! declared larger than the limit is refused with 413 at once. The real server over real
//! TLS on 127.0.0.1, with short deadlines through its `Options`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_webhook::budget::{Ledger, Recount};
use gpuslice_webhook::cluster::Cluster;
use gpuslice_webhook::server::MAX_BODY;
use gpuslice_webhook::tls::server_config;
use gpuslice_webhook::{serve_with, Limits, Options};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};

use crate::server::pair;

/// How long a test waits for what must happen well within it.
const WAIT: Duration = Duration::from_secs(20);
const LONG: Duration = Duration::from_secs(120);

/// A webhook served on 127.0.0.1 by a runtime of its own, stopped on drop.
pub struct Webhook {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(opts: Options) -> Webhook {
    // Nothing listens on port 9: the inventory stays empty.
    start_against("https://127.0.0.1:9", opts)
}

/// A webhook whose API server is at `api`.
pub fn start_against(api: &str, opts: Options) -> Webhook {
    start_recounting(api, opts, None)
}

/// A runtime of two worker threads, as the webhook's own.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The webhook's view of the cluster whose API server is at `api` (the fake one).
pub async fn cluster_of(api: &str) -> Cluster {
    let config = kube::Config::new(api.parse().unwrap());
    Cluster::start(
        kube::Client::try_from(config).unwrap(),
        gpuslice_webhook::sweep::DEFAULT_GRACE,
    )
    .await
}

/// A webhook whose API server is at `api`, which also runs the budget recount as
/// `gpuslice webhook` does (sharing the admissions' watched quotas) when `recount` gives its
/// interval and window.
pub fn start_recounting(
    api: &str,
    opts: Options,
    recount: Option<(Duration, Duration)>,
) -> Webhook {
    let api = api.to_string();
    let dir = tempfile::tempdir().unwrap();
    let tls = server_config(pair(dir.path(), "localhost")).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = runtime();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let cluster = cluster_of(&api).await;
            let ledger = Ledger::watching(cluster, false);
            if let Some((every, window)) = recount {
                let r = Recount::new(ledger.clone(), every, None).with_window(window);
                tokio::spawn(r.run());
            }
            serve_with(listener, tls, ledger, opts, async {
                let _ = stopped.await;
            })
            .await;
        });
        // Connections still open end with the runtime.
        rt.shutdown_background();
    });
    Webhook {
        addr: rx.recv_timeout(WAIT).unwrap(),
        stop: Some(stop),
        thread: Some(thread),
        _dir: dir,
    }
}

/// Options whose deadlines do not end a test unless it shortens one.
pub fn patient() -> Options {
    let d = Options::default();
    Options {
        handshake: LONG,
        limits: Limits {
            head: LONG,
            body: LONG,
            write: LONG,
            requests_per_connection: u32::MAX,
        },
        ..d
    }
}

/// Accepts the test server's self-signed certificate (signatures still checked).
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// A TLS session over `tcp`, handshaken.
fn handshake(mut tcp: TcpStream) -> std::io::Result<(ClientConnection, TcpStream)> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = ClientConnection::new(client_config(), name).map_err(std::io::Error::other)?;
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp)?;
    }
    Ok((tls, tcp))
}

/// A client over TLS that reads its answers.
fn connect(addr: SocketAddr) -> rustls::StreamOwned<ClientConnection, TcpStream> {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    tcp.set_write_timeout(Some(WAIT)).unwrap();
    let (tls, tcp) = handshake(tcp).unwrap();
    rustls::StreamOwned::new(tls, tcp)
}

/// One HTTP/1.1 answer: status and body (by Content-Length).
fn answer(s: &mut impl Read) -> (u16, String, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).unwrap();
        assert_eq!(n, 1, "the connection closed mid-answer: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

fn review(uid: &str) -> String {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "namespace": "default", "operation": "CREATE",
                    "object": {"metadata": {"name": "p"},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    })
    .to_string()
}

/// The webhook answers this client a health check and a review.
fn answered(addr: SocketAddr) {
    let mut s = connect(addr);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
        .unwrap();
    assert_eq!(answer(&mut s).2, "ok\n");
    let v = post_review(&mut s, &review("fresh"));
    assert_eq!(v["response"]["uid"], "fresh", "{v}");
}

/// The webhook's answer (200, an AdmissionReview) to the review `body` sent on `s`.
fn post_review(s: &mut (impl Read + Write), body: &str) -> serde_json::Value {
    write!(
        s,
        "POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (status, _, body) = answer(s);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The webhook at `addr`'s answer to the review `body`, on a connection of its own.
pub fn reviewed(addr: SocketAddr, body: &str) -> serde_json::Value {
    post_review(&mut connect(addr), body)
}

/// A connection to `addr` (IPv4) that takes little unread data: a small receive buffer and
/// small segments, so the server's writes to it stall after some KiB, as they would to a
/// client that stops reading over a real network (loopback's 64 KiB segments would let the
/// kernel buffer megabytes first).
fn small_window_connection(addr: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else {
        panic!("{addr} is not IPv4")
    };
    let int = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; every pointer is to a
    // valid local of the size passed; the descriptor moves into the TcpStream at once.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        for (level, opt, value) in [
            (libc::SOL_SOCKET, libc::SO_RCVBUF, 4096),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG, 536),
        ] {
            let v: libc::c_int = value;
            let r = libc::setsockopt(fd, level, opt, (&v as *const libc::c_int).cast(), int);
            assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
        }
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "connect {addr}: {}", std::io::Error::last_os_error());
        stream
    }
}

/// A client that handshakes, then pipelines health checks and never reads an answer, on a
/// thread of its own; `gone` is told when the webhook dropped it (a write failed).
fn pipeliner(addr: SocketAddr, gone: mpsc::Sender<()>) {
    std::thread::spawn(move || {
        let run = || -> std::io::Result<()> {
            let (mut tls, mut tcp) = handshake(small_window_connection(addr))?;
            let batch = b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n".repeat(64);
            loop {
                tls.writer().write_all(&batch)?;
                // Only writes: the answers are never read.
                while tls.wants_write() {
                    tls.write_tls(&mut tcp)?;
                }
            }
        };
        let _ = run();
        let _ = gone.send(());
    });
}

#[test]
fn a_client_that_pipelines_and_never_reads_is_dropped_after_the_write_deadline() {
    let mut opts = patient();
    opts.limits.write = Duration::from_millis(300);
    let w = start(opts);
    let (tx, gone) = mpsc::channel();
    pipeliner(w.addr, tx);
    gone.recv_timeout(WAIT)
        .expect("the client that never reads still holds its connection");
    answered(w.addr);
}

#[test]
fn with_every_slot_held_by_clients_that_never_read_a_new_client_is_answered() {
    let mut opts = patient();
    opts.max_connections = 4;
    let w = start(opts);
    let (tx, gone) = mpsc::channel();
    let clients = opts.max_connections + 2;
    for _ in 0..clients {
        pipeliner(w.addr, tx.clone());
    }
    // Each client past the cap took the slot of one waited on longest.
    for _ in opts.max_connections..clients {
        gone.recv_timeout(WAIT)
            .expect("a client past the cap was not served (no slot was shed)");
    }
    // The write deadline is long: the slots stay held, and the new client sheds one too.
    answered(w.addr);
    gone.recv_timeout(WAIT)
        .expect("the new client was served without shedding a held slot");
}

#[test]
fn an_idle_connection_is_closed_after_the_idle_deadline() {
    let mut opts = patient();
    opts.limits.head = Duration::from_millis(300);
    opts.handshake = Duration::from_millis(300);
    let w = start(opts);
    // Answered, then nothing more sent: closed.
    let mut s = connect(w.addr);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
        .unwrap();
    assert_eq!(answer(&mut s).0, 200);
    let mut rest = Vec::new();
    let end = s.read_to_end(&mut rest);
    assert!(
        !matches!(&end, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "still open after {WAIT:?}"
    );
    assert!(rest.is_empty(), "{rest:?}");
    // Connected and silent (no handshake): closed.
    let mut tcp = TcpStream::connect(w.addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let n = tcp.read(&mut [0u8; 1]);
    assert!(
        matches!(n, Ok(0))
            || matches!(&n, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{n:?}"
    );
}

#[test]
fn a_body_declared_over_the_limit_is_refused_at_once() {
    let w = start(patient());
    let mut s = connect(w.addr);
    // The body is never sent: the answer cannot wait on it (the body deadline is long).
    write!(
        s,
        "POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY + 1
    )
    .unwrap();
    let (status, head, body) = answer(&mut s);
    assert_eq!(status, 413, "{head}{body}");
    assert!(
        body.contains(&format!("larger than {MAX_BODY} bytes")),
        "{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
}

#[test]
fn bodies_that_never_finish_hold_no_memory_a_new_review_needs() {
    let mut opts = patient();
    opts.max_body = 64 << 10;
    opts.body_budget = 2 * opts.max_body;
    let w = start(opts);
    // Three clients declare the largest body, send a little of it and stall: the budget
    // holds two; a body that finds it spent sheds the holder waited on longest.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut s = connect(w.addr);
        write!(
            s,
            "POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"request\":",
            opts.max_body
        )
        .unwrap();
        stalled.push(s);
    }
    // A new review is read and answered, whatever the stalled bodies hold.
    answered(w.addr);
    // A holder was shed for a newer body: its connection closed unanswered. Which one, and
    // whether the third body or the new review shed it (or both, one each), is the order in
    // which the server began reading the bodies: usually the order of connection, not always
    // on a loaded machine. So the stalled connections are read in order until one ended;
    // only one still held waits out WAIT.
    let shed = stalled.iter_mut().any(|s| {
        let mut rest = Vec::new();
        let end = s.read_to_end(&mut rest);
        let held = matches!(&end, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
        !held
    });
    assert!(
        shed,
        "every stalled body still holds its share after {WAIT:?}"
    );
}

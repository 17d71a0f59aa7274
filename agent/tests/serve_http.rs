//! The exporter over HTTP: `/metrics` in the Prometheus text format that
//! `promtool check metrics` accepts (acceptance 2), OpenMetrics for scrapers that ask for it,
//! `/healthz`, and 404/405 for the rest — against a real listening socket.

use crate::serve_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_agent::gpu::{DeviceReading, GpuProcess, Reading};
use serve_common::{fake_process, parse, uuid, Exporter, FakeMeter, Node, GI};

/// A node with a Kubernetes slice holding memory, a throttled slice and a pending one, and
/// a meter that sees both GPUs.
fn populated() -> (Node, Vec<gpuslice_slice::usage::UsageFile>, FakeMeter) {
    let node = Node::new(2);
    let a = node.slice(
        4 * GI,
        0,
        0,
        Some(("ctr-a", 4000)),
        Some(("team", "trainer-0", "main")),
    );
    let b = node.slice(2 * GI, 30, 1, Some(("ctr-b", 4100)), None);
    node.slice(GI, 0, 1, None, None);
    fake_process(node.proc.path(), "4000", 4026532001, 1, "0::/a\n");
    fake_process(node.proc.path(), "5007", 4026532001, 7, "0::/a\n");
    let held = vec![
        node.hold(&a, 4026532001, 7, GI),
        node.hold(&b, 4026532002, 1, GI / 2),
    ];
    let meter = FakeMeter::default();
    *meter.0.lock().unwrap() = Reading {
        devices: (0..2)
            .map(|i| DeviceReading {
                index: i,
                uuid: uuid(i),
                model: "NVIDIA H200".into(),
                memory_total: Some(10 * GI),
                memory_used: Some(GI),
                utilization: Some(0.5),
                processes: Some(vec![GpuProcess {
                    pid: 5007,
                    used: Some(GI),
                }]),
            })
            .collect(),
        errors: vec![],
    };
    (node, held, meter)
}

/// A raw HTTP/1.0 exchange: status code, headers (lower-cased names), body.
fn get(addr: SocketAddr, method: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: x\r\n");
    if let Some(a) = accept {
        req.push_str(&format!("Accept: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn promtool_accepts_the_text_output() {
    let (node, _held, meter) = populated();
    let mut c = node.collector(Some(meter));
    // Two scrapes, so every family (the achieved share too) has series.
    let t0 = Instant::now();
    c.collect(t0);
    let s = c.collect(t0 + std::time::Duration::from_secs(2));
    let text = gpuslice_agent::encode::encode(&s, c.errors(), gpuslice_agent::encode::Format::Text);
    assert!(
        text.contains("gpuslice_slice_compute_used_ratio{"),
        "{text}"
    );
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) must be installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Conventions promtool does not check: every name is ours, counters end in _total,
    // byte and ratio figures carry their unit.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut f = line.split(' ').skip(2);
        let (name, kind) = (f.next().unwrap(), f.next().unwrap());
        assert!(name.starts_with("gpuslice_"), "{line}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
    }
    for s in parse(&text) {
        if s.name.contains("memory") {
            assert!(s.name.ends_with("_bytes"), "{}", s.name);
        }
        if s.name.contains("utilization")
            || s.name.contains("cores")
            || s.name.contains("compute_used")
            || s.name.contains("compute_limit")
        {
            assert!(s.name.ends_with("_ratio"), "{}", s.name);
            assert!((0.0..=1.0).contains(&s.value), "{} {}", s.name, s.value);
        }
    }
}

#[test]
fn serves_metrics_healthz_and_refuses_the_rest() {
    let (node, _held, meter) = populated();
    let mut c = node.collector(Some(meter));
    let server = gpuslice_agent::http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = gpuslice_agent::http::local_addr(&server).unwrap();
    assert_ne!(addr.port(), 0);
    std::thread::spawn(move || {
        let _ = gpuslice_agent::http::serve(&server, &mut c);
    });

    let (status, head, body) = get(addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(body.contains("gpuslice_slice_memory_used_bytes{"), "{body}");
    assert!(!body.contains("# EOF"));

    // Prometheus asks for OpenMetrics first.
    let (status, head, body) = get(
        addr,
        "GET",
        "/metrics?x=1",
        Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    );
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(
        body.contains("# UNIT gpuslice_gpu_memory_total_bytes bytes"),
        "{body}"
    );
    assert!(body.contains("gpuslice_reaped_total{"), "{body}");

    let (status, _, body) = get(addr, "GET", "/healthz", None);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(get(addr, "GET", "/nope", None).0, 404);
    assert_eq!(get(addr, "POST", "/metrics", None).0, 405);

    // A broken registry between scrapes: still 200, the error counted.
    std::fs::write(node.state.path().join("registry.json"), "][").unwrap();
    let (status, _, body) = get(addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let s = parse(&body);
    assert_eq!(
        serve_common::value(
            &s,
            "gpuslice_exporter_errors_total",
            &[("source", "registry")]
        ),
        1.0
    );
}

#[test]
fn negotiation_prefers_openmetrics_only_when_asked() {
    use gpuslice_agent::encode::Format;
    assert_eq!(Format::negotiate(None), Format::Text);
    assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
    assert_eq!(
        Format::negotiate(Some("text/plain;version=0.0.4")),
        Format::Text
    );
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text; version=1.0.0")),
        Format::OpenMetrics
    );
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;q=0,text/plain")),
        Format::Text
    );
}

// Availability, against the `gpuslice serve` binary.

/// How many connections the exporter serves at once.
const BOUND: usize = 64;

/// Connections the test keeps open; those that fail to connect (a full backlog) are left out.
fn open_many(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

/// Whether the server has closed `s` (EOF, a reset, or a refusal answer followed by EOF).
fn closed_by_server(mut s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a 503 ahead of the close
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn keeps_serving_at_the_file_descriptor_limit() {
    // 48 descriptors: the runtime, the listener and the collector take a few, so 100
    // connections run the process out (EMFILE on accept); the rest wait in the backlog.
    let mut ex = Exporter::start(Some(48));
    ex.healthy_within(Duration::from_secs(30)).unwrap();
    let conns = open_many(ex.addr, 100);
    assert!(conns.len() > 48, "only {} connections opened", conns.len());
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end
        && ex.alive()
        && !ex.log.lock().unwrap().contains("Too many open files")
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let log = ex.log.lock().unwrap().clone();
    assert!(ex.alive(), "gpuslice serve exited at the fd limit: {log}");
    assert!(
        log.contains("Too many open files"),
        "the fd limit was not reached: {log}"
    );
    drop(conns);
    ex.healthy_within(Duration::from_secs(30)).unwrap();
    assert!(ex.alive());
}

#[test]
fn a_pipelining_client_that_never_reads_stalls_no_one() {
    let ex = Exporter::start(None);
    ex.healthy_within(Duration::from_secs(30)).unwrap();
    let mut hog = TcpStream::connect(ex.addr).unwrap();
    hog.set_nonblocking(true).unwrap();
    let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    // Pipeline requests until both directions are full (1 s of would-block), 256 MiB at most.
    let (mut sent, mut blocked) = (0usize, 0);
    while blocked < 20 && sent < 256 << 20 {
        match hog.write(req) {
            Ok(n) => {
                sent += n;
                blocked = 0;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                blocked += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the pipelining client was cut off before its buffers filled: {e}"),
        }
    }
    // Scrapes meanwhile are answered (each within a generous read timeout).
    for path in ["/healthz", "/metrics"] {
        let (status, _) = ex
            .get(path, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{path} beside a non-reading client: {e}"));
        assert_eq!(status, 200, "{path}");
    }
    // And the non-reader is dropped once its writes stall past the timeout.
    let end = Instant::now() + Duration::from_secs(90);
    let mut cut = false;
    while Instant::now() < end && !cut {
        match hog.write(req) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(_) => cut = true,
        }
    }
    assert!(
        cut,
        "a client that never reads kept its connection for 90 s"
    );
}

#[test]
fn endless_request_headers_are_cut_off_and_memory_stays_bounded() {
    let ex = Exporter::start(None);
    ex.healthy_within(Duration::from_secs(30)).unwrap();
    // 30 clients each send a 4 MiB header line (the issue saw 30 x 2 MiB pass 64 MiB RSS).
    let clients: Vec<_> = (0..30)
        .map(|_| {
            let addr = ex.addr;
            std::thread::spawn(move || -> Result<(), String> {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Fill: ";
                let chunk = vec![b'a'; 64 << 10];
                // Writes may all land in socket buffers or fail once the server has closed.
                let mut sent = 0;
                if s.write_all(head).is_ok() {
                    while sent < 4 << 20 && s.write_all(&chunk).is_ok() {
                        sent += chunk.len();
                    }
                }
                // Cut off: a 431, or the connection closed or reset, long before the timeout.
                let mut buf = [0u8; 64];
                match s.read(&mut buf) {
                    Ok(n) if n == 0 || buf[..n].starts_with(b"HTTP/1.1 431") => Ok(()),
                    Ok(n) => Err(format!("answered {:?}", String::from_utf8_lossy(&buf[..n]))),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        Err(format!(
                            "still reading the header after {sent} bytes and 30 s"
                        ))
                    }
                    Err(_) => Ok(()),
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap().unwrap();
    }
    // The DaemonSet's limit is 64 MiB; a fresh exporter holds well under 16 MiB here and the
    // header bound is 16 KiB a connection, so the peak stays far below half the limit.
    let peak = ex.status_kib("VmHWM");
    assert!(peak < 32 << 10, "peak RSS {peak} KiB");
    ex.healthy_within(Duration::from_secs(30)).unwrap();
}

#[test]
fn connections_beyond_the_bound_are_refused_and_the_server_stays_up() {
    let mut ex = Exporter::start(None);
    ex.healthy_within(Duration::from_secs(30)).unwrap();
    let extra = 50;
    let conns = open_many(ex.addr, BOUND + extra);
    assert_eq!(conns.len(), BOUND + extra);
    let end = Instant::now() + Duration::from_secs(30);
    let mut closed = 0;
    while Instant::now() < end {
        closed = conns.iter().filter(|s| closed_by_server(s)).count();
        if closed >= extra {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        closed >= extra,
        "{closed} of {} connections refused",
        conns.len()
    );
    assert!(ex.alive());
    drop(conns);
    ex.healthy_within(Duration::from_secs(30)).unwrap();
}

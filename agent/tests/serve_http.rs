//! The exporter over HTTP: `/metrics` in the Prometheus text format that
//! `promtool check metrics` accepts (acceptance 2), OpenMetrics for scrapers that ask for it,
//! `/healthz`, and 404/405 for the rest — against a real listening socket.

use crate::serve_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use gpuslice_agent::gpu::{DeviceReading, GpuProcess, Reading};
use serve_common::{fake_process, parse, uuid, FakeMeter, Node, GI};

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
                    sm: None,
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

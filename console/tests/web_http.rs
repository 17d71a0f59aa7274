//! The web console's HTTP hygiene, over real sockets: a console started in-process against
//! a kubeconfig whose API server is a closed port (the pages then show the `api` banner
//! instead of hanging), asked with raw HTTP/1.1 requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use gpuslice_console::web::{Options, Server, CSP};

/// A console on a free loopback port; the temp dir holds its kubeconfig.
fn start(allow_edit: bool) -> (SocketAddr, tempfile::TempDir) {
    start_with(allow_edit, 256)
}

/// [`start`] serving at most `max_connections` connections at once.
fn start_with(allow_edit: bool, max_connections: u32) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // Port 1 on loopback: nothing listens, connections are refused at once.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n\
users: [{name: tester, user: {token: t}}]\n\
contexts: [{name: test, context: {cluster: c, user: tester, namespace: ml}}]\n",
    )
    .unwrap();
    let opts = Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        kubeconfig: Some(kubeconfig),
        context: None,
        prometheus: None,
        allow_edit,
        max_connections,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = Server::bind(&opts).await.unwrap();
            tx.send(server.local_addr()).unwrap();
            server.run(std::future::pending()).await.unwrap();
        });
    });
    (rx.recv_timeout(Duration::from_secs(20)).unwrap(), dir)
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `head` (lines without the final blank line) and `body`, reads the whole answer.
fn send(addr: SocketAddr, head: &str, body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    // The server may answer (and close) before reading all of a refused body.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    send(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}"), b"")
}

fn post(addr: SocketAddr, path: &str, extra: &str, body: &str) -> Answer {
    send(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}{extra}",
            body.len()
        ),
        body.as_bytes(),
    )
}

/// A refusal is one line.
fn one_line(a: &Answer) -> &str {
    assert_eq!(a.body.matches('\n').count(), 1, "{:?}", a.body);
    assert!(a.header("content-type").unwrap().starts_with("text/plain"));
    a.body.trim_end()
}

fn assert_security_headers(a: &Answer) {
    assert_eq!(a.header("content-security-policy"), Some(CSP));
    assert_eq!(
        CSP,
        "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'"
    );
    assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(a.header("cache-control"), Some("no-store"));
}

const FORM: &str = "application/x-www-form-urlencoded";

#[test]
fn pages_show_the_api_banner_when_the_api_server_is_down() {
    let (addr, _dir) = start(false);
    for path in [
        "/",
        "/?available=1",
        "/pods",
        "/pods?namespace=ml",
        "/workloads",
        "/nodes/n1",
    ] {
        let a = get(addr, path);
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        assert_security_headers(&a);
        assert!(a.header("content-type").unwrap().starts_with("text/html"));
        assert!(
            a.body
                .contains("<div class=\"source-missing\" data-source=\"api\">API server: "),
            "{path}: {}",
            a.body
        );
        assert!(a.body.contains("<p id=\"mode\">read-only"), "{path}");
        assert!(
            a.body.contains("<p id=\"rights\">Acts with the rights of kubeconfig context `test` (user `tester`)"),
            "{path}"
        );
        for nav in [
            "<a href=\"/\">Nodes</a>",
            "<a href=\"/pods\">Pods</a>",
            "<a href=\"/workloads\">Workloads</a>",
        ] {
            assert!(a.body.contains(nav), "{path}: {nav}");
        }
    }
    let a = get(addr, "/pods");
    assert!(a.body.contains("data-source=\"cadvisor\""), "{}", a.body);
    // localhost names the loopback console too.
    let a = send(
        addr,
        &format!("GET / HTTP/1.1\r\nHost: localhost:{}", addr.port()),
        b"",
    );
    assert_eq!(a.status, 200);
    let css = get(addr, "/static/console.css");
    assert_eq!(css.status, 200);
    assert!(css.header("content-type").unwrap().starts_with("text/css"));
    assert_security_headers(&css);
    let head = send(addr, &format!("HEAD / HTTP/1.1\r\nHost: {addr}"), b"");
    assert_eq!((head.status, head.body.as_str()), (200, ""));
}

#[test]
fn requests_not_naming_the_console_are_refused() {
    let (addr, _dir) = start(true);
    let a = send(addr, "GET / HTTP/1.1\r\nHost: rebind.example:8080", b"");
    assert_eq!(a.status, 421);
    assert_security_headers(&a);
    let line = one_line(&a);
    assert!(
        line.contains("rebind.example:8080") && line.contains(&addr.to_string()),
        "{line}"
    );
    let a = send(
        addr,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{}", addr.port() ^ 1),
        b"",
    );
    assert_eq!(a.status, 421);
    let a = send(addr, "GET / HTTP/1.0", b"");
    assert_eq!(a.status, 400);
    assert!(one_line(&a).starts_with("no Host header"));
    // Even a well-formed action with a foreign Host.
    let a = send(
        addr,
        &format!("POST /workloads/ml/deployment/x/release HTTP/1.1\r\nHost: rebind.example\r\nOrigin: http://rebind.example\r\nContent-Type: {FORM}\r\nContent-Length: 0"),
        b"",
    );
    assert_eq!(a.status, 421);
}

#[test]
fn paths_methods_and_names_are_checked() {
    let (addr, _dir) = start(false);
    let a = get(addr, "/nope");
    assert_eq!(a.status, 404);
    assert!(one_line(&a).starts_with("no page /nope"));
    assert_security_headers(&a);
    let a = send(
        addr,
        &format!("PUT / HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0"),
        b"",
    );
    assert_eq!(a.status, 405);
    assert_eq!(a.header("allow"), Some("GET, HEAD"));
    one_line(&a);
    let a = get(addr, "/workloads/ml/deployment/x/allocate");
    assert_eq!(a.status, 405);
    assert_eq!(a.header("allow"), Some("POST"));
    for bad in [
        "/workloads/..%2f../x/y",
        "/workloads/ml/deployment/..%2f..%2fsecrets",
        "/workloads/ml/replicaset/x",
        "/nodes/%3Cscript%3E",
        "/pods?namespace=..%2fkube-system",
        "/workloads?namespace=Not_A_Namespace",
    ] {
        let a = get(addr, bad);
        assert_eq!(a.status, 400, "{bad}: {}", a.body);
        let line = one_line(&a);
        assert!(line.contains("is not valid: accepted"), "{bad}: {line}");
        assert!(!line.contains('<'), "{line}");
    }
}

#[test]
fn actions_need_allow_edit() {
    let (addr, _dir) = start(false);
    let origin = format!("\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}");
    let a = post(
        addr,
        "/workloads/ml/deployment/x/allocate",
        &origin,
        "memory=8Gi",
    );
    assert_eq!(a.status, 403);
    assert_eq!(
        one_line(&a),
        "read-only: start gpuslice console with --allow-edit to allocate"
    );
    let a = post(addr, "/workloads/ml/deployment/x/release", &origin, "");
    assert_eq!(a.status, 403);
    // The GPU tab says so too, without forms (the API is down: the banner, no tab).
    let a = get(addr, "/workloads/ml/deployment/x");
    assert!(!a.body.contains("<form"), "{}", a.body);
}

#[test]
fn posts_must_be_small_forms_from_the_consoles_page() {
    let (addr, _dir) = start(true);
    let path = "/workloads/ml/deployment/x/allocate";
    let a = post(
        addr,
        path,
        &format!("\r\nContent-Type: {FORM}"),
        "memory=8Gi",
    );
    assert_eq!(a.status, 403);
    assert!(
        one_line(&a).contains("Origin (or Referer) must be http://"),
        "{}",
        a.body
    );
    let a = post(
        addr,
        path,
        &format!("\r\nOrigin: http://evil.example\r\nContent-Type: {FORM}"),
        "memory=8Gi",
    );
    assert_eq!(a.status, 403);
    let a = post(
        addr,
        path,
        &format!("\r\nOrigin: http://{addr}\r\nContent-Type: application/json"),
        "{}",
    );
    assert_eq!(a.status, 415);
    assert!(one_line(&a).contains("accepted application/x-www-form-urlencoded"));
    let a = post(
        addr,
        path,
        &format!("\r\nOrigin: http://{addr}"),
        "memory=8Gi",
    );
    assert_eq!(a.status, 415);
    // Over 64 KiB: declared, and chunked without a length.
    let big = format!("memory={}", "9".repeat(70 << 10));
    let a = post(
        addr,
        path,
        &format!("\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}"),
        &big,
    );
    assert_eq!(a.status, 413);
    assert!(one_line(&a).contains("over 64 KiB"));
    let chunk = format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
    let a = send(
        addr,
        &format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}\r\nTransfer-Encoding: chunked"),
        chunk.as_bytes(),
    );
    assert_eq!(a.status, 413, "{}", a.body);
    // An invalid name in an action's path: 400 before anything is read.
    let a = post(
        addr,
        "/workloads/ml/deployment/Bad_Name/allocate",
        &format!("\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}"),
        "memory=8Gi",
    );
    assert_eq!(a.status, 400);
    one_line(&a);
}

#[test]
fn actions_answer_with_kubectl_gpuslices_lines() {
    let (addr, _dir) = start(true);
    let form =
        format!("\r\nReferer: http://{addr}/workloads/ml/deployment/x\r\nContent-Type: {FORM}");
    let path = "/workloads/ml/deployment/x/allocate";
    // The request is checked by the plugin's own function before the cluster is asked.
    let a = post(addr, path, &form, "gpus=1&memory=lots&dry_run=1");
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.body
            .contains("<div id=\"result\" class=\"error\">--memory `lots`: "),
        "{}",
        a.body
    );
    assert_security_headers(&a);
    let a = post(addr, path, &form, "gpus=0&memory=8Gi");
    assert_eq!(a.status, 400);
    assert!(
        a.body.contains(
            "<div id=\"result\" class=\"error\">--gpus 0: accepted 1 to 128 GPUs per pod</div>"
        ),
        "{}",
        a.body
    );
    let a = post(addr, path, &form, "gpus=two&memory=8Gi");
    assert_eq!(a.status, 400);
    assert!(
        a.body
            .contains("--gpus `two`: accepted 1 to 128 GPUs per pod"),
        "{}",
        a.body
    );
    let a = post(addr, path, &form, "memory=8Gi&cores=300");
    assert_eq!(a.status, 400);
    assert!(
        a.body.contains("--cores `300` is not a whole percent"),
        "{}",
        a.body
    );
    // A valid request reaches the (closed) API server: a 502 naming what failed.
    let a = post(addr, path, &form, "gpus=1&memory=8Gi&cores=");
    assert_eq!(a.status, 502, "{}", a.body);
    assert!(
        a.body
            .contains("<div id=\"result\" class=\"error\">cannot "),
        "{}",
        a.body
    );
    let a = post(
        addr,
        "/workloads/ml/statefulset/db/release",
        &form,
        "dry_run=1",
    );
    assert_eq!(a.status, 502, "{}", a.body);
}

#[test]
fn connections_over_the_cap_wait_until_one_closes() {
    let (addr, _dir) = start_with(false, 2);
    // Two idle connections take both slots (each sends part of a request head, so the
    // server has accepted it and waits for the rest).
    let mut idle: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /static/console.css HTTP/1.1\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A third is queued by the kernel, not served: no answer while both are open.
    let mut third = TcpStream::connect(addr).unwrap();
    third
        .write_all(
            format!(
                "GET /static/console.css HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut first = [0u8; 1];
    let waited = third.read(&mut first);
    assert!(
        waited.is_err(),
        "answered at the cap: {waited:?} {:?}",
        first
    );
    // One closes: the third is accepted and answered.
    drop(idle.remove(0));
    third
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut raw = Vec::new();
    third.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

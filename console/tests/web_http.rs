//! The web console's HTTP hygiene, over real sockets: a console started in-process against
//! a kubeconfig whose API server is a closed port (the pages then show the `api` banner
//! instead of hanging), asked with raw HTTP/1.1 requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use gpuslice_console::web::{Limits, Options, Server, CSP};

/// A console on a free loopback port; the temp dir holds its kubeconfig.
fn start(allow_edit: bool) -> (SocketAddr, tempfile::TempDir) {
    start_with(allow_edit, 256)
}

/// [`start`] serving at most `max_connections` connections at once.
fn start_with(allow_edit: bool, max_connections: u32) -> (SocketAddr, tempfile::TempDir) {
    start_console(Console {
        allow_edit,
        max_connections,
        ..Console::default()
    })
}

/// How a test's console runs.
struct Console {
    allow_edit: bool,
    max_connections: u32,
    /// The kubeconfig's API server.
    api: String,
    limits: Limits,
    /// `--public-url` values.
    public_url: Vec<String>,
}

impl Default for Console {
    fn default() -> Console {
        Console {
            allow_edit: false,
            max_connections: 256,
            // Port 1 on loopback: nothing listens, connections are refused at once.
            api: "https://127.0.0.1:1".into(),
            limits: Limits::default(),
            public_url: Vec::new(),
        }
    }
}

fn start_console(c: Console) -> (SocketAddr, tempfile::TempDir) {
    let (addr, dir, _) = start_console_thread(c);
    (addr, dir)
}

/// The options of a console of `c` whose kubeconfig is written into `dir`.
fn options(c: &Console, dir: &std::path::Path) -> Options {
    let kubeconfig = dir.join("kubeconfig");
    let api = &c.api;
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
clusters: [{{name: c, cluster: {{server: '{api}', insecure-skip-tls-verify: true}}}}]\n\
users: [{{name: tester, user: {{token: t}}}}]\n\
contexts: [{{name: test, context: {{cluster: c, user: tester, namespace: ml}}}}]\n"
        ),
    )
    .unwrap();
    Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        kubeconfig: Some(kubeconfig),
        context: None,
        prometheus: None,
        allow_edit: c.allow_edit,
        hami_compat: false,
        max_connections: c.max_connections,
        public_url: c.public_url.clone(),
    }
}

/// [`start_console`], also returning the id of the thread serving it.
fn start_console_thread(c: Console) -> (SocketAddr, tempfile::TempDir, libc::pid_t) {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&c, dir.path());
    let limits = c.limits;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = Server::bind(&opts).await.unwrap().with_limits(limits);
            // SAFETY: gettid only returns the calling thread's id.
            let tid = unsafe { libc::gettid() };
            tx.send((server.local_addr(), tid)).unwrap();
            server.run(std::future::pending()).await.unwrap();
        });
    });
    let (addr, tid) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    (addr, dir, tid)
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
        "/budgets",
        "/budgets?namespace=ml",
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
            "<a href=\"/budgets\">Budgets</a>",
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
    // An IP literal other than loopback's, with the console's port.
    let a = send(
        addr,
        &format!("GET / HTTP/1.1\r\nHost: 10.255.255.1:{}", addr.port()),
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
fn a_port_forward_names_the_loopback_console_by_its_local_port() {
    // `kubectl port-forward pod/console 9000:8080`: the browser's Host and Origin name the
    // forwarded port, not the one the console listens on.
    let (addr, _dir) = start(true);
    let local = addr.port() ^ 1;
    for host in [format!("localhost:{local}"), format!("127.0.0.1:{local}")] {
        let a = send(addr, &format!("GET / HTTP/1.1\r\nHost: {host}"), b"");
        assert_eq!(a.status, 200, "{host}: {}", a.body);
        // Its form's POST passes the Host and Origin checks (then the closed API server).
        let body = "gpus=1&memory=8Gi&dry_run=1";
        let a = send(
            addr,
            &format!("POST /workloads/ml/deployment/x/allocate HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Type: {FORM}\r\nContent-Length: {}", body.len()),
            body.as_bytes(),
        );
        assert_eq!(a.status, 502, "{host}: {}", a.body);
    }
}

#[test]
fn a_public_url_names_the_console_behind_a_proxy() {
    let (addr, _dir) = start_console(Console {
        allow_edit: true,
        public_url: vec!["https://gpu.example.com".into()],
        ..Console::default()
    });
    // A proxy that keeps the original Host (oauth2-proxy's default, ingress-nginx).
    let a = send(addr, "GET / HTTP/1.1\r\nHost: gpu.example.com", b"");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_security_headers(&a);
    let a = send(addr, "GET / HTTP/1.1\r\nHost: evil.example", b"");
    assert_eq!(a.status, 421);
    one_line(&a);
    let path = "/workloads/ml/deployment/x/allocate";
    let body = "gpus=1&memory=8Gi&dry_run=1";
    // The form's POST from the public page, with the Host kept and with it rewritten to the
    // listen address: past the Host and Origin checks to the (closed) API server.
    for host in ["gpu.example.com".to_string(), addr.to_string()] {
        let a = send(
            addr,
            &format!("POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: https://gpu.example.com\r\nContent-Type: {FORM}\r\nContent-Length: {}", body.len()),
            body.as_bytes(),
        );
        assert_eq!(a.status, 502, "{host}: {}", a.body);
        assert!(
            a.body
                .contains("<div id=\"result\" class=\"error\">cannot "),
            "{}",
            a.body
        );
    }
    // Another origin is still refused.
    let a = send(
        addr,
        &format!("POST {path} HTTP/1.1\r\nHost: gpu.example.com\r\nOrigin: https://evil.example\r\nContent-Type: {FORM}\r\nContent-Length: {}", body.len()),
        body.as_bytes(),
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(
        one_line(&a).contains("must be http://gpu.example.com or https://gpu.example.com"),
        "{}",
        a.body
    );
}

#[test]
fn a_public_url_with_a_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(
        &Console {
            public_url: vec![
                "https://gpu.example.com".into(),
                "https://gpu.example.com/console".into(),
            ],
            ..Console::default()
        },
        dir.path(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt.block_on(Server::bind(&opts)).unwrap_err().to_string();
    assert_eq!(
        e,
        "--public-url `https://gpu.example.com/console`: it has a path or query; accepted: http:// or https://, a host name or IP literal and an optional port, no path but /, e.g. https://gpu.example.com"
    );
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
    // A memory within one 1Mi step of 2^64 has no rounded size: refused naming it, never
    // wrapped to a 0-byte slice.
    let a = post(
        addr,
        path,
        &form,
        "gpus=1&memory=18446744073709551615&dry_run=1",
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.body.contains(
            "<div id=\"result\" class=\"error\">--memory `18446744073709551615`: above 17592186044415Mi"
        ) && a.body.contains("accepted: a whole quantity"),
        "{}",
        a.body
    );
    let a = post(addr, path, &form, "gpus=0&memory=8Gi");
    assert_eq!(a.status, 400);
    assert!(
        a.body.contains(
            "<div id=\"result\" class=\"error\">--gpus 0: accepted 1 to 16 GPUs per pod</div>"
        ),
        "{}",
        a.body
    );
    // Above the contract's maximum, refused before the cluster is asked.
    let a = post(addr, path, &form, "gpus=17&memory=8Gi&dry_run=1");
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.body.contains(
            "<div id=\"result\" class=\"error\">--gpus 17: accepted 1 to 16 GPUs per pod</div>"
        ),
        "{}",
        a.body
    );
    let a = post(addr, path, &form, "gpus=two&memory=8Gi");
    assert_eq!(a.status, 400);
    assert!(
        a.body
            .contains("--gpus `two`: accepted 1 to 16 GPUs per pod"),
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

/// Raises this process's open-file limit to its hard limit: a slow-client test holds 256
/// client sockets and the console's 256 in one process, beside the other tests' consoles.
fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, a valid local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    if l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: setrlimit reads the struct it is given, a valid local.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) }, 0);
    }
}

/// A connection to `addr` (IPv4) whose client takes little unread data: a small receive
/// buffer and small segments, so the console's writes to it stall after some KiB, as they
/// would to a client that stops reading over a real network (loopback's 64 KiB segments
/// would let the kernel buffer megabytes first).
fn small_window_connection(addr: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else {
        panic!("{addr} is not IPv4")
    };
    let int = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; every pointer is to a
    // valid local of the size passed; the descriptor moves into the TcpStream once connected.
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

/// Waits until thread `tid` of this process (a console) has slept through ten looks 20 ms
/// apart: it has done all its clients asked for now (on a busy machine that takes a while).
fn wait_until_idle(tid: libc::pid_t) {
    let t0 = std::time::Instant::now();
    let mut asleep = 0;
    while asleep < 10 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the console never went idle"
        );
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // After `pid (comm) `: the state, S while it waits in epoll.
        let state = stat.rsplit_once(") ").unwrap().1.chars().next();
        asleep = if state == Some('S') { asleep + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the console at `server` has closed its end of `client`'s connection: the
/// kernel's table of IPv4 sockets shows the console's socket leave `ESTABLISHED` (a FIN is
/// queued even while the client's window is shut).
fn wait_until_closed_by(server: SocketAddr, client: &TcpStream) {
    let hex = |a: SocketAddr| {
        let SocketAddr::V4(v4) = a else {
            panic!("{a} is not IPv4")
        };
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(v4.ip().octets()),
            v4.port()
        )
    };
    let (local, remote) = (hex(server), hex(client.local_addr().unwrap()));
    let t0 = std::time::Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let state = table.lines().skip(1).find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(2) == Some(&remote.as_str()))
                .then(|| f.get(3).copied().unwrap_or_default().to_string())
        });
        // 01 is ESTABLISHED; a socket gone from the table is closed too.
        if state.as_deref() != Some("01") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the console never closed the connection from {remote}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes received on `s` and not read yet.
fn unread(s: &TcpStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, a valid local, about a descriptor `s` owns.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    usize::try_from(n).unwrap_or(0)
}

/// How many slow clients the tests below hold open: the default `--max-connections`.
const SLOW_CLIENTS: usize = 256;

/// Asks `addr` for the stylesheet on a fresh connection; `Err` when no whole answer came
/// within `within`.
fn answered_within(addr: SocketAddr, within: Duration) -> Result<Duration, String> {
    let t0 = std::time::Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(within)).unwrap();
    s.write_all(
        format!("GET /static/console.css HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw);
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&raw);
    match read {
        Ok(_) if text.starts_with("HTTP/1.1 200") && took <= within => Ok(took),
        other => Err(format!(
            "no answer within {within:?} (after {took:?}: {other:?}, {} bytes: {:?})",
            raw.len(),
            text.lines().next()
        )),
    }
}

/// Reads what `s` has until it closes or `within` passes; `Err` when it was still open.
fn read_until_closed(s: &mut TcpStream, within: Duration) -> Result<String, String> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => Ok(String::from_utf8_lossy(&raw).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            Ok(String::from_utf8_lossy(&raw).into_owned())
        }
        Err(e) => Err(format!(
            "still open after {within:?} ({e}), {} bytes",
            raw.len()
        )),
    }
}

#[test]
fn at_the_cap_a_new_connection_takes_the_slot_of_the_one_waiting_longest() {
    let (addr, _dir, console) = start_console_thread(Console {
        max_connections: 2,
        ..Console::default()
    });
    // Two idle connections take both slots (each sends part of a request head, so the
    // server has accepted it and waits for the rest), the first one earlier: the next
    // connects once the console has taken the one before and gone idle waiting on it.
    let mut idle: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /static/console.css HTTP/1.1\r\n")
                .unwrap();
            wait_until_idle(console);
            s
        })
        .collect();
    // A third is answered at once: the first idle one is closed for it.
    let took = answered_within(addr, Duration::from_secs(1));
    assert!(took.is_ok(), "at the cap: {took:?}");
    let first = read_until_closed(&mut idle[0], Duration::from_secs(1));
    assert_eq!(first, Ok(String::new()));
    // The second keeps its slot.
    let second = read_until_closed(&mut idle[1], Duration::from_millis(300));
    assert!(second.is_err(), "{second:?}");
}

#[test]
fn at_the_cap_with_every_connection_served_a_new_one_waits() {
    // An API server that takes connections into its backlog and never answers: the
    // console's pages wait on it, so its connections are busy serving, not waiting on
    // their clients.
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr, _dir, console) = start_console_thread(Console {
        max_connections: 2,
        api: format!("https://{}", api.local_addr().unwrap()),
        ..Console::default()
    });
    let ask = |path: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        s
    };
    let mut busy = vec![ask("/"), ask("/pods")];
    // Both taken and waiting on the API server.
    wait_until_idle(console);
    // A third is not answered while both are served, and neither is shed for it.
    let mut third = ask("/static/console.css");
    let waited = read_until_closed(&mut third, Duration::from_millis(1500));
    assert!(waited.is_err(), "answered at the cap: {waited:?}");
    // The API server goes away: the pages are answered (with its banner), the slots free,
    // the third is answered.
    drop(api);
    for s in &mut busy {
        let page = read_until_closed(s, Duration::from_secs(30)).unwrap();
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    }
    let css = read_until_closed(&mut third, Duration::from_secs(30)).unwrap();
    assert!(css.starts_with("HTTP/1.1 200"), "{css}");
}

#[test]
fn a_form_body_that_does_not_arrive_in_time_is_refused() {
    let body = Duration::from_millis(300);
    let (addr, _dir) = start_console(Console {
        allow_edit: true,
        limits: Limits {
            body,
            ..Limits::default()
        },
        ..Console::default()
    });
    let mut s = TcpStream::connect(addr).unwrap();
    // A declared body of 100 bytes; 9 come.
    s.write_all(format!("POST /workloads/ml/deployment/x/allocate HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}\r\nContent-Length: 100\r\n\r\nmemory=8G").as_bytes()).unwrap();
    let t0 = std::time::Instant::now();
    let answer = read_until_closed(&mut s, Duration::from_secs(5)).unwrap();
    assert!(t0.elapsed() >= body, "{:?}", t0.elapsed());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with("\r\n\r\nthe form did not arrive within 0.3 s: nothing done\n"),
        "{answer}"
    );
}

#[test]
fn an_answer_the_client_does_not_read_closes_its_connection() {
    let (addr, _dir) = start_console(Console {
        limits: Limits {
            write: Duration::from_millis(300),
            requests_per_connection: 1000,
            ..Limits::default()
        },
        ..Console::default()
    });
    let one = format!("GET /static/console.css HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut s = small_window_connection(addr);
    s.write_all(one.repeat(128).as_bytes()).unwrap();
    // The answers fill the window; the console's write stalls past its limit and it closes.
    wait_until_closed_by(addr, &s);
    let answers = read_until_closed(&mut s, Duration::from_secs(5)).unwrap();
    let n = answers.matches("HTTP/1.1 200").count();
    assert!((1..128).contains(&n), "{n} answers");
}

#[test]
fn a_connection_is_answered_at_most_its_cap_of_requests() {
    let (addr, _dir) = start_console(Console {
        limits: Limits {
            requests_per_connection: 3,
            ..Limits::default()
        },
        ..Console::default()
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let one = format!("GET /static/console.css HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(one.repeat(5).as_bytes()).unwrap();
    let answers = read_until_closed(&mut s, Duration::from_secs(10)).unwrap();
    let heads: Vec<&str> = answers.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(heads.len(), 3, "{answers}");
    assert!(heads.iter().all(|h| h.starts_with("200")));
    let close = |h: &str| h.to_ascii_lowercase().contains("\r\nconnection: close\r\n");
    assert!(!close(heads[1]) && close(heads[2]), "{answers}");
}

#[test]
fn clients_that_never_read_their_pipelined_answers_cannot_take_every_slot() {
    raise_fd_limit();
    let (addr, _dir, console) = start_console_thread(Console::default());
    let one = format!("GET /static/console.css HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    // Each pipelines far more answers than its window takes, and never reads one.
    let pipelined = one.repeat(128);
    let slow: Vec<TcpStream> = (0..SLOW_CLIENTS)
        .map(|_| {
            let mut s = small_window_connection(addr);
            s.write_all(pipelined.as_bytes()).unwrap();
            s
        })
        .collect();
    // The console answers until every window and its own buffers are full, then its
    // writes stall and it waits.
    wait_until_idle(console);
    assert!(slow.iter().all(|s| unread(s) > 0), "a client got no answer");
    let took = answered_within(addr, Duration::from_secs(1));
    eprintln!("with {SLOW_CLIENTS} never-reading clients: {took:?}");
    assert!(
        took.is_ok(),
        "{SLOW_CLIENTS} never-reading clients: {took:?}"
    );
    drop(slow);
}

#[test]
fn posts_whose_body_never_comes_cannot_take_every_slot() {
    raise_fd_limit();
    let (addr, _dir, console) = start_console_thread(Console {
        allow_edit: true,
        ..Console::default()
    });
    // Each declares a form body and sends none of it.
    let head = format!(
        "POST /workloads/ml/deployment/x/allocate HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: {FORM}\r\nContent-Length: 100\r\n\r\n"
    );
    let slow: Vec<TcpStream> = (0..SLOW_CLIENTS)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    wait_until_idle(console);
    let took = answered_within(addr, Duration::from_secs(1));
    eprintln!("with {SLOW_CLIENTS} bodiless POSTs: {took:?}");
    assert!(took.is_ok(), "{SLOW_CLIENTS} bodiless POSTs: {took:?}");
    drop(slow);
}

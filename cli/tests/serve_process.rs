//! The exporter's availability, against the `gpuslice serve` process: at the file descriptor
//! limit, beside a pipelining client that never reads, under endless request headers and
//! beyond its connection bound it keeps serving, within a bounded memory. They need the
//! process itself (its own descriptor limit and peak RSS); the exporter's HTTP answers are
//! tested in-process with the agent (agent/tests/serve_http.rs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A `gpuslice serve` process on a free port of the loopback, for the availability tests:
/// a config with only a state dir (no GPU: NVML fails to open and is counted),
/// optionally started with `RLIMIT_NOFILE` lowered to `nofile`. Killed when dropped.
pub struct Exporter {
    pub child: std::process::Child,
    pub addr: std::net::SocketAddr,
    pub log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Exporter {
    pub fn start(nofile: Option<u64>) -> Exporter {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("state_dir = \"{}\"\n", dir.path().join("state").display()),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        cmd.arg("--config")
            .arg(&config)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("GPUSLICE_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(n) = nofile {
            // SAFETY: the closure runs in the forked child before exec and only makes one
            // setrlimit system call (async-signal-safe); it allocates nothing and takes no lock.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = rustix::process::Rlimit {
                        current: Some(n),
                        maximum: Some(n),
                    };
                    rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = cmd.spawn().expect("start gpuslice serve");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap());
        // Errors met at start (no NVML here) may come before the listening line.
        let mut early = String::new();
        let mut addr = None;
        for _ in 0..20 {
            let mut line = String::new();
            if lines.read_line(&mut line).unwrap() == 0 {
                break;
            }
            addr = line
                .trim()
                .strip_prefix("gpuslice serve: listening on http://")
                .and_then(|a| a.strip_suffix("/metrics"))
                .and_then(|a| a.parse().ok());
            early.push_str(&line);
            if addr.is_some() {
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("gpuslice serve did not start: {early}"));
        let log = Arc::new(Mutex::new(early));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                if l.len() < 1 << 20 {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        Exporter {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// A `/proc/<pid>/status` figure in KiB (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// One `GET path` with HTTP/1.0 and a read timeout of `within`: the status code and
    /// body, or why there was none.
    pub fn get(&self, path: &str, within: Duration) -> Result<(u16, String), String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&self.addr, within)
            .map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(within)).unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
        let resp = String::from_utf8_lossy(&resp).into_owned();
        let (head, body) = resp
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no response head in {resp:?}"))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status in {head:?}"))?;
        Ok((status, body.to_string()))
    }

    /// Polls `/healthz` until it answers `200 ok` or `deadline` passes.
    pub fn healthy_within(&self, deadline: Duration) -> Result<(), String> {
        let end = Instant::now() + deadline;
        let mut last = String::new();
        while Instant::now() < end {
            match self.get("/healthz", Duration::from_secs(5)) {
                Ok((200, body)) if body == "ok\n" => return Ok(()),
                Ok(other) => last = format!("{other:?}"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!(
            "/healthz did not answer within {deadline:?}: {last}"
        ))
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
